#!/usr/bin/env bash
# No silent CPU fallback (review ecosystem D2): `--device cuda` without a usable GPU
# stops at start (exit 2) saying why and, in a build without the CUDA backend, how to
# build it; `--device auto` without a GPU trains on the CPU but says so in one short
# WARNING line on stderr (saying --device cpu silences it); `--version` says whether the
# CUDA backend is built (the job scripts' pre-flight reads it). Runs in every build:
# CUDA-enabled ones (no GPU here) and the CPU-only sanitizer build.
source "$(dirname "$0")/common.sh"

"$RD_BIN" --version >"$WORK/version" || fail "--version failed"
grep -q -E '^backends: cpu, cuda \((built|not built)\)$' "$WORK/version" || { cat "$WORK/version"; fail "--version backends line"; }
built=1
grep -q "cuda (not built)" "$WORK/version" && built=0

synth_data "$WORK/data" 8 4
args=(--data "$WORK/data" "${TINY[@]}" --batch-size 4 --epochs 1 --max-steps 1)

note "--device cuda with no usable GPU"
rc=0
CUDA_VISIBLE_DEVICES= mpi 2 "${args[@]}" --device cuda --output-dir "$WORK/a" >"$WORK/cuda.log" 2>&1 || rc=$?
cat "$WORK/cuda.log"
[ "$rc" = 2 ] || fail "--device cuda without a GPU exited $rc, expected 2"
grep -q "resnet_ddp: error: --device cuda on node " "$WORK/cuda.log" || fail "no error naming --device cuda and the node"
if [ "$built" = 0 ]; then
  grep -q "built without the CUDA backend" "$WORK/cuda.log" || fail "the error does not say the backend is not built"
  grep -q "make clean && make CUDA=ON" "$WORK/cuda.log" || fail "the error does not say how to build it"
else
  grep -q "no CUDA device visible" "$WORK/cuda.log" || fail "the error does not say no device is visible"
fi
! grep -q "Train set size" "$WORK/cuda.log" || fail "it went on to train"

note "--device auto with no usable GPU: trains on the CPU, one WARNING line"
CUDA_VISIBLE_DEVICES= mpi 2 "${args[@]}" --device auto --output-dir "$WORK/b" >"$WORK/auto.out" 2>"$WORK/auto.err" ||
  { cat "$WORK/auto.out" "$WORK/auto.err"; fail "--device auto failed"; }
cat "$WORK/auto.err"
[ "$(grep -c 'WARNING: --device auto: training on the CPU backend, not a GPU (2 of 2 ranks' "$WORK/auto.err")" = 1 ] ||
  fail "not exactly one WARNING line for both ranks"
line=$(grep 'WARNING: --device auto' "$WORK/auto.err")
echo "${#line} characters"
[ "${#line}" -le 240 ] || fail "the WARNING line is ${#line} characters; one short line expected"
grep -q -- "; --device cpu silences this$" <<<"$line" || fail "the WARNING does not say how to silence it"
grep -q "device cpu" "$WORK/auto.out" || fail "the start-up lines do not say cpu"
echo "PASS"
