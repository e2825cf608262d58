#!/usr/bin/env bash
# The `make run` demo. With the trained tiny Shakespeare model (models/shakespeare-v3) it generates
# text from "ROMEO:"; otherwise it writes a random tiny-llama checkpoint and decodes token ids from
# it (random weights: the ids are meaningless, the point is that the whole pipeline runs).
# Usage: scripts/run_demo.sh [BUILD_DIR]   (default: build)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
BIN="$BUILD/deepharness"
if [[ ! -x "$BIN" ]]; then
  echo "run_demo: $BIN not found; build first (make build)" >&2
  exit 2
fi

MODEL="$ROOT/models/shakespeare-v3"
has_command() { "$BIN" "$1" --help >/dev/null 2>&1; }

if [[ -f "$MODEL/config.json" ]] && has_command run; then
  echo "== deepharness run: trained tiny DeepSeek-V3-style Shakespeare model (models/shakespeare-v3)"
  echo "== prompt: \"ROMEO:\""
  if "$BIN" run --model-path "$MODEL" --prompt "ROMEO:" --max-tokens 100 --seed 42; then
    exit 0
  fi
  echo "== note: 'deepharness run' failed on $MODEL; showing the random-model demo instead"
elif [[ -f "$MODEL/config.json" ]]; then
  echo "== note: $MODEL exists but this build has no 'run' command; showing the random-model demo"
fi

TINY="$BUILD/tiny-llama"
echo "== RANDOM MODEL DEMO: tiny-llama with random weights (vocab 512, hidden 64, 2 layers)."
echo "== The generated ids are meaningless; this shows loading, prefill and KV-cached decoding."
"$BIN" make-model --preset tiny-llama --output "$TINY" --seed 0
PROMPT="1,17,42,99,256,7"
echo "== prompt token ids: $PROMPT"
echo -n "== 24 generated token ids (greedy): "
"$BIN" generate --model-path "$TINY" --token-ids "$PROMPT" --max-tokens 24 --ignore-eos --quiet
echo "== info:"
"$BIN" info --model-path "$TINY" --quiet
