#!/usr/bin/env bash
# Every job script and helper parses (bash -n) and passes shellcheck without findings.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
files=(jobs/*.slurm jobs/*.sh tests/slurm/*.sh tests/multihost/*.sh tools/multihost_bandwidth.sh)
for f in "${files[@]}"; do
  bash -n "$f" || { echo "FAIL: bash -n $f"; exit 1; }
done
echo "bash -n: ${#files[@]} files parse"
if ! command -v shellcheck >/dev/null 2>&1; then
  echo "SKIP: shellcheck is not installed (Debian package shellcheck); bash -n passed"
  exit 77
fi
# -x follows `source` lines (paths relative to the repository root); info-level notes
# (e.g. a dynamically built path) are not findings, warnings and style issues are.
shellcheck -x --severity=style "${files[@]}"
echo "shellcheck $(shellcheck --version | sed -n 's/^version: //p'): no findings in ${#files[@]} files"
