#!/bin/sh
# verify read rate: writes a random checkpoint (default: qwen2-1.5b shape with 4 layers, bf16,
# ~0.7 GB), then alternates a plain sequential read of its files (cat > /dev/null, the machine's
# read rate for these files in this cache state) with `deepharness verify` over the same files
# (its values check streams every tensor from disk), REPEAT times each, and prints both rates.
# Cache state: the files were just written, so they are in the page cache unless memory is
# short, and by default nothing is dropped: the figures then compare verify with reading the same
# bytes from the page cache, i.e. verify's CPU cost. With DROP_CACHES=1 (root: writes
# /proc/sys/vm/drop_caches after a sync) the page cache is dropped before each read, so both
# read from the disk and the comparison is against the disk's read rate.
# Usage: [DROP_CACHES=1] bench/verify_rate.sh [BINARY] [THREADS] [REPEAT] [LAYERS]
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
drop() {
  if [ "${DROP_CACHES:-0}" = 1 ]; then sync && echo 1 > /proc/sys/vm/drop_caches; fi
}
i=0
while [ "$i" -lt "$REPEAT" ]; do
  drop
  t0=$(now)
  cat "$DIR"/model/*.safetensors > /dev/null
  t1=$(now)
  drop
  "$BIN" verify --model-path "$DIR/model" --threads "$THREADS" --json --quiet > "$DIR/v.json"
  python3 - "$DIR/v.json" "$BYTES" "$t0" "$t1" "${DROP_CACHES:-0}" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
total, t0, t1 = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
drop = sys.argv[5] == "1"
cat_rate = total / (t1 - t0) / 1e9
vr = v["values_bytes"] / v["values_seconds"] / 1e9
print(f"files {total / 1e9:.3f} GB: sequential read (cat{', caches dropped' if drop else ''}) {cat_rate:.2f} GB/s; "
      f"verify values {v['values_bytes'] / 1e9:.3f} GB in {v['values_seconds']:.2f} s = "
      f"{vr:.2f} GB/s ({vr / cat_rate:.0%} of the read rate); clean={v['clean']}")
PY
  i=$((i + 1))
done
