#!/bin/bash
# plm_rsh_agent for the multihost harness: stands in for ssh. Open MPI calls it as
#   mh_agent.sh [ssh options] HOST COMMAND...
# and it runs COMMAND (a shell command line, as ssh would) inside HOST's namespaces
# (network, hostname, mount: its own /tmp), found in $MH_HOLDERS_FILE ("host pid" lines).
set -u
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in
    -l | -p | -i | -o) shift 2 ;; # ssh options with a value
    *) shift ;;
  esac
done
host=${1:?mh_agent.sh: no host given}
shift
pid=$(awk -v h="$host" '$1 == h { print $2; exit }' "${MH_HOLDERS_FILE:?}")
if [[ -z $pid || ! -d /proc/$pid ]]; then
  echo "mh_agent.sh: unknown or dead test host '$host'" >&2
  exit 255
fi
exec nsenter -t "$pid" -n -u -m -- /bin/sh -c "$*"
