// The live dashboard: polls /metrics (Prometheus text), keeps the last few minutes of samples
// and draws SVG line charts; model and server facts come from /v1/models, /health and /metrics.
// ?interval=MS sets the poll period (default 1000, at least 200).
import { parsePrometheus, total, label, buckets, bucketDelta, quantile } from '/webui/prometheus.js';
import { apiFetch, askForKey, describeError } from '/webui/api.js';

const params = new URLSearchParams(location.search);
const INTERVAL = Math.max(200, parseInt(params.get('interval') || '1000', 10) || 1000);
const KEEP = 300;         // samples kept per series
const WINDOW = 10;        // polls over which rates and histogram quantiles are taken
const SVG = 'http://www.w3.org/2000/svg';
const COLORS = ['#2f6fdf', '#e0582b', '#2a9d57', '#9b51e0', '#c8a000'];
const $ = (id) => document.getElementById(id);

const history = [];  // {t (s), parsed}
let paused = false;
let asked = false;

// Chart definitions: each series maps (now, before, dt) to a number or null.
const charts = [
  { id: 'requests', title: 'Requests', unit: '', series: [
    ['running', (n) => total(n.p, 'num_requests_running')],
    ['waiting', (n) => total(n.p, 'num_requests_waiting')]] },
  { id: 'kv', title: 'KV cache', unit: '%', max: 100, series: [
    ['usage', (n) => pct(total(n.p, 'kv_cache_usage_perc'))],
    ['fragmentation', (n) => pct(total(n.p, 'kv_cache_fragmentation_ratio'))]] },
  { id: 'prefix', title: 'Prefix-cache hit rate', unit: '%', max: 100, series: [
    ['window', (n, b) => ratio(n, b, 'prefix_cache_hits_total', 'prefix_cache_queries_total')],
    ['since start', (n) => {
      const q = total(n.p, 'prefix_cache_queries_total');
      return q > 0 ? 100 * total(n.p, 'prefix_cache_hits_total') / q : null;
    }]] },
  { id: 'tokens', title: 'Tokens/s', unit: '', series: [
    ['generated', (n, b) => rate(n, b, 'generation_tokens_total')],
    ['prompt', (n, b) => rate(n, b, 'prompt_tokens_total')]] },
  { id: 'ttft', title: 'Time to first token', unit: 'ms', series: [
    ['p50', (n, b) => hq(n, b, 'time_to_first_token_seconds', 0.5)],
    ['p90', (n, b) => hq(n, b, 'time_to_first_token_seconds', 0.9)],
    ['p99', (n, b) => hq(n, b, 'time_to_first_token_seconds', 0.99)]] },
  { id: 'itl', title: 'Inter-token latency', unit: 'ms', series: [
    ['p50', (n, b) => hq(n, b, 'inter_token_latency_seconds', 0.5)],
    ['p90', (n, b) => hq(n, b, 'inter_token_latency_seconds', 0.9)],
    ['p99', (n, b) => hq(n, b, 'inter_token_latency_seconds', 0.99)]] },
  { id: 'memory', title: 'Resident memory', unit: 'MiB', series: [
    ['RSS', (n) => { const v = total(n.p, 'resident_memory_bytes'); return v == null ? null : v / 1048576; }]] },
  { id: 'preempt', title: 'Preemptions and rejections per second', unit: '', series: [
    ['preempted', (n, b) => rate(n, b, 'num_preemptions_total')],
    ['rejected', (n, b) => rate(n, b, 'request_rejected_total')]] },
];

function pct(v) { return v == null ? null : 100 * v; }
function rate(n, b, name) {
  if (!b) return null;
  const a = total(n.p, name);
  const c = total(b.p, name);
  if (a == null || c == null || n.t <= b.t) return null;
  return Math.max(0, a - c) / (n.t - b.t);
}
function ratio(n, b, num, den) {
  if (!b) return null;
  const d = total(n.p, den) - total(b.p, den);
  return d > 0 ? 100 * (total(n.p, num) - total(b.p, num)) / d : null;
}
// Quantile in ms of the observations made during the window (null when there were none).
function hq(n, b, name, q) {
  const now = buckets(n.p, name);
  const v = quantile(b ? bucketDelta(now, buckets(b.p, name)) : now, q);
  return v == null ? null : 1000 * v;
}

