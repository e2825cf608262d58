#!/usr/bin/env bash
# The CUDA device check (docs/backends.md "The device check"): one run on a GPU machine (made for
# one H200, 16 cores; about 3 minutes with prebuilt binaries, first on 2026-12-04) that
#   1. builds deepharness with DH_CUDA=on for sm_90 (+ compute_90 PTX),
#   2. runs the kernel conformance suite and the golden model tests on the cuda backend (an error
#      if they were skipped), and the golden tests again under compute-sanitizer's memcheck,
#   3. measures device-to-device copy bandwidth and cuBLAS's bf16 GEMM rate (dh_cuda_roofline),
#   4. benchmarks decode (batch 1 and 32) and a 2048-token prefill on random bf16 checkpoints of
#      Qwen2-1.5B, Llama-8B and DeepSeek-V2-Lite shapes (`deepharness make-model`; the last two
#      with fewer layers so that the run fits: per-layer shapes are the real ones),
#   5. times each op of a decode step and of the prefill with CUDA events (DH_CUDA_OP_TIMES),
#   6. runs PyTorch + transformers on the same weights where they are installed,
#   7. compares each model's logits on cuda with the CPU path's (scripts/device_check_agree.py),
# writing logs and summary.json to OUTDIR.
#
#   scripts/device_check.sh OUTDIR
#
# Every stage has its own time limit; a failure is recorded in summary.json and the run goes on,
# so that one lease brings back everything (a failed build or configure stops it). Exit status 0
# only when every stage passed.
#
# The GPU machine's image has the CUDA toolkit but not Debian's -dev packages (Highway, fmt, ...),
# so there the build stage cannot configure. scripts/device_bundle.sh builds here and gathers the
# binaries with the shared libraries they need (found through their RUNPATH, $ORIGIN/lib, so the
# environment of the other stages, PyTorch's among them, is left alone); with
# DH_DEVICE_CHECK_PREBUILT=DIR this script skips the build and runs the binaries in DIR.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: scripts/device_check.sh OUTDIR" >&2
  exit 2
