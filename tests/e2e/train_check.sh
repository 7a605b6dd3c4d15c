#!/usr/bin/env bash
# `resnet_ddp train --check`: a dry run that validates flags, config file, paths, the
# output folder (creating nothing), device, the checkpoint a resume would read, the
# dataset's headers and the launcher environment, then exits 0 without training, or 2
# naming the problem. The job scripts' login-node pre-flight calls it, so a typo there
# fails in seconds instead of after the queue wait.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 12 6
args=(--data "$WORK/data" --arch resnet_tiny --image-size 32 --threads 1 --workers 1 --batch-size 4 --log-every 0)

# expect_rc WANT LOG CMD...
expect_rc() {
  local want=$1 log=$2 rc=0
  shift 2
  "$@" >"$log" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || { cat "$log"; fail "$(basename "$log"): exit $rc, expected $want"; }
}
# refused PATTERN CMD...: exit 2 and the message names the problem.
refused() {
  local pattern=$1
  shift
  expect_rc 2 "$WORK/r.log" "$@"
  grep -q -F -- "$pattern" "$WORK/r.log" || { cat "$WORK/r.log"; fail "the error does not say: $pattern"; }
}

note "a valid command: exit 0, every part reported, nothing created"
expect_rc 0 "$WORK/ok.log" "$RD_BIN" train --check "${args[@]}" --output-dir "$WORK/new/out"
cat "$WORK/ok.log"
for part in "check: flags:" "check: output:    '$WORK/new/out' will be created" "check: device:    cpu" \
  "check: resume:    none: a fresh start" "check: data:      12 training + 6 validation images in 3 classes" \
  "check: launcher:" "check: result:    ready; nothing was trained"; do
  grep -q -F -- "$part" "$WORK/ok.log" || fail "missing: $part"
done
[ ! -e "$WORK/new" ] || fail "--check created the output folder"

note "bad flags, config file, paths: exit 2 naming them"
refused "unknown flag '--epcohs'" "$RD_BIN" --check "${args[@]}" --epcohs 1
refused "--config $WORK/nothere.conf: cannot open" "$RD_BIN" --check "${args[@]}" --config "$WORK/nothere.conf"
refused "--data: no such file or directory: '$WORK/nodata'" "$RD_BIN" --check --data "$WORK/nodata" --arch resnet_tiny
touch "$WORK/afile"
refused "--output-dir: '$WORK/afile' is not a directory" "$RD_BIN" --check "${args[@]}" --output-dir "$WORK/afile"
refused "--eval-only: no checkpoint found" "$RD_BIN" --check "${args[@]}" --output-dir "$WORK/none" --eval-only

note "the dataset's headers are read"
mkdir -p "$WORK/bad"
cp -r "$WORK/data/Train" "$WORK/bad/"
cp -r "$WORK/data/Validation" "$WORK/bad/"
mkdir "$WORK/bad/Validation/Extra"
refused "class folders differ" "$RD_BIN" --check "${args[@]/$WORK\/data/$WORK/bad}" --output-dir "$WORK/o"
rmdir "$WORK/bad/Validation/Extra"
printf 'not an image' >"$WORK/bad/Train/C0/zz.png"
refused "zz.png" "$RD_BIN" --check "${args[@]/$WORK\/data/$WORK/bad}" --output-dir "$WORK/o" --strict-data

note "device and launcher environment"
# Only a program without the CUDA backend fails here: a login node has no GPU, and the
# run checks its nodes' GPUs at start.
if ! "$RD_BIN" --check "${args[@]}" --output-dir "$WORK/o" --device cuda >"$WORK/cuda.log" 2>&1; then
  grep -q -F -- "--device cuda: this resnet_ddp was built without the CUDA backend" "$WORK/cuda.log" ||
    { cat "$WORK/cuda.log"; fail "--device cuda"; }
fi
refused "WORLD_SIZE=2 (torchrun or a similar launcher)" env WORLD_SIZE=2 "$RD_BIN" --check "${args[@]}" --output-dir "$WORK/o"

