#!/usr/bin/env bash
# Builds the CUDA device check's programs on this (Debian) machine and gathers them into one folder
# to carry to the GPU machine, whose image has the CUDA toolkit and driver but not Debian's -dev
# packages (docs/backends.md "The device check"):
#
#   scripts/device_bundle.sh DIR
#
# DIR gets deepharness, kernel_tests, golden_tests and dh_cuda_roofline, stripped, with RUNPATH
# $ORIGIN/lib, and DIR/lib the shared libraries they load that are not the C/C++ runtime or CUDA's
# own (cudart, cuBLAS: the GPU machine's are used). The build is for sm_90 + compute_90 PTX, without
# MPI and NCCL (one process on one GPU). Then, there:
#
#   DH_DEVICE_CHECK_PREBUILT=DIR scripts/device_check.sh OUTDIR
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: scripts/device_bundle.sh DIR" >&2
  exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${DH_DEVICE_BUNDLE_BUILD:-$ROOT/build-cuda}
DIR=$1
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[[ -x $NVCC ]] || { echo "error: nvcc not found (PATH or /usr/local/cuda/bin)" >&2; exit 2; }

GEN="Unix Makefiles"
command -v ninja > /dev/null && GEN=Ninja
cmake -S "$ROOT" -B "$BUILD" -G "$GEN" -DCMAKE_BUILD_TYPE=Release -DDH_CUDA=on \
  "-DCMAKE_CUDA_ARCHITECTURES=90-real;90-virtual" "-DCMAKE_CUDA_COMPILER=$NVCC" \
  -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DDH_NCCL_LIBRARY=OFF '-DCMAKE_BUILD_RPATH=$ORIGIN/lib' \
  > /dev/null
cmake --build "$BUILD" -j "$(nproc)" --target deepharness kernel_tests golden_tests dh_cuda_roofline

mkdir -p "$DIR/lib"
BINS=(deepharness kernel_tests golden_tests dh_cuda_roofline)
for b in "${BINS[@]}"; do cp "$BUILD/$b" "$DIR/" && strip "$DIR/$b"; done  # the carry limit is 64 MiB
# Every resolved library except the loader, libc and friends, the C++ runtime and CUDA's.
for b in "${BINS[@]}"; do ldd "$BUILD/$b"; done | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' |
  sort -u | grep -Ev '/(ld-linux|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libcudart|libcublas|libcublasLt)[.-]' |
  while read -r lib; do cp -L "$lib" "$DIR/lib/"; done
du -sh "$DIR"
ls "$DIR/lib"