fi
OUT=$1
mkdir -p "$OUT" || { echo "error: cannot create $OUT" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${DH_DEVICE_CHECK_BUILD:-$ROOT/build-cuda}
MODELS=${DH_DEVICE_CHECK_MODELS:-/tmp/dh_device_check_models}
JOBS=$(nproc)
STAGES="$OUT/stages.tsv"
: > "$STAGES"
START=$(date +%s)
FAILED=0

log() { echo "[device_check $(( $(date +%s) - START ))s] $*" | tee -a "$OUT/device_check.log" >&2; }
# stage NAME LIMIT_S CMD...: runs CMD with a time limit, output to OUT/NAME.log; records the result.
stage() {
  local name=$1 limit=$2
  shift 2
  local t0 rc
  t0=$(date +%s)
  log "$name: $*"
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >> "$STAGES"
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    log "$name: FAILED: over its limit of ${limit}s (see $name.log)"
  elif [[ $rc -ne 0 ]]; then
    log "$name: FAILED with status $rc; last lines of $name.log:"
    tail -n 15 "$OUT/$name.log" | sed 's/^/    /' >&2
  else
    log "$name: ok ($(( $(date +%s) - t0 ))s)"
  fi
  [[ $rc -eq 0 ]] || FAILED=1
  return $rc
}
fail() {
  log "error: $*"
  summarize
  exit 1
}
summarize() {
  python3 "$ROOT/scripts/device_check_summary.py" "$OUT" > "$OUT/summary.json" 2>> "$OUT/device_check.log" ||
    log "summary: could not write summary.json (see device_check.log)"
}

# ---- 0. prerequisites: a GPU and the tools, before anything slow ----
if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L > "$OUT/gpu.txt" 2>&1 ||
   ! grep -q "^GPU" "$OUT/gpu.txt"; then
  log "error: no NVIDIA GPU visible (nvidia-smi -L failed or listed none); the device check runs on the GPU machine"
  exit 1
fi
log "GPU: $(head -n 1 "$OUT/gpu.txt")"
NVCC=$(command -v nvcc || true)
[[ -z $NVCC && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
[[ -n $NVCC ]] || { log "error: nvcc not found (PATH or /usr/local/cuda/bin)"; exit 1; }
for tool in cmake python3; do
  command -v "$tool" > /dev/null || { log "error: $tool not found"; exit 1; }
done
GEN="Unix Makefiles"
command -v ninja > /dev/null && GEN=Ninja

# ---- 1. build ----
PROGRAMS=(deepharness kernel_tests golden_tests dh_cuda_roofline)
if [[ -n ${DH_DEVICE_CHECK_PREBUILT:-} ]]; then
  BUILD=$(cd "$DH_DEVICE_CHECK_PREBUILT" && pwd) || fail "DH_DEVICE_CHECK_PREBUILT: no such folder"
  for b in "${PROGRAMS[@]}"; do
    [[ -x $BUILD/$b ]] || fail "DH_DEVICE_CHECK_PREBUILT: $BUILD/$b is missing"
  done
  log "prebuilt binaries in $BUILD"
else
stage configure 120 cmake -S "$ROOT" -B "$BUILD" -G "$GEN" -DCMAKE_BUILD_TYPE=Release -DDH_CUDA=on \
  "-DCMAKE_CUDA_ARCHITECTURES=90-real;90-virtual" "-DCMAKE_CUDA_COMPILER=$NVCC" ||
  fail "configure failed: see $OUT/configure.log (missing packages? scripts/setup.sh lists them)"
stage build 360 cmake --build "$BUILD" -j "$JOBS" --target "${PROGRAMS[@]}" ||
  fail "build failed: see $OUT/build.log"
fi

# ---- 2. correctness on the cuda backend ----
stage conformance 120 "$BUILD/kernel_tests" --gtest_filter='*BackendConformance*cuda*'
stage golden 180 "$BUILD/golden_tests" --gtest_filter='*GoldenTest*_cuda*'
for t in conformance golden; do
  if grep -q "SKIPPED" "$OUT/$t.log" || ! grep -q "PASSED" "$OUT/$t.log"; then
    log "error: $t: the cuda cases were skipped or none ran (see $OUT/$t.log)"
    FAILED=1
  fi
done
# Out-of-bounds and misaligned device accesses, where the machine's runtime lets the sanitizer
# run (it needs the GPU's debug interface).
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2> /dev/null || true)
if [[ -n $SANITIZER ]]; then
  stage memcheck 180 "$SANITIZER" --tool memcheck --error-exitcode 3 "$BUILD/golden_tests" \
    --gtest_filter='*GoldenTest*_cuda*:-*awq*:*gptq*'
else
  log "memcheck: compute-sanitizer not found; skipped"
fi

# ---- 3-6. benchmarks ----
DH="$BUILD/deepharness"
mkdir -p "$MODELS"
# name preset layer-override(0: the preset's) gemm shapes (M,N,K of its 2048-token prefill)
# (DeepSeek first: on a short lease it is the one that must not be cut off.)
MODEL_LIST=(
  "v2-lite v2-lite 4 2048,10944,2048 2048,2048,10944 2048,1408,2048"
  "qwen2-1.5b qwen2-1.5b 0 2048,8960,1536 2048,1536,8960 2048,2048,1536"
  "llama-8b llama-8b 8 2048,14336,4096 2048,4096,14336 2048,6144,4096"
)
GEMMS=()
for m in "${MODEL_LIST[@]}"; do
  read -r _ _ _ g1 g2 g3 <<< "$m"
  GEMMS+=(--gemm "$g1" --gemm "$g2" --gemm "$g3")
done
stage roofline 90 "$BUILD/dh_cuda_roofline" --copy-mib 2048 "${GEMMS[@]}"

for m in "${MODEL_LIST[@]}"; do
  read -r name preset layers _ <<< "$m"
  dir="$MODELS/$name"
  extra=()
  [[ $layers != 0 ]] && extra=(--layers "$layers")
  if [[ ! -f $dir/config.json ]]; then
    stage "make_$name" 150 "$DH" make-model --preset "$preset" --dtype bf16 -o "$dir" "${extra[@]}" -q ||
      continue
  fi
  # The same 16-token prompt's logits on cuda and on the CPU path (the reference for a device):
  # max |difference| against the logit scale, and the positions whose argmax differs. The CPU
  # side keeps x exact (DH_BF16_DOT=off: no bf16 rounding of x on a host with AVX512-BF16).
  ids=$(seq -s, 11 26)
  stage "logits_cpu_$name" 120 env DH_BF16_DOT=off "$DH" logits --model-path "$dir" --device cpu --token-ids "$ids" \
    --output "$OUT/logits_cpu_$name.npy" --no-compile-cache
  stage "logits_cuda_$name" 120 "$DH" logits --model-path "$dir" --device cuda --token-ids "$ids" \
    --output "$OUT/logits_cuda_$name.npy" --no-compile-cache
  stage "agree_$name" 60 python3 "$ROOT/scripts/device_check_agree.py" \
    "$OUT/logits_cpu_$name.npy" "$OUT/logits_cuda_$name.npy"
  common=(--model-path "$dir" --device cuda --no-peak --membw-mib 0 --json --no-compile-cache)
  stage "decode_$name" 120 "$DH" bench "${common[@]}" --prompt 0 --gen 32 --batch 1,32 --repeat 2 --warmup 1
  stage "prefill_$name" 120 "$DH" bench "${common[@]}" --prompt 2048 --gen 0 --batch 1 --repeat 2 --warmup 1
  DH_CUDA_OP_TIMES="$OUT/optimes_$name.json" \
    stage "optimes_$name" 90 "$DH" bench "${common[@]}" --prompt 0 --gen 8 --batch 1 --repeat 1 --warmup 0
  DH_CUDA_OP_TIMES="$OUT/optimes_prefill_$name.json" \
    stage "optimes_prefill_$name" 90 "$DH" bench "${common[@]}" --prompt 2048 --gen 0 --batch 1 \
    --repeat 1 --warmup 0
  stage "torch_$name" 150 python3 "$ROOT/scripts/device_check_torch.py" "$dir"
done

summarize
log "done in $(( $(date +%s) - START ))s; summary: $OUT/summary.json"
[[ $FAILED -eq 0 ]] || { log "some stages failed (see stages.tsv)"; exit 1; }
exit 0
