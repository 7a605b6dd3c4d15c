#!/usr/bin/env bash
# `make test` prints its time per stage at the end, with CI unset and when a stage fails:
# the Makefile's own recipe runs with $(MAKE) standing in for the stages' commands (true
# or false) and BUILD_DIR a scratch folder whose ctest runs one trivial test.
set -euo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
scratch=$(mktemp -d "${TMPDIR:-/tmp}/rd_stage_report.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/build"
echo 'add_test(trivial "true")' >"$scratch/build/CTestTestfile.cmake"

# run_make STAND_IN: make test with every stage's $(MAKE) replaced by STAND_IN; its output in
# $scratch/out, its exit status echoed.
run_make() {
  local rc=0
  # CI and SANITIZE empty on the command line (an outer `make test CI=1` passes its
  # variables down through MAKEFLAGS, which is dropped too).
  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -C "$RD_SOURCE_DIR" test MAKE="$1" \
    BUILD_DIR="$scratch/build" CI= SANITIZE= >"$scratch/out" 2>&1 || rc=$?
  cat "$scratch/out"
  echo "-- exit $rc"
  return 0
}

echo "== every stage passes (CI unset)"
out=$(run_make true)
echo "$out"
[[ $out == *"-- exit 0" ]] || fail "make test exited non-zero with every stage passing"
for stage in deps build ctest total; do
  grep -qE "^  $stage +[0-9]+ s " <<<"$out" || fail "no '$stage' row in the stage table"
done
! grep -q "sanitizer\|fuzz" <<<"$out" || fail "CI unset, yet a sanitizer or fuzz stage ran"

echo "== the first stage fails"
out=$(run_make false)
echo "$out"
[[ $out != *"-- exit 0" ]] || fail "make test exited 0 with a failed stage"
grep -qE "^  deps +[0-9]+ s .*\(failed, rc 1\)" <<<"$out" || fail "the failed stage is not marked in the table"
grep -qE "^  total +[0-9]+ s " <<<"$out" || fail "no total row after a failed stage"
! grep -qE "^  build " <<<"$out" || fail "a stage ran after the failed one"
echo "ok: the stage table is printed with CI unset and after a failed stage"
