#!/bin/sh
# compare wall time: N prompts (default 100: character cues of the embedded Shakespeare model)
# through `deepharness compare` between two local targets (default: the embedded model on the
# cpu backend vs the reference backend), greedy + SAMPLES seeded sampled runs each, and prints
# compare's own run time (requests only) and the whole command's wall time (with both loads).
# Usage: bench/compare_prompts.sh [BINARY] [N] [MAX_TOKENS] [SAMPLES] [A] [B]
set -eu
BIN=${1:-build/deepharness}
N=${2:-100}
MAX_TOKENS=${3:-32}
SAMPLES=${4:-2}
A=${5:-model=models/shakespeare-v3}
B=${6:-model=models/shakespeare-v3,device=reference}
DIR=$(mktemp -d /tmp/dh_compare_bench.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
python3 - "$DIR/prompts.jsonl" "$N" <<'PY'
import json, sys
names = ["ROMEO", "JULIET", "KING RICHARD III", "GLOUCESTER", "First Citizen", "MENENIUS",
         "CORIOLANUS", "DUKE VINCENTIO", "ISABELLA", "LUCIO", "QUEEN ELIZABETH", "BUCKINGHAM",
         "HENRY BOLINGBROKE", "JOHN OF GAUNT", "NORTHUMBERLAND", "PETRUCHIO", "KATHARINA"]
cues = ["", "O ", "My lord, ", "What ", "I ", "Come, ", "Why, "]
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(json.dumps({"id": f"p{i}", "prompt": names[i % len(names)] + ":\n" + cues[i % len(cues)]}) + "\n")
PY
t0=$(date +%s.%N)
"$BIN" compare --a "$A" --b "$B" --prompts "$DIR/prompts.jsonl" --max-tokens "$MAX_TOKENS" \
  --samples "$SAMPLES" --quiet --json-file "$DIR/r.json" > "$DIR/out.txt" || true
t1=$(date +%s.%N)
python3 - "$DIR/r.json" "$t0" "$t1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
g, s = r["overall"]["greedy"], r["overall"]["sampled"]
runs = g["runs"] + s["runs"]
wall = float(sys.argv[3]) - float(sys.argv[2])
print(f"compare: {r['config']['prompts']} prompts x {1 + r['config']['samples']} runs, "
      f"max_tokens {r['config']['max_tokens']}: requests {r['seconds']:.1f} s "
      f"({runs / r['seconds']:.1f} run pairs/s), whole command {wall:.1f} s; "
      f"greedy exact {g['exact']}/{g['runs']}, sampled exact {s['exact']}/{s['runs']}, pass={r['pass']}")
PY
