#!/usr/bin/env bash
# tools/gpu_check.sh --dry-run on a machine without a GPU: the plan prints, each
# plan's timeouts add up to less than 9 minutes, and the script passes shellcheck.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$("$repo/tools/gpu_check.sh" --dry-run)
echo "$out"
totals=$(echo "$out" | awk '$1 == "total" { sub("s", "", $2); print $2 }')
[[ $(echo "$totals" | wc -l) == 2 ]] || { echo "FAIL: expected two plan totals"; exit 1; }
for t in $totals; do
  ((t < 540)) || { echo "FAIL: a plan's timeouts add up to ${t}s (limit 540s)"; exit 1; }
done
if command -v shellcheck >/dev/null 2>&1; then
  shellcheck --severity=warning "$repo/tools/gpu_check.sh" && echo "shellcheck: no warnings"
fi
