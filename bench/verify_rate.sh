#!/bin/sh
# verify read rate: writes a random checkpoint (default: qwen2-1.5b shape with 8 layers, bf16,
# 1.22 GB), then alternates a plain sequential read of its files (cat > /dev/null, the machine's
# read rate for these files in this cache state) with `deepharness verify` over the same files
# (its values check streams every tensor), REPEAT times, and prints both rates and how verify got
# its bytes (from the page cache in place, O_DIRECT, buffered).
# Cache state: the files were just written, so they are in the page cache unless memory is
# short, and by default nothing is dropped: the figures then compare verify with reading the same
# bytes from the page cache, i.e. verify's CPU cost. With DROP_CACHES=1 (root: writes
# /proc/sys/vm/drop_caches after a sync) the page cache is dropped before each read, so both
# read from the disk and the comparison is against the disk's read rate.
# Each verify is compared with a cat of the same files in the same cache state just before it.
# With BEFORE=OTHER_BINARY, each round also runs OTHER_BINARY's verify (a before/after comparison
# in the same minutes; the two take turns going first).
# Usage: [DROP_CACHES=1] [BEFORE=BIN0] bench/verify_rate.sh [BINARY] [THREADS] [REPEAT] [LAYERS]
set -eu
BIN=${1:-build/deepharness}
THREADS=${2:-2}
REPEAT=${3:-3}
LAYERS=${4:-8}
DIR=$(mktemp -d /tmp/dh_verify_rate.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
"$BIN" make-model --preset qwen2-1.5b --layers "$LAYERS" --output "$DIR/model" -q
BYTES=$(cat "$DIR"/model/*.safetensors | wc -c)
now() { date +%s.%N; }
drop() {
  if [ "${DROP_CACHES:-0}" = 1 ]; then sync && echo 1 > /proc/sys/vm/drop_caches; fi
}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
read_rate() {  # a cold (or warm) cat of the files: sets t0, t1
  drop
  t0=$(now)
  cat "$DIR"/model/*.safetensors > /dev/null
  t1=$(now)
}
i=0
while [ "$i" -lt "$REPEAT" ]; do
  ORDER="$BIN ${BEFORE:-}"
  if [ $((i % 2)) = 1 ] && [ -n "${BEFORE:-}" ]; then ORDER="$BEFORE $BIN"; fi  # alternate who goes first
  for B in $ORDER; do
    read_rate
    drop
    "$B" verify --model-path "$DIR/model" --threads "$THREADS" --json --quiet > "$DIR/v.json"
    python3 - "$DIR/v.json" "$BYTES" "$t0" "$t1" "${DROP_CACHES:-0}" "$B" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
total, t0, t1 = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
drop = sys.argv[5] == "1"
cat_rate = total / (t1 - t0) / 1e9
vr = v["values_bytes"] / v["values_seconds"] / 1e9
paths = v.get("values_read")
how = "" if paths is None else " [" + ", ".join(
    f"{k} {paths[k] / 1e9:.3f} GB" for k in ("mapped", "direct", "buffered") if paths[k]) + "]"
print(f"files {total / 1e9:.3f} GB: sequential read (cat{', caches dropped' if drop else ''}) {cat_rate:.2f} GB/s; "
      f"{sys.argv[6]} verify values {v['values_bytes'] / 1e9:.3f} GB in {v['values_seconds']:.2f} s = "
      f"{vr:.2f} GB/s ({vr / cat_rate:.0%} of the read rate){how}; clean={v['clean']}")
PY
  done
  i=$((i + 1))
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
