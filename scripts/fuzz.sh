#!/usr/bin/env bash
# Runs the libFuzzer targets built by `make fuzz` in parallel at the lowest priority (SCHED_IDLE,
# else nice 19; docs/reliability.md "Fuzzing").
#   scripts/fuzz.sh SECONDS [TARGET...]     (default: every build-fuzz/fuzz_* binary)
# Each target starts from its committed corpus tests/fuzz/corpus/<t>/ and grows a working corpus
# in build-fuzz/corpus/<t>/; crashes land in build-fuzz/crashes/<t>/, logs in build-fuzz/logs/.
# The last status line of each log has the executions (#N), coverage (cov) and features (ft).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:?usage: scripts/fuzz.sh SECONDS [TARGET...]}
shift
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for b in build-fuzz/fuzz_*; do targets+=("${b#build-fuzz/fuzz_}"); done
fi
mkdir -p build-fuzz/logs
lowprio="nice -n 19"
if chrt --idle 0 true 2>/dev/null; then lowprio="chrt --idle 0"; fi
pids=()
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/crashes/$t"
  # SCHED_IDLE (only otherwise idle CPU) where chrt can set it, else the lowest nice level. The
  # last line of the log is the wall, user and system seconds of the run.
  (
    TIMEFORMAT="time: wall %R s, user %U s, sys %S s"
    time $lowprio "build-fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=20 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="build-fuzz/crashes/$t/" \
      "build-fuzz/corpus/$t" "tests/fuzz/corpus/$t"
  ) > "build-fuzz/logs/$t.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "fuzz_${targets[$i]}: FAILED (see build-fuzz/logs/${targets[$i]}.log)"
    status=1
  fi
done
for t in "${targets[@]}"; do
  printf '%-18s %s | %s\n' "$t" "$(grep -E '^#[0-9]+' "build-fuzz/logs/$t.log" | tail -1)" \
    "$(grep '^time: ' "build-fuzz/logs/$t.log" | tail -1)"
done
exit $status
