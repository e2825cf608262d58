#!/bin/bash
# Tensor parallelism on one host: `deepharness bench` at --tp-size 1 with T threads against
# --tp-size 2 (mpirun -np 2) with T/2 threads each, on each model given, back to back; rank 0
# also prints the time it spent in collectives. Then a traced tp 2 run per model gives the
# all-reduce latency per call and its share of a decode and a prefill step
# (bench/tp_trace_share.py). The load average is printed before every run (others may share the
# machine). Figures: bench/README.md, "Tensor parallelism".
# Usage: bench/tp_bench.sh [BIN] [MODEL_DIRS] [THREADS] [PROMPT] [GEN]
#   MODEL_DIRS: one directory or several separated by spaces (one argument, quoted).
set -eu
BIN=${1:-build/deepharness}
MODELS=${2:-models/shakespeare-v3}
THREADS=${3:-2}
PROMPT=${4:-64}
GEN=${5:-32}
ROOT=()
[ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
HERE=$(dirname "$0")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
load() { echo "   [$(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)]"; }
grep -m1 "model name" /proc/cpuinfo
for MODEL in $MODELS; do
  COMMON=(--model-path "$MODEL" -p "$PROMPT" -n "$GEN" -r 3 --membw-mib 0 --no-peak -q)
  echo "=== $MODEL"
  echo "== tp 1, $THREADS threads"; load
  nice -n 10 "$BIN" bench "${COMMON[@]}" --threads "$THREADS"
  echo "== tp 2 (mpirun -np 2), $((THREADS / 2)) thread(s) per rank"; load
  nice -n 10 mpirun --oversubscribe "${ROOT[@]}" --bind-to none -np 2 \
    "$BIN" bench "${COMMON[@]}" --threads $((THREADS / 2)) --tp-size 2
  echo "== tp 2 traced (one repeat, no warm-up): the all-reduce per call and per step"; load
  nice -n 10 mpirun --oversubscribe "${ROOT[@]}" --bind-to none -np 2 \
    "$BIN" bench --model-path "$MODEL" -p "$PROMPT" -n "$GEN" -r 1 --warmup 0 --membw-mib 0 \
    --no-peak -q --threads $((THREADS / 2)) --tp-size 2 --trace-out "$TMP/trace.json" >/dev/null
  python3 "$HERE/tp_trace_share.py" "$TMP/trace.json"
  load
done
