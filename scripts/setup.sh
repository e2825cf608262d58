#!/usr/bin/env bash
# Installs every Debian package the build, the tests and the tools need. Idempotent.
set -euo pipefail
PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libhwy-dev libcpp-httplib-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev
  libcli11-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev libssl-dev zlib1g-dev libxxhash-dev
  curl
)
# Node.js + npm run the OpenAI SDK end-to-end test. A machine may already have them from another
# source (e.g. NodeSource's nodejs, which bundles npm and conflicts with Debian's npm package).
if ! command -v node >/dev/null 2>&1; then PACKAGES+=(nodejs); fi
if ! command -v npm >/dev/null 2>&1; then PACKAGES+=(npm); fi
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