function el(tag, attrs = {}, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmt(v) {
  if (v == null || !Number.isFinite(v)) return '–';
  const a = Math.abs(v);
  if (a >= 1000) return v.toFixed(0);
  if (a >= 10) return v.toFixed(1);
  return v.toFixed(2);
}

function buildCards() {
  const box = $('charts');
  for (const c of charts) {
    const card = document.createElement('figure');
    card.className = 'card';
    card.id = 'chart-' + c.id;
    const cap = document.createElement('figcaption');
    cap.textContent = c.title + (c.unit ? ` (${c.unit})` : '');
    const svg = el('svg', { viewBox: '0 0 480 180', role: 'img', 'aria-label': c.title });
    const legend = document.createElement('div');
    legend.className = 'legend';
    card.append(cap, svg, legend);
    box.appendChild(card);
    c.svg = svg;
    c.legend = legend;
    c.data = c.series.map(() => []);
  }
}

function draw(c) {
  const W = 480, H = 180, L = 46, R = 8, T = 8, B = 22;
  const svg = c.svg;
  svg.replaceChildren();
  const tNow = history.length ? history[history.length - 1].t : 0;
  const span = Math.max(30, Math.min(KEEP * INTERVAL / 1000, tNow - (history[0] ? history[0].t : tNow)));
  let ymax = c.max || 0;
  if (!c.max) for (const d of c.data) for (const [, v] of d) if (v != null && v > ymax) ymax = v;
  if (!(ymax > 0)) ymax = 1;
  ymax = niceCeil(ymax);
  const x = (t) => L + (W - L - R) * (1 - (tNow - t) / span);
  const y = (v) => T + (H - T - B) * (1 - v / ymax);
  for (let i = 0; i <= 4; i++) {
    const v = (ymax * i) / 4;
    svg.appendChild(el('line', { x1: L, x2: W - R, y1: y(v), y2: y(v), class: 'grid' }));
    svg.appendChild(el('text', { x: L - 4, y: y(v) + 4, 'text-anchor': 'end', class: 'tick' }, fmt(v)));
  }
  svg.appendChild(el('text', { x: L, y: H - 6, class: 'tick' }, `-${Math.round(span)} s`));
  svg.appendChild(el('text', { x: W - R, y: H - 6, 'text-anchor': 'end', class: 'tick' }, 'now'));
  let points = 0;
  c.data.forEach((d, si) => {
    // One polyline per run of consecutive known values.
    let run = [];
    const flush = () => {
      if (run.length === 1) svg.appendChild(el('circle', { cx: run[0][0], cy: run[0][1], r: 2, fill: COLORS[si] }));
      if (run.length > 1) svg.appendChild(el('polyline', { points: run.map((p) => p.join(',')).join(' '), stroke: COLORS[si], class: 'series' }));
      run = [];
    };
    for (const [t, v] of d) {
      if (tNow - t > span) continue;
      if (v == null) { flush(); continue; }
      run.push([x(t).toFixed(1), y(Math.min(v, ymax)).toFixed(1)]);
      points++;
    }
    flush();
  });
  svg.dataset.points = String(points);
  c.legend.replaceChildren();
  c.series.forEach(([name], si) => {
    const last = c.data[si].length ? c.data[si][c.data[si].length - 1][1] : null;
    const item = document.createElement('span');
    const swatch = document.createElement('i');
    swatch.style.background = COLORS[si];
    item.append(swatch, document.createTextNode(`${name}: ${fmt(last)}${c.unit && c.unit !== '%' ? ' ' + c.unit : c.unit}`));
    c.legend.appendChild(item);
  });
}

function niceCeil(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function infoRow(dl, name, value) {
  const dt = document.createElement('dt');
  dt.textContent = name;
  const dd = document.createElement('dd');
  dd.textContent = value;
  dl.append(dt, dd);
}

let models = null;
let health = '';

async function refreshInfo() {
  try {
    const h = await fetch('/health', { cache: 'no-store' });
    health = h.ok ? 'serving' : (await describeError(h));
    const r = await apiFetch('/v1/models');
    if (r.ok) models = await r.json();
  } catch (_) {
    health = 'unreachable';
  }
}

function renderInfo(p) {
  const dl = document.createElement('dl');
  const m = models && models.data && models.data[0];
  infoRow(dl, 'Model', m ? m.id : (label(p, 'num_requests_running', 'model_name') || '?'));
  if (m && m.max_model_len) infoRow(dl, 'Context', `${m.max_model_len} tokens`);
  infoRow(dl, 'Server', health);
  const load = total(p, 'model_load_time_seconds');
  if (load != null) infoRow(dl, 'Model load', `${load.toFixed(2)} s`);
  const blocks = total(p, 'kv_cache_blocks_total');
  if (blocks != null) infoRow(dl, 'KV blocks', `${total(p, 'kv_cache_blocks_used')} used / ${total(p, 'kv_cache_blocks_free')} free / ${blocks} total`);
  const ok = total(p, 'request_success_total');
  if (ok != null) infoRow(dl, 'Requests finished', String(ok));
  infoRow(dl, 'Tokens', `${total(p, 'prompt_tokens_total') ?? 0} prompt, ${total(p, 'generation_tokens_total') ?? 0} generated`);
  infoRow(dl, 'Metrics prefix', p.prefix || '(none)');
  $('info').replaceChildren(dl);
}

async function poll() {
  if (paused) return;
  let res;
  try {
    res = await apiFetch('/metrics');
  } catch (_) {
    $('status').textContent = 'server unreachable';
    return;
  }
  if (res.status === 401) {
    $('status').textContent = 'needs an API key';
    if (!asked) {
      asked = true;
      if (await askForKey('This server needs an API key for /metrics.')) asked = false;
    }
    return;
  }
  if (!res.ok) {
    $('status').textContent = await describeError(res);
    return;
  }
  const p = parsePrometheus(await res.text());
  const now = { t: performance.now() / 1000, p };
  history.push(now);
  if (history.length > KEEP) history.shift();
  const before = history.length > 1 ? history[Math.max(0, history.length - 1 - WINDOW)] : null;
  for (const c of charts) {
    c.series.forEach(([, f], si) => {
      const v = f(now, before);
      c.data[si].push([now.t, v == null || !Number.isFinite(v) ? null : v]);
      if (c.data[si].length > KEEP) c.data[si].shift();
    });
    draw(c);
  }
  if (history.length % 5 === 1) await refreshInfo();
  renderInfo(p);
  $('status').textContent = `updated ${new Date().toLocaleTimeString()} · every ${INTERVAL} ms`;
  document.body.dataset.polls = String(history.length);
}

buildCards();
$('pause').onclick = () => { paused = !paused; $('pause').textContent = paused ? 'Resume' : 'Pause'; };
$('key-button').onclick = async () => { await askForKey('Key sent as "Authorization: Bearer …" (kept in this browser).'); asked = false; };
poll();
setInterval(poll, INTERVAL);
