#!/bin/bash
# Tracing off vs on (issue 19): `deepharness bench` of one model alternately without and with
# --trace-out (a TracingBackend timing every op, a span per layer and block), ROUNDS times, so
# both see the same machine load; then the dump write rate of `generate --dump-tensors` (every
# tap of every step) against the same run without dumping.
# Usage: bench/trace_overhead.sh [DEEPHARNESS] [MODEL_DIR] [ROUNDS]
#   MODEL_DIR: e.g. `deepharness make-model --preset qwen2-1.5b --output bench-models/qwen2-1.5b`
set -eu
BIN=${1:-build/deepharness}
MODEL=${2:-bench-models/qwen2-1.5b}
ROUNDS=${3:-2}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
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
ls -l "$TMP/t.json" | awk '{print "trace file of the last run:", $5, "bytes"}'

# Dump write rate: the same generate with and without --dump-tensors.
ids=$(seq -s, 1 64)
t0=$(date +%s.%N)
"$BIN" generate -q --threads 2 --model-path "$MODEL" --token-ids "$ids" --max-tokens 4 --ignore-eos >/dev/null
t1=$(date +%s.%N)
"$BIN" generate --threads 2 --model-path "$MODEL" --token-ids "$ids" --max-tokens 4 --ignore-eos \
  --dump-tensors "$TMP/dump" 2>"$TMP/dump.log" >/dev/null
t2=$(date +%s.%N)
grep '^dump:' "$TMP/dump.log"
mib=$(du -sm "$TMP/dump" | cut -f1)
python3 -c "
plain, dumped, mib = $t1 - $t0, $t2 - $t1, $mib
print(f'generate: {plain:.2f} s plain, {dumped:.2f} s dumping {mib} MiB on disk: '
      f'{mib / max(dumped - plain, 1e-9):.0f} MiB/s for the dump itself')"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
