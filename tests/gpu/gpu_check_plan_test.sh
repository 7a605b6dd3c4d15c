#!/usr/bin/env bash
# tools/gpu_check.sh --dry-run on a machine without a GPU: the plan prints, each
# plan's timeouts add up to less than 9 minutes, the device call it prints is the one
# for its copy (standalone from the repository, the bundle's from inside a bundle),
# and the script passes shellcheck.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }
out=$("$repo/tools/gpu_check.sh" --dry-run)
echo "$out"
totals=$(echo "$out" | awk '$1 == "total" { sub("s", "", $2); print $2 }')
[[ $(echo "$totals" | wc -l) == 2 ]] || fail "expected two plan totals"
for t in $totals; do
  ((t < 540)) || fail "a plan's timeouts add up to ${t}s (limit 540s)"
done
grep -q 'This copy would use the standalone plan' <<<"$out" || fail "the repository copy should use the standalone plan"
grep -qF 'ONE shot: run(command="tools/gpu_check.sh --out $OUT", carry=[".gpu_deps"], timeout_s=570)' <<<"$out" ||
  fail "the standalone device call is not printed"
grep -q 'hard deadline' <<<"$out" || fail "the deadline is not stated"

# Inside a bundle (the layout tools/gpu_bundle.sh writes, in a checkout's bundle/gpu):
# the bundle plan and the bundle's call, not the standalone one (a bundle's host
# may have no compiler).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git init -q "$tmp"
mkdir -p "$tmp/bundle/gpu/tools"
cp "$repo/tools/gpu_check.sh" "$tmp/bundle/gpu/tools/"
touch "$tmp/bundle/gpu/payload.tar.xz"
printf '#!/bin/sh\nexit 0\n' > "$tmp/bundle/gpu/run"
chmod +x "$tmp/bundle/gpu/run"
bout=$("$tmp/bundle/gpu/tools/gpu_check.sh" --dry-run)
grep -q 'This copy would use the bundle plan' <<<"$bout" || fail "a bundle's copy should use the bundle plan"
grep -qF 'ONE shot: run(command="bundle/gpu/tools/gpu_check.sh --out $OUT", carry=["bundle/gpu"], timeout_s=570)' <<<"$bout" ||
  { echo "$bout" | tail -3; fail "the bundle's dry run does not print the bundle call"; }
echo "bundle dry run: $(grep 'ONE shot' <<<"$bout")"

if command -v shellcheck >/dev/null 2>&1; then
  shellcheck --severity=warning "$repo/tools/gpu_check.sh" "$repo/tests/gpu/gpu_check_run_test.sh" &&
    echo "shellcheck: no warnings"
fi
