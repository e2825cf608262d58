#!/usr/bin/env bash
# Installs every Debian package the build, the tests and the tools need. Idempotent.
set -euo pipefail
PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libhwy-dev libcpp-httplib-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev
  libcli11-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev libssl-dev zlib1g-dev libxxhash-dev
  curl
  openmpi-bin libopenmpi-dev
)
# Node.js + npm run the OpenAI SDK end-to-end test. A machine may already have them from another
# source (e.g. NodeSource's nodejs, which bundles npm and conflicts with Debian's npm package).
if ! command -v node >/dev/null 2>&1; then PACKAGES+=(nodejs); fi
if ! command -v npm >/dev/null 2>&1; then PACKAGES+=(npm); fi
# Headless chromium for the web UI browser tests (driven by playwright-core from npm).
PACKAGES+=(chromium)
# `make fuzz`: clang-14 with libFuzzer and the sanitizer runtimes (docs/reliability.md).
PACKAGES+=(clang-14 libclang-rt-14-dev)
# Optional: the PyTorch reference under pytorch/ (run by hand, never in CI).
if [[ "${DH_WITH_TORCH:-0}" == "1" ]]; then PACKAGES+=(python3-torch python3-numpy); fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

# The aarch64 cross build of the kernel tests, run under qemu-user (ctest arm_kernel_tests,
# scripts/test_arm.sh, docs/arm.md): Debian's cross compiler, qemu-user and the arm64 multiarch
# -dev packages that kernel_tests links (Highway, fmt, GoogleTest/GoogleMock). DH_WITH_ARM=0 skips
# this; a failure here only warns, and arm_kernel_tests then skips with a message.
if [[ "${DH_WITH_ARM:-1}" == "1" ]]; then
  ARM_PACKAGES=(g++-aarch64-linux-gnu qemu-user
                libhwy-dev:arm64 libfmt-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64)
  arm_missing=()
  for p in "${ARM_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || arm_missing+=("$p")
  done
  if ((${#arm_missing[@]})); then
    echo "setup: installing ${arm_missing[*]} (aarch64 cross build)"
    if ! { dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64; } ||
       ! $SUDO apt-get update -qq ||
       ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
           "${arm_missing[@]}"; then
      echo "setup: warning: the aarch64 cross toolchain could not be installed; arm_kernel_tests will skip"
    fi
  fi
fi
