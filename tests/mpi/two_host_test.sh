#!/bin/bash
# Tensor parallelism across two "hosts" (ctest tp_two_hosts): two network namespaces joined by a
# veth pair stand for two machines; Open MPI starts one rank in each and the ranks talk over TCP
# only (btl tcp,self), Open MPI's launcher reaching the second namespace through
# tests/mpi/netns_rsh.sh instead of ssh. The ranks run tp_mpi_tests' fixture comparison: every
# golden fixture's logits at tp 2 equal the single process's, 32 greedy tokens identical.
# Needs root (ip netns); exits 77 (skip) with a message where namespaces cannot be made.
# Usage: two_host_test.sh TP_MPI_TESTS
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
