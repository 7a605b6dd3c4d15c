# shellcheck shell=bash
# Sourced by the emulated-device training tests: MPI as the tests run it (as root, shared
# memory without CMA), a scratch folder removed at exit, fail/note and the counters file.
#   source "$(dirname "$0")/common.sh" NAME   ->  $WORK = a new /tmp/rd_NAME.XXXXXX
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
export RD_PEER_TIMEOUT_S=${RD_PEER_TIMEOUT_S:-60}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rd_$1.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
note() { echo "--- $*"; }
# counter FILE NAME: the value of NAME in an RD_EMU_STATS file ("missing" when absent).
counter() { awk -v n="$2" '$1 == n { print $2; found = 1 } END { if (!found) print "missing" }' "$1"; }
