#!/bin/sh
# verify read rate: writes a random checkpoint (default: qwen2-1.5b shape with 4 layers, bf16,
# ~0.7 GB), then alternates a plain sequential read of its files (cat > /dev/null, the machine's
# read rate for these files in this cache state) with `deepharness verify` over the same files
# (its values check streams every tensor from disk), REPEAT times each, and prints both rates.
# Cache state: the files were just written, so they are in the page cache unless memory is
# short; nothing is dropped (dropping caches needs root on the host). The figures therefore
# compare verify with reading the same bytes from the page cache, i.e. verify's CPU cost.
# Usage: bench/verify_rate.sh [BINARY] [THREADS] [REPEAT] [LAYERS]
set -eu
BIN=${1:-build/deepharness}
THREADS=${2:-2}
REPEAT=${3:-3}
LAYERS=${4:-4}
DIR=$(mktemp -d /tmp/dh_verify_rate.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
"$BIN" make-model --preset qwen2-1.5b --layers "$LAYERS" --output "$DIR/model" -q
BYTES=$(cat "$DIR"/model/*.safetensors | wc -c)
now() { date +%s.%N; }
i=0
while [ "$i" -lt "$REPEAT" ]; do
  t0=$(now)
  cat "$DIR"/model/*.safetensors > /dev/null
  t1=$(now)
  "$BIN" verify --model-path "$DIR/model" --threads "$THREADS" --json --quiet > "$DIR/v.json"
  python3 - "$DIR/v.json" "$BYTES" "$t0" "$t1" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
total, t0, t1 = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
cat_rate = total / (t1 - t0) / 1e9
vr = v["values_bytes"] / v["values_seconds"] / 1e9
print(f"files {total / 1e9:.3f} GB: sequential read (cat) {cat_rate:.2f} GB/s; "
      f"verify values {v['values_bytes'] / 1e9:.3f} GB in {v['values_seconds']:.2f} s = "
      f"{vr:.2f} GB/s ({vr / cat_rate:.0%} of the read rate); clean={v['clean']}")
PY
  i=$((i + 1))
done
