#!/usr/bin/env bash
# TensorBoard scalars: a 2-rank run preempted mid-epoch, then resumed with one more
# epoch. TensorBoard's own reader (the `tensorboard` package, in the venv of
# tools/py_venv.sh) must find one event file per run and none from rank 1, every
# global step exactly once across the two files, the per-epoch values equal to
# metrics.csv and the per-step values consistent with them (tensorboard_check.py).
# --tensorboard off writes no file. Skips (77) only when the venv cannot be made.
source "$(dirname "$0")/common.sh"

PY=$("$RD_ROOT/tools/py_venv.sh") || {
  echo "SKIP: cannot create the Python venv with the tensorboard package (tools/py_venv.sh failed, see above)" >&2
  exit 77
}

synth_data "$WORK/data" 64 16
OUT="$WORK/out"
# 64 images / (2 ranks x batch 2) = 16 equal steps per epoch. Upscaled inputs make a
# step slow enough (tens of ms) for the signal to land mid-epoch.
args=(--data "$WORK/data" --arch resnet_tiny --image-size 96 --threads 1 --workers 1 --batch-size 2
  --lr 1e-3 --output-dir "$OUT" --log-every 1 --progress lines)

events() { find "$1" -maxdepth 1 -name 'events.out.tfevents.*' | wc -l; }

note "run 1: 2 ranks, SIGTERM to rank 0 after a few steps"
mpi 2 "${args[@]}" --epochs 2 >"$WORK/run1.log" 2>&1 &
preempt $! "$WORK/run1.log" "(Epoch 1/2) step 3/" 0 TERM
line=$(grep -E '^Preempted at epoch [0-9]+ step [0-9]+;' "$WORK/run1.log") || { cat "$WORK/run1.log"; fail "not preempted"; }
"$RD_BIN" info "$OUT/last.h5" >"$WORK/info"
gstep=$(sed -n 's/^ *global step: *\([0-9]*\).*/\1/p' "$WORK/info")
[ -n "$gstep" ] && [ "$gstep" -ge 3 ] || { cat "$WORK/info"; fail "no global step in last.h5 ($line)"; }
[ "$(events "$OUT")" = 1 ] || { ls -l "$OUT"; fail "expected one event file (rank 0 only) after run 1"; }

note "run 2: resume at global step $gstep, 3 epochs"
sleep 1  # a new second: the second file's name sorts after the first
mpi 2 "${args[@]}" --epochs 3 --resume auto >"$WORK/run2.log" 2>&1 || { cat "$WORK/run2.log"; fail "resumed run failed"; }
grep -q '^(Epoch 3/3) Current best val acc' "$WORK/run2.log" || { cat "$WORK/run2.log"; fail "resumed run did not finish"; }
[ "$(events "$OUT")" = 2 ] || { ls -l "$OUT"; fail "expected a second event file for the resumed run"; }
! grep -q 'warning: --tensorboard' "$WORK/run1.log" "$WORK/run2.log" || fail "event file warnings"
[ "$(tail -n 1 "$OUT/metrics.csv" | cut -d, -f17)" = 48 ] || { cat "$OUT/metrics.csv"; fail "expected 48 global steps"; }

note "reading $OUT with the tensorboard package"
# The epochs run 2 ran whole (2 and 3, or only 3 when a loaded machine let the signal
# land in epoch 2): there metrics.csv's timings are exactly the step scalars'.
whole=2,3
[ "$gstep" -lt 16 ] || whole=3
RD_TB_WHOLE_EPOCHS=$whole "$PY" "$RD_ROOT/tests/e2e/tensorboard_check.py" "$OUT" "1,$((gstep + 1))" ||
  fail "event files do not match metrics.csv"

note "a run killed after its events were written but before its checkpoint: TensorBoard shows those steps once"
# Run A writes epoch 1 (steps 1-16) and last.h5; run B resumes and writes epoch 2 (17-32).
# Putting A's checkpoint back stands for a crash that lost B's checkpoint but not its
# events: run C resumes at step 17 again, and its SessionLog START at 17 must make
# TensorBoard drop B's steps 17-32 (metrics.csv drops B's epoch-2 row the same way).
KO="$WORK/killed"
ko=(--data "$WORK/data" --arch resnet_tiny --image-size 32 --threads 1 --workers 1 --batch-size 4 --lr 1e-3
  --output-dir "$KO" --log-every 1)
"$RD_BIN" "${ko[@]}" --epochs 1 >"$WORK/ko_a.log" 2>&1 || { cat "$WORK/ko_a.log"; fail "run A failed"; }
cp "$KO/last.h5" "$WORK/epoch1.h5"
sleep 1
"$RD_BIN" "${ko[@]}" --epochs 2 --resume auto >"$WORK/ko_b.log" 2>&1 || { cat "$WORK/ko_b.log"; fail "run B failed"; }
cp "$WORK/epoch1.h5" "$KO/last.h5"
sleep 1
"$RD_BIN" "${ko[@]}" --epochs 2 --resume auto >"$WORK/ko_c.log" 2>&1 || { cat "$WORK/ko_c.log"; fail "run C failed"; }
grep -q -x -F "Resuming from $KO/last.h5 at epoch 2" "$WORK/ko_c.log" || { cat "$WORK/ko_c.log"; fail "run C did not resume at epoch 2"; }
[ "$(events "$KO")" = 3 ] || { ls -l "$KO"; fail "expected three event files"; }
RD_TB_WHOLE_EPOCHS=1,2 "$PY" "$RD_ROOT/tests/e2e/tensorboard_check.py" "$KO" "1,17,17" ||
  fail "TensorBoard shows the orphaned steps of run B (or the files do not match metrics.csv)"

note "--tensorboard off: no event file"
mpi 1 "${args[@]}" --epochs 1 --max-steps 2 --tensorboard off --output-dir "$WORK/off" >"$WORK/off.log" 2>&1 ||
  { cat "$WORK/off.log"; fail "run with --tensorboard off failed"; }
[ -f "$WORK/off/metrics.csv" ] || fail "the --tensorboard off run wrote no metrics.csv"
[ "$(events "$WORK/off")" = 0 ] || fail "--tensorboard off wrote an event file"
note "ok"
