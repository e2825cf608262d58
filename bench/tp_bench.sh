#!/bin/bash
# Tensor parallelism on one host: `deepharness bench` at --tp-size 1 with T threads against
# --tp-size 2 (mpirun -np 2) with T/2 threads each, on the same model, back to back; rank 0 also
# prints the time it spent in collectives. Figures: bench/README.md, "Tensor parallelism".
# Usage: bench/tp_bench.sh [BIN] [MODEL_DIR] [THREADS] [PROMPT] [GEN]
set -eu
BIN=${1:-build/deepharness}
MODEL=${2:-models/shakespeare-v3}
THREADS=${3:-2}
PROMPT=${4:-64}
GEN=${5:-32}
ROOT=()
[ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
COMMON=(--model-path "$MODEL" -p "$PROMPT" -n "$GEN" -r 3 --membw-mib 0 --no-peak -q)
echo "== tp 1, $THREADS threads"
nice -n 10 "$BIN" bench "${COMMON[@]}" --threads "$THREADS"
echo "== tp 2 (mpirun -np 2), $((THREADS / 2)) thread(s) per rank"
nice -n 10 mpirun --oversubscribe "${ROOT[@]}" --bind-to none -np 2 \
  "$BIN" bench "${COMMON[@]}" --threads $((THREADS / 2)) --tp-size 2
