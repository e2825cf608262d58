#!/bin/sh
# Open MPI's remote launcher for the two-namespace test (tests/mpi/two_host_test.sh), in place
# of ssh: `netns_rsh.sh [OPTIONS] HOST COMMAND...` runs COMMAND in the network namespace that owns
# HOST's address. DH_NETNS_MAP lists them as "ADDRESS=NAMESPACE ...".
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh-style options: none apply
host=$1
shift
for pair in $DH_NETNS_MAP; do
  if [ "${pair%%=*}" = "$host" ]; then
    exec ip netns exec "${pair#*=}" /bin/sh -c "$*"
  fi
done
echo "netns_rsh.sh: no network namespace for host '$host' in DH_NETNS_MAP" >&2
exit 1
