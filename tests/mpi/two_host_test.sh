#!/bin/bash
# Tensor parallelism across two "hosts" (ctest tp_two_hosts): two network namespaces joined by a
# veth pair stand for two machines; Open MPI starts one rank in each and the ranks talk over TCP
# only (btl tcp,self), Open MPI's launcher reaching the second namespace through
# tests/mpi/netns_rsh.sh instead of ssh. The ranks run tp_mpi_tests' fixture comparison: every
# golden fixture's logits at tp 2 equal the single process's, 32 greedy tokens identical.
# With DEEPHARNESS and MODEL_DIR, then `serve --tp-size 2` under an mpirun started by hand across
# the two namespaces, rank 1's side with a host name of its own (so rank 0 cannot look its
# processes up): rank 1 killed while idle must make rank 0 name it as on another host and exit
# non-zero, leaving no process in either namespace.
# Needs root (ip netns); exits 77 (skip) with a message where namespaces cannot be made.
# Usage: two_host_test.sh TP_MPI_TESTS [DEEPHARNESS MODEL_DIR]
set -u
TESTS=$1
HERE=$(cd "$(dirname "$0")" && pwd)
command -v mpirun >/dev/null || { echo "skip: mpirun not found (openmpi-bin)"; exit 77; }
command -v ip >/dev/null || { echo "skip: ip not found (iproute2)"; exit 77; }
NS_A=dh_tp_a_$$
NS_B=dh_tp_b_$$
# 10.213.x.y/30 from the pid, so concurrent runs do not collide.
NET="10.213.$(( ($$ >> 6) % 256 )).$(( ($$ % 64) * 4 ))"
ADDR_A="${NET%.*}.$(( ${NET##*.} + 1 ))"
ADDR_B="${NET%.*}.$(( ${NET##*.} + 2 ))"
cleanup() {
  for ns in "$NS_A" "$NS_B"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
}
trap cleanup EXIT
if ! ip netns add "$NS_A" 2>/dev/null; then
  echo "skip: cannot create network namespaces here (ip netns add needs root and CAP_SYS_ADMIN)"
  exit 77
fi
ip netns add "$NS_B" || exit 1
ip link add "veth_a$$" netns "$NS_A" type veth peer name "veth_b$$" netns "$NS_B" || {
  echo "skip: cannot create a veth pair here"; exit 77; }
ip -n "$NS_A" addr add "$ADDR_A/30" dev "veth_a$$"
ip -n "$NS_B" addr add "$ADDR_B/30" dev "veth_b$$"
for ns in "$NS_A" "$NS_B"; do
  ip -n "$ns" link set lo up
done
ip -n "$NS_A" link set "veth_a$$" up
ip -n "$NS_B" link set "veth_b$$" up

export DH_NETNS_MAP="$ADDR_B=$NS_B"
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
# mpirun (and rank 0) in namespace A; rank 1's daemon started in B by netns_rsh.sh. TCP only,
# on the veth pair's addresses: no shared memory between the "hosts".
ip netns exec "$NS_A" timeout 240 mpirun "${root[@]}" --oversubscribe -np 2 \
  --host "$ADDR_A:1,$ADDR_B:1" \
  --mca plm_rsh_agent "$HERE/netns_rsh.sh" \
  --mca btl tcp,self --mca btl_tcp_if_include "$NET/30" --mca oob_tcp_if_include "$NET/30" \
  -x OMP_NUM_THREADS=1 \
  "$TESTS" --gtest_filter=TensorParallel.EveryFixtureMatchesOneProcess
status=$?
[ "$status" = 0 ] || { echo "FAIL: tp 2 across two namespaces: status $status"; exit 1; }
echo "ok: tp 2 across two network namespaces ($ADDR_A, $ADDR_B over TCP) equals one process"

[ $# -ge 3 ] || exit 0
BIN=$2
MODEL=$3
LOG=$(mktemp)
trap 'cleanup; rm -f "$LOG"' EXIT
export DH_NETNS_UTS=1
ip netns exec "$NS_A" timeout 120 mpirun "${root[@]}" --oversubscribe -np 2 \
  --host "$ADDR_A:1,$ADDR_B:1" \
  --mca plm_rsh_agent "$HERE/netns_rsh.sh" \
  --mca btl tcp,self --mca btl_tcp_if_include "$NET/30" --mca oob_tcp_if_include "$NET/30" \
  "$BIN" serve --model-path "$MODEL" --tp-size 2 --port 0 --threads 1 --num-kv-blocks 64 -q \
  --rank-timeout 5 >"$LOG" 2>&1 &
job=$!
for _ in $(seq 1 120); do
  grep -q "ready on" "$LOG" && break
  kill -0 "$job" 2>/dev/null || { echo "FAIL: serve across the namespaces exited before it was ready"; cat "$LOG"; exit 1; }
  sleep 0.5
done
grep -q "ready on" "$LOG" || { echo "FAIL: serve across the namespaces not ready after 60 s"; cat "$LOG"; exit 1; }
follower=""
for p in $(ip netns pids "$NS_B"); do
  if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then
    follower=$p
  fi
done
[ -n "$follower" ] || { echo "FAIL: rank 1 not found in $NS_B"; exit 1; }
kill -KILL "$follower"
start_s=$SECONDS
for _ in $(seq 1 60); do kill -0 "$job" 2>/dev/null || break; sleep 0.5; done
kill -0 "$job" 2>/dev/null && { echo "FAIL: the job still runs 30 s after rank 1 died on the other host"; cat "$LOG"; exit 1; }
wait "$job"
status=$?
[ "$status" != 0 ] || { echo "FAIL: the job exited 0 after rank 1 died on the other host"; cat "$LOG"; exit 1; }
want="error: mpirun is ending the job: a rank failed, or mpirun itself was told to stop (rank 1 (pid $follower on netns-${NS_B//_/-}): on another host)"
grep -qF "$want" "$LOG" || { echo "FAIL: rank 0 did not say: $want"; cat "$LOG"; exit 1; }
for _ in $(seq 1 40); do
  left="$(ip netns pids "$NS_A") $(ip netns pids "$NS_B")"
  [ -z "${left// /}" ] && break
  sleep 0.5
done
[ -z "${left// /}" ] || { echo "FAIL: processes left in the namespaces: $left"; exit 1; }
echo "ok: serve across the namespaces, rank 1 killed on the other host: status $status in" \
     "$((SECONDS - start_s)) s: $want"
