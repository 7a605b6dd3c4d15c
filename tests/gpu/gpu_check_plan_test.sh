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
[[ $(echo "$totals" | wc -l) == 3 ]] || fail "expected three plan totals"
for t in $totals; do
  ((t < 540)) || fail "a plan's timeouts add up to ${t}s (limit 540s)"
done
# --e2e: the trainer end to end in one command of at most 8 minutes, every part of it planned.
e2e_total=$(echo "$out" | awk '/^e2e plan/ { e = 1 } e && $1 == "total" { sub("s", "", $2); print $2; exit }')
[[ -n $e2e_total ]] || fail "the dry run does not print the e2e plan"
((e2e_total <= 470)) || fail "the e2e plan's timeouts add up to ${e2e_total}s (8 minutes less the kill-after: 470s)"
for part in placement fp32_default fp32_placed fp16_eager fp16_placed nsys conv_nhwc conv_nchw torch_fp32 torch_fp16; do
  echo "$out" | awk '/^e2e plan/ { e = 1 } e' | grep -q "^  $part " || fail "the e2e plan has no step $part"
done
grep -qF 'tools/gpu_check.sh --e2e --out OUT_DIR' <<<"$out" || fail "the --e2e command is not printed"
if grep -qiE 'give_back|lease|session|run\(command' <<<"$out"; then
  fail "the dry run speaks of the machinery that lends GPUs, not of the software"
fi
# GPU ranks start with their own cores (the corrected binding), never mpirun's default of
# one core for <= 2 ranks; only --e2e's *_default runs keep it on purpose, for comparison.
if grep -nE 'mpirun -np "\$NP" (resnet_ddp|message_passing)' "$repo/tools/gpu_check.sh"; then
  fail "a GPU run above starts under mpirun's default binding"
fi
grep -q 'mpirun -np "$NP" "${PLACED\[@\]}" resnet_ddp' "$repo/tools/gpu_check.sh" ||
  fail "the bundle plan's trainer runs do not use the corrected binding"
e2e_err=$("$repo/tools/gpu_check.sh" --e2e --out "$(mktemp -d)" 2>&1) && fail "--e2e without a bundle ran"
grep -q -- "--e2e runs resnet_ddp under mpirun: use a bundle" <<<"$e2e_err" || fail "--e2e without a bundle: $e2e_err"
grep -q 'This copy would use the standalone plan' <<<"$out" || fail "the repository copy should use the standalone plan"
grep -qF 'one command: tools/gpu_check.sh --out OUT_DIR   (needs: .gpu_deps; allow 570 s)' <<<"$out" ||
  fail "the standalone command is not printed"
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
grep -qF 'one command: bundle/gpu/tools/gpu_check.sh --out OUT_DIR   (needs: bundle/gpu; allow 570 s)' <<<"$bout" ||
  { echo "$bout" | tail -3; fail "the bundle's dry run does not print the bundle command"; }
grep -qF 'bundle/gpu/tools/gpu_check.sh --e2e --out OUT_DIR' <<<"$bout" || fail "the bundle's --e2e command is not printed"
echo "bundle dry run: $(grep 'one command' <<<"$bout")"

if command -v shellcheck >/dev/null 2>&1; then
  shellcheck --severity=warning "$repo/tools/gpu_check.sh" "$repo/tests/gpu/gpu_check_run_test.sh" &&
    echo "shellcheck: no warnings"
fi
