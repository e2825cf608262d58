#!/usr/bin/env bash
# Items per second of `deepharness eval` on the embedded model (models/shakespeare-v3, 256-token
# context) at concurrency 1 and 8, for multiple choice (MMLU layout) and GSM8K. The datasets are
# synthetic (generated here in the published layouts; no benchmark data ships with the repo), so
# the figures measure the eval pipeline + engine, not any accuracy.
# Usage: bench/eval_throughput.sh [BUILD_DIR]   (default build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build}/deepharness
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# MMLU layout: 4 subjects x 25 test questions, 5 dev questions each.
for s in 0 1 2 3; do
  for split in dev test; do
    n=5; [ "$split" = test ] && n=25
    mkdir -p "$work/mmlu/data/$split"
    for i in $(seq 1 $n); do
      echo "\"In the play, what does the speaker of line $i in scene $s mean by 'a summer's day'?\",A season of the year,A comparison of beauty,A date for a wedding,A sign of bad weather,$(printf '%s' ABCD | cut -c$(( (i + s) % 4 + 1 )))"
    done > "$work/mmlu/data/$split/subject_${s}_${split}.csv"
  done
done
# GSM8K layout: 24 problems.
mkdir -p "$work/gsm8k"
for i in $(seq 1 24); do
  echo "{\"question\": \"A baker makes $i trays of 12 rolls and sells $((i * 5)) rolls. How many rolls are left?\", \"answer\": \"$i * 12 - $((i * 5)) = $((i * 7))\\n#### $((i * 7))\"}"
done > "$work/gsm8k/test.jsonl"

echo "# $(date -u +%FT%TZ) $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
for task in mmlu gsm8k; do
  for c in 1 8; do
    "$bin" eval --model-path "$root/models/shakespeare-v3" --tasks $task --data "$work/$task" \
      --concurrency $c --max-gen-toks 64 --no-progress --output "$work/r.json" >/dev/null
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f\"{sys.argv[2]:6} concurrency {sys.argv[3]}: {r['num_items']} items in {r['elapsed_s']:.1f} s = {r['items_per_s']:.2f} items/s\")" \
      "$work/r.json" $task $c
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
