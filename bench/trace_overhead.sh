#!/bin/bash
# Tracing off vs on (issue 19): `deepharness bench` of one model alternately without and with
# --trace-out (a TracingBackend timing every op, a span per layer and block), ROUNDS times, so
# both see the same machine load; then the dump write rate of `generate --dump-tensors` (every
# tap of every step) against the same run without dumping.
# Usage: bench/trace_overhead.sh [DEEPHARNESS] [MODEL_DIR] [ROUNDS]
#   SKIP_TRACE=1: dumps only; SKIP_DUMP=1: tracing only
#   MODEL_DIR: e.g. `deepharness make-model --preset qwen2-1.5b --output bench-models/qwen2-1.5b`
set -eu
BIN=${1:-build/deepharness}
MODEL=${2:-bench-models/qwen2-1.5b}
ROUNDS=${3:-2}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
  [ "${SKIP_TRACE:-0}" = 1 ] && break
  for mode in off on; do
    extra=()
    [ "$mode" = on ] && extra=(--trace-out "$TMP/t.json")
    "$BIN" bench --model-path "$MODEL" -p 128 -n 16 -r 2 --warmup 1 --threads 2 --no-peak \
      --membw-mib 0 --json -q "${extra[@]}" >"$TMP/$mode.json"
    python3 - "$TMP/$mode.json" "$mode" "$round" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["results"]
print(f"round {sys.argv[3]} tracing {sys.argv[2]:3}: " + ", ".join(
    f"{r['test']} {r['tokens_per_s_mean']:.2f} tok/s" for r in rows))
PY
  done
done
[ -f "$TMP/t.json" ] && ls -l "$TMP/t.json" | awk '{print "trace file of the last run:", $5, "bytes"}'

[ "${SKIP_DUMP:-0}" = 1 ] && exit 0

# Dump write rate: the same generate with and without --dump-tensors, alternately, ROUNDS
# times each; the rate is the dump's bytes over the difference of the fastest runs.
ids=$(seq -s, 1 64)
gen=(generate -q --threads 2 --model-path "$MODEL" --token-ids "$ids" --max-tokens 4 --ignore-eos)
best_plain=1e9
best_dump=1e9
for round in $(seq 1 "$ROUNDS"); do
  t0=$(date +%s.%N)
  "$BIN" "${gen[@]}" >/dev/null
  t1=$(date +%s.%N)
  rm -rf "$TMP/dump"
  "$BIN" "${gen[@]}" --dump-tensors "$TMP/dump" >/dev/null
  t2=$(date +%s.%N)
  best_plain=$(python3 -c "print(min($best_plain, $t1 - $t0))")
  best_dump=$(python3 -c "print(min($best_dump, $t2 - $t1))")
done
mib=$(du -sm "$TMP/dump" | cut -f1)
files=$(($(wc -l <"$TMP/dump/manifest.tsv") - 1))
python3 -c "
plain, dumped, mib = $best_plain, $best_dump, $mib
print(f'generate (best of $ROUNDS): {plain:.2f} s plain, {dumped:.2f} s writing $files taps, {mib} MiB: '
      f'{mib / (dumped - plain):.0f} MiB/s for the dump' if dumped > plain else
      f'generate (best of $ROUNDS): {plain:.2f} s plain, {dumped:.2f} s dumping {mib} MiB: within noise')"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
