#!/bin/sh
# Open MPI's remote launcher for the two-namespace test (tests/mpi/two_host_test.sh), in place
# of ssh: `netns_rsh.sh [OPTIONS] HOST COMMAND...` runs COMMAND in the network namespace that owns
# HOST's address. DH_NETNS_MAP lists them as "ADDRESS=NAMESPACE ...". With DH_NETNS_UTS=1 the
# command also gets a host name of its own (a UTS namespace named "netns-<NAMESPACE>", "_" as "-"), so the
# processes there look like another machine's to deepharness (which tells hosts by name).
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh-style options: none apply
host=$1
shift
for pair in $DH_NETNS_MAP; do
  if [ "${pair%%=*}" = "$host" ]; then
    if [ "${DH_NETNS_UTS:-0}" = 1 ]; then
      name=netns-$(echo "${pair#*=}" | tr _ -)
      exec ip netns exec "${pair#*=}" unshare --uts /bin/sh -c "hostname $name && $*"
    fi
    exec ip netns exec "${pair#*=}" /bin/sh -c "$*"
  fi
done
echo "netns_rsh.sh: no network namespace for host '$host' in DH_NETNS_MAP" >&2
exit 1
