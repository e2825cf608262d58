#!/usr/bin/env bash
# Cross-builds kernel_tests for aarch64 with Debian's g++-aarch64-linux-gnu and runs it under
# qemu-user, so the Highway kernels' ARM path is tested on an x86 machine (docs/arm.md).
#
#   scripts/test_arm.sh [BUILD_DIR]      (default build-arm; ctest's arm_kernel_tests passes its own)
#
# Environment: DH_ARM_JOBS (build jobs, default 2); DH_ARM_SVE=1 also compiles Highway's SVE
# targets and runs the tests at SVE vector lengths of 128 and 256 bits (see docs/arm.md for why
# that is off by default). Exits 77 with a "skipped:" line when the cross toolchain, qemu or an
# arm64 package is missing (scripts/setup.sh installs them); ctest reports that as a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${1:-build-arm}"

skip() {
  echo "arm_kernel_tests: skipped: $1 (scripts/setup.sh installs it; docs/arm.md)"
  exit 77
}
command -v aarch64-linux-gnu-g++ >/dev/null || skip "no aarch64-linux-gnu-g++ (g++-aarch64-linux-gnu)"
command -v qemu-aarch64 >/dev/null || skip "no qemu-aarch64 (qemu-user)"
[[ -e /lib/ld-linux-aarch64.so.1 ]] || skip "no arm64 loader /lib/ld-linux-aarch64.so.1 (libc6:arm64)"
for pkg in hwy:libhwy-dev fmt:libfmt-dev GTest:libgtest-dev; do
  [[ -d /usr/lib/aarch64-linux-gnu/cmake/${pkg%%:*} ]] || skip "no ${pkg#*:}:arm64"
done

sve=OFF
if [[ "${DH_ARM_SVE:-0}" == "1" ]]; then sve=ON; fi
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/aarch64-linux-gnu.cmake" -DDH_KERNEL_TESTS_ONLY=ON \
  -DDH_ARM_SVE="$sve" "${launcher[@]}" >/dev/null
cmake --build "$build_dir" -j "${DH_ARM_JOBS:-2}" --target kernel_tests

# qemu's default CPU for aarch64 user mode is "max" (NEON, SVE, SVE2). Highway picks SVE2_128 or
# SVE_256 only when the vector length is exactly 128 or 256 bits, so with SVE compiled in, two
# runs cover every target; without it NEON is the only target and one run does.
cpus=(max)
if [[ "$sve" == ON ]]; then
  cpus=(max,sve-default-vector-length=16 max,sve-default-vector-length=32)
fi
for cpu in "${cpus[@]}"; do
  echo "== qemu-aarch64 -cpu $cpu $build_dir/kernel_tests"
  qemu-aarch64 -cpu "$cpu" "$build_dir/kernel_tests"
done
