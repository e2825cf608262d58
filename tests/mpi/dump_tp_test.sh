#!/bin/bash
# Tensor dumps and traces under tensor parallelism (ctest dump_tp_np2): the taps of
# `generate --tp-size 2` (rank 0 writes them) match those of one process within f32 rounding of
# the all-reduce, the projections a rank holds only a slice of are absent (listed, not
# compared), and each rank writes its own trace with the all-reduce spans.
# Usage: dump_tp_test.sh DEEPHARNESS MODEL_DIR. Exit 77 (skip) without mpirun.
set -u
BIN=$1
MODEL=$2
command -v mpirun >/dev/null || { echo "skip: mpirun not found (openmpi-bin)"; exit 77; }
[ -f "$MODEL/config.json" ] || { echo "skip: no model at $MODEL"; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ARGS=(generate -q --threads 1 --model-path "$MODEL" --token-ids 0,17,42,99,7 --max-tokens 3
      --ignore-eos --no-compile-cache)

"$BIN" "${ARGS[@]}" --dump-tensors "$TMP/tp1" >"$TMP/tp1.out" || fail "tp 1 run"
mpirun --oversubscribe --allow-run-as-root -np 2 "$BIN" "${ARGS[@]}" --tp-size 2 \
  --dump-tensors "$TMP/tp2" --trace-out "$TMP/t.json" >"$TMP/tp2.out" 2>&1 ||
  { cat "$TMP/tp2.out"; fail "tp 2 run"; }

"$BIN" diff-dumps "$TMP/tp1" "$TMP/tp2" --rtol 1e-4 --atol 1e-5 >"$TMP/diff.out"
rc=$?
cat "$TMP/diff.out" | tail -5
[ $rc -eq 0 ] || fail "diff-dumps tp1 tp2 exited $rc"
grep -q "only in A: s0.model.layers.0.self_attn.o_proj" "$TMP/diff.out" ||
  fail "o_proj (a column slice under tp 2) should be in the tp 1 dump only"
grep -q "^   0  model.layers.1.mlp  " "$TMP/diff.out" || fail "the MoE output was not compared"
for f in "$TMP/t.json" "$TMP/t.rank1.json"; do
  [ -f "$f" ] || fail "no trace $f"
  grep -q '"name": "all_reduce"' "$f" || fail "no all_reduce span in $f"
done
echo "PASS"