note "a checkpoint: the same command continues it, another experiment is refused"
OUT="$WORK/out"
"$RD_BIN" "${args[@]}" --epochs 1 --output-dir "$OUT" >"$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; fail "training"; }
expect_rc 0 "$WORK/same.log" "$RD_BIN" --check "${args[@]}" --epochs 1 --output-dir "$OUT"
grep -q -F "check: resume:    continues $OUT/last.h5 (1 epoch(s) done of --epochs 1)" "$WORK/same.log" ||
  { cat "$WORK/same.log"; fail "the resume is not reported"; }
refused "  --lr 0.01 (that run: 0.0001)" "$RD_BIN" --check "${args[@]}" --epochs 1 --lr 1e-2 --output-dir "$OUT"
refused "--arch resnet18: checkpoint '$OUT/last.h5' does not match" "$RD_BIN" --check "${args[@]}" --arch resnet18 \
  --output-dir "$OUT" --resume auto
expect_rc 0 "$WORK/auto.log" "$RD_BIN" --check "${args[@]}" --epochs 2 --output-dir "$OUT" --resume auto
grep -q -x -F "check: resume:    Resume: --epochs 2 instead of the checkpoint's 1" "$WORK/auto.log" ||
  { cat "$WORK/auto.log"; fail "the change is not listed"; }
[ "$(wc -l <"$OUT/metrics.csv")" = 2 ] || fail "--check trained"

note "the job scripts' login-node pre-flight calls it"
export RESNET_DDP_BIN=$RD_BIN RESNET_DDP_DATA_SRC=$WORK/data RESNET_DDP_LAUNCHER="$RD_MPIEXEC -np 2"
(cd "$WORK" && env -u SLURM_JOB_ID bash "$RD_ROOT/jobs/cpu.slurm" --epcohs 1 --arch resnet_tiny >"$WORK/pf.log" 2>&1) &&
  { cat "$WORK/pf.log"; fail "pre-flight passed a misspelt flag"; }
cat "$WORK/pf.log"
grep -q -F "unknown flag '--epcohs'" "$WORK/pf.log" || fail "pre-flight: the typo is not named"
! grep -q "set-up looks complete" "$WORK/pf.log" || fail "pre-flight says complete"
(cd "$WORK" && env -u SLURM_JOB_ID bash "$RD_ROOT/jobs/cpu.slurm" --arch resnet_tiny --image-size 32 >"$WORK/pf2.log" 2>&1) ||
  { cat "$WORK/pf2.log"; fail "pre-flight of a valid command failed"; }
grep -q "check: result:    ready" "$WORK/pf2.log" && grep -q "set-up looks complete" "$WORK/pf2.log" ||
  { cat "$WORK/pf2.log"; fail "pre-flight did not run the check"; }
[ ! -e "$WORK/output_model" ] || fail "pre-flight created an output folder"

note "a GPU job script asks for --device cuda; its pre-flight says whether the program has CUDA"
rc=0
(cd "$WORK" && env -u SLURM_JOB_ID RESNET_DDP_MODULES= bash "$RD_ROOT/jobs/frontera_rtx.slurm" --arch resnet_tiny \
  --image-size 32 >"$WORK/pf3.log" 2>&1) || rc=$?
cat "$WORK/pf3.log"
grep -q -E "program backends: cpu, cuda \((built|not built)\)" "$WORK/pf3.log" || fail "pre-flight does not name the backends"
grep -q -- "--device cuda" "$WORK/pf3.log" || fail "the GPU job's command does not ask for --device cuda"
if grep -q "cuda (not built)" "$WORK/pf3.log"; then
  [ "$rc" != 0 ] || fail "pre-flight of a GPU job passed with a program built without CUDA"
  grep -q "built without the CUDA backend" "$WORK/pf3.log" || fail "pre-flight does not say the backend is missing"
else
  [ "$rc" = 0 ] || fail "pre-flight of a GPU job failed on a login node without a GPU"
  grep -q "check: device:    cuda (backend built; no GPU visible on this node" "$WORK/pf3.log" ||
    fail "pre-flight does not say the GPUs are checked at start"
fi
note "ok"
