#!/usr/bin/env bash
# The sanitizers' subset that `make test` runs (ctest `sanitize_subset`; docs/reliability.md
# "Sanitizers"): the parsers of untrusted input under ASan + UBSan, replaying every committed fuzz
# corpus, and the thread pool's tests under ThreadSanitizer. Two small builds (the parsing layers
# and src/base only, DH_FUZZ_ONLY with GCC) under BUILD_ROOT/asan and BUILD_ROOT/tsan. The whole
# suite under both sanitizers is `make sanitize` and `make tsan`.
#   scripts/sanitize_subset.sh BUILD_ROOT     (DH_SANITIZE_JOBS: build jobs, default 1)
# Exit 0 clean, 1 on any sanitizer report or failed test.
set -euo pipefail
root=${1:?usage: scripts/sanitize_subset.sh BUILD_ROOT}
src=$(cd "$(dirname "$0")/.." && pwd)
jobs=${DH_SANITIZE_JOBS:-1}
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

build() {  # build DIR FLAGS TARGET...
  local dir=$1 flags=$2
  shift 2
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDH_FUZZ_ONLY=ON \
    -DCMAKE_CXX_COMPILER=g++ "${launcher[@]}" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; return 1; }
  cmake --build "$dir" -j "$jobs" --target "$@"
}

mkdir -p "$root"
asan="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
build "$root/asan" "$asan" fuzz_replay san_thread_pool_tests
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for dir in "$src"/tests/fuzz/corpus/*/; do
  target=$(basename "$dir")
  echo "asan+ubsan: fuzz_replay $target"
  "$root/asan/fuzz_replay" "$target" "$dir"
done
"$root/asan/san_thread_pool_tests" --gtest_brief=1

build "$root/tsan" "-fsanitize=thread -fno-omit-frame-pointer" san_thread_pool_tests
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 "$root/tsan/san_thread_pool_tests" --gtest_brief=1
echo "sanitize_subset: clean"
