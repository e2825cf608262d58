// Prometheus text exposition format (version 0.0.4) -> samples, and the helpers the dashboard
// needs: sums over label sets and quantiles from histogram buckets (as histogram_quantile does).

// Returns { prefix, samples: Map(name -> [{labels, value}]) }. The prefix ("deepharness:",
// "vllm:") is found from the num_requests_running gauge; names in `samples` keep it stripped.
export function parsePrometheus(text) {
  const raw = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[3]) {
      const re = /([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
      for (let l; (l = re.exec(m[3])) !== null;) labels[l[1]] = l[2].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
    }
    const v = m[4] === '+Inf' ? Infinity : m[4] === '-Inf' ? -Infinity : parseFloat(m[4]);
    raw.push([m[1], labels, v]);
  }
  const running = raw.find(([n]) => n.endsWith('num_requests_running'));
  const prefix = running ? running[0].slice(0, running[0].length - 'num_requests_running'.length) : '';
  const samples = new Map();
  for (const [name, labels, value] of raw) {
    const key = name.startsWith(prefix) ? name.slice(prefix.length) : name;
    if (!samples.has(key)) samples.set(key, []);
    samples.get(key).push({ labels, value });
  }
  return { prefix, samples };
}

// Sum of every sample of `name` (null when absent).
export function total(parsed, name) {
  const list = parsed.samples.get(name);
  if (!list) return null;
  return list.reduce((a, s) => a + s.value, 0);
}

// A label of the first sample of `name`.
export function label(parsed, name, key) {
  const list = parsed.samples.get(name);
  return list && list.length ? list[0].labels[key] : undefined;
}

// Cumulative buckets of histogram `name` (summed over label sets): [{le, count}] by le.
export function buckets(parsed, name) {
  const list = parsed.samples.get(name + '_bucket') || [];
  const by = new Map();
  for (const s of list) {
    const le = s.labels.le === '+Inf' ? Infinity : parseFloat(s.labels.le);
    by.set(le, (by.get(le) || 0) + s.value);
  }
  return [...by.entries()].sort((a, b) => a[0] - b[0]).map(([le, count]) => ({ le, count }));
}

// Bucket counts of `now` minus `before` (same bucket bounds), for a quantile over a window.
export function bucketDelta(now, before) {
  if (!before || before.length !== now.length) return now;
  return now.map((b, i) => ({ le: b.le, count: Math.max(0, b.count - before[i].count) }));
}

// The q-quantile of cumulative buckets, interpolating linearly inside the bucket (Prometheus'
// histogram_quantile); null without observations. A quantile in the +Inf bucket is reported as
// the highest finite bound.
export function quantile(bs, q) {
  if (!bs.length) return null;
  const count = bs[bs.length - 1].count;
  if (!(count > 0)) return null;
  const rank = q * count;
  let prevLe = 0;
  let prevCount = 0;
  for (const b of bs) {
    if (b.count >= rank) {
      if (b.le === Infinity) return prevLe;
      const inBucket = b.count - prevCount;
      const frac = inBucket > 0 ? (rank - prevCount) / inBucket : 1;
      return prevLe + (b.le - prevLe) * frac;
    }
    prevLe = b.le;
    prevCount = b.count;
  }
  return prevLe;
}
