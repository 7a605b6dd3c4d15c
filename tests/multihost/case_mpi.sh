#!/usr/bin/env bash
# Open MPI across 3 namespace hosts, launched from mh1, TCP over the veth links only:
# one rank per host (each rank reports its own hostname), the tutorial's message-passing
# lines, the collective tests and the DDP equivalence test (N ranks == 1 rank on the
# summed batch, SyncBN on).
set -euo pipefail
# shellcheck source=tests/multihost/harness.sh
source "$(dirname "$0")/harness.sh"
: "${RD_MH_MESSAGE_PASSING:?}" "${RD_MH_COLLECTIVE_TEST:?}" "${RD_MH_DDP_TEST:?}"
mh_start 3 220
log=$MH_DIR/log

# Placement: rank r runs on host mh(r+1), in that host's namespaces.
# shellcheck disable=SC2016 # expanded by the remote bash
mh_mpirun 1 -np 3 --map-by node bash -c 'echo "rank $OMPI_COMM_WORLD_RANK on $(hostname) $(ip -br -4 addr show eth0 | awk "{print \$3}")"' \
  >"$log" 2>&1 || { cat "$log"; mh_fail "mpirun hostname"; }
for r in 0 1 2; do
  grep -qx "rank $r on mh$((r + 1)) $MH_SUBNET.$((r + 1))/24" "$log" ||
    { cat "$log"; mh_fail "rank $r is not on host mh$((r + 1))"; }
done

t0=$SECONDS
mh_mpirun 1 -np 3 --map-by node "$RD_MH_MESSAGE_PASSING" >"$log" 2>&1 || { cat "$log"; mh_fail "message_passing"; }
for r in 1 2; do
  [[ $(grep -c "^worker_0 sent data to Rank $r\$" "$log") == 1 ]] || { cat "$log"; mh_fail "no send line for rank $r"; }
  [[ $(grep -c "^worker_$r has received data from rank 0\$" "$log") == 1 ]] || { cat "$log"; mh_fail "no receive line on rank $r"; }
done
mh_log "message_passing ok ($((SECONDS - t0)) s)"

t0=$SECONDS
mh_mpirun 1 -np 3 --map-by node -x RD_COLLECTIVE_TIMEOUT_S=60 "$RD_MH_COLLECTIVE_TEST" --use-colour no >"$log" 2>&1 ||
  { cat "$log"; mh_fail "collective_test over 3 hosts"; }
[[ $(grep -Ec '^All tests passed \([0-9]+ assertions in [0-9]+ test cases\)' "$log") == 3 ]] ||
  { cat "$log"; mh_fail "collective_test: not all 3 ranks passed"; }
mh_log "collective_test ok ($((SECONDS - t0)) s): $(grep -E 'All tests passed' "$log" | head -n 1)"

t0=$SECONDS
mh_mpirun 1 -np 3 --map-by node -x RD_COLLECTIVE_TIMEOUT_S=120 "$RD_MH_DDP_TEST" --use-colour no >"$log" 2>&1 ||
  { cat "$log"; mh_fail "ddp_equivalence_test over 3 hosts"; }
[[ $(grep -Ec '^All tests passed \([0-9]+ assertions in [0-9]+ test cases\)' "$log") == 3 ]] ||
  { cat "$log"; mh_fail "ddp_equivalence_test: not all 3 ranks passed"; }
mh_log "ddp_equivalence_test ok ($((SECONDS - t0)) s): $(grep -E 'All tests passed' "$log" | head -n 1)"
mh_log "PASS: MPI across 3 namespace hosts over TCP"
