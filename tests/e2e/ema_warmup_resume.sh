#!/usr/bin/env bash
# torchvision's recipe pieces end to end on 2 ranks: a linear LR warmup into
# CosineAnnealingLR(eta_min) and --model-ema. 3 epochs straight, and the same run
# preempted after epoch 1 and resumed, print the same LRs, metrics and "Test: EMA"
# results and write bit-identical weights, /model_ema and optimizer state
# (--deterministic on the CPU backend).
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 96 32
# Upscaled inputs make steps slow enough for the signal to land before the run ends.
common=(--data "$WORK/data" --arch resnet_tiny --image-size 96 --threads 1 --workers 1 --batch-size 4
        --optimizer sgd --lr 0.05 --seed 3 --deterministic --epochs 3 --progress lines --log-every 1
        --lr-scheduler cosineannealinglr --lr-warmup-epochs 2 --lr-warmup-method linear --lr-warmup-decay 0.1
        --lr-min 1e-3 --model-ema --model-ema-steps 2 --model-ema-decay 0.999)

note "3 epochs straight"
mpi 2 "${common[@]}" --output-dir "$WORK/a" >"$WORK/a.log" 2>&1 || { cat "$WORK/a.log"; fail "run a"; }
grep -q -E '^\(Epoch 1/3\) Test: EMA Acc@1 ' "$WORK/a.log" || { cat "$WORK/a.log"; fail "no 'Test: EMA' line"; }
note "preempted after epoch 1, then resumed"
mpi 2 "${common[@]}" --output-dir "$WORK/b" >"$WORK/b1.log" 2>&1 &
preempt $! "$WORK/b1.log" "(Epoch 1/3) Test: EMA" 1 TERM
grep -q '^Preempted at epoch' "$WORK/b1.log" || { cat "$WORK/b1.log"; fail "run b1 was not preempted"; }
mpi 2 "${common[@]}" --output-dir "$WORK/b" >"$WORK/b2.log" 2>&1 || { cat "$WORK/b2.log"; fail "run b2"; }
grep -q -F "Resuming from $WORK/b/last.h5" "$WORK/b2.log" || { cat "$WORK/b2.log"; fail "run b2 did not resume"; }

# Every epoch's results and the EMA's, from the run that finished that epoch.
finished() { grep -E "^\\(Epoch $1/3\\) (Average train|Val loss|Current best|Test: EMA)" "$2"; }
for e in 1 2 3; do
  src="$WORK/b2.log"
  grep -q -E "^\\(Epoch $e/3\\) Test: EMA" "$WORK/b1.log" && src="$WORK/b1.log"
  diff <(finished $e "$WORK/a.log") <(finished $e "$src") || fail "epoch $e results differ after the resume"
done
grep -c -E '^\(Epoch [0-9]/3\) Test: EMA Acc@1 ' "$WORK/a.log" | grep -q '^3$' || fail "expected 3 EMA evaluations"

if command -v h5diff >/dev/null; then
  for group in /state_dict /model_ema /optimizer/momentum_buffer; do
    h5diff "$WORK/a/last.h5" "$WORK/b/last.h5" "$group" "$group" >"$WORK/diff" ||
      { head -n 20 "$WORK/diff"; fail "$group differs"; }
  done
  for attr in n_averaged num_batches_tracked; do
    [ "$(h5dump -a /model_ema/$attr "$WORK/a/last.h5" | grep -A1 DATA)" = \
      "$(h5dump -a /model_ema/$attr "$WORK/b/last.h5" | grep -A1 DATA)" ] || fail "/model_ema $attr differs"
  done
fi

note "--eval-only --model-ema: the checkpoint's model and its average (the reference's --test-only)"
evalargs=(--data "$WORK/data" --arch resnet_tiny --image-size 96 --threads 1 --workers 1 --batch-size 4 --eval-only)
mpi 2 "${evalargs[@]}" --resume auto --model-ema --output-dir "$WORK/a" >"$WORK/eval.log" 2>&1 ||
  { cat "$WORK/eval.log"; fail "--eval-only --model-ema"; }
cat "$WORK/eval.log"
# last.h5 holds epoch 3's weights and average: the same results as epoch 3 printed.
for what in "Val loss" "Test:  Acc@1" "Test: EMA Acc@1"; do
  want=$(grep -E "^\(Epoch 3/3\) $what|^$what" "$WORK/a.log" | sed 's/^(Epoch 3\/3) //')
  [ -n "$want" ] && grep -q -x -F "$want" "$WORK/eval.log" || fail "--eval-only does not print epoch 3's '$want'"
done
note "--eval-only --model-ema without an average to evaluate: refused, the flag named"
mpi 1 "${evalargs[@]}" --init "$WORK/a/best_model.h5" --model-ema --output-dir "$WORK/c" >"$WORK/init.log" 2>&1 && fail "--init with --model-ema --eval-only was accepted"
grep -q -F -- "--model-ema --eval-only: evaluates a checkpoint's weight EMA, and --init $WORK/a/best_model.h5 holds weights only" \
  "$WORK/init.log" || { cat "$WORK/init.log"; fail "the --init refusal"; }
mpi 1 --data "$WORK/data" --arch resnet_tiny --image-size 96 --threads 1 --workers 1 --batch-size 4 --epochs 1 \
  --max-steps 1 --output-dir "$WORK/d" >"$WORK/d.log" 2>&1 || { cat "$WORK/d.log"; fail "a run without EMA"; }
mpi 1 "${evalargs[@]}" --resume auto --model-ema --output-dir "$WORK/d" >"$WORK/noema.log" 2>&1 && fail "a checkpoint without EMA was accepted"
grep -q -F -- "--model-ema --eval-only: $WORK/d/last.h5 holds no weight EMA" "$WORK/noema.log" ||
  { cat "$WORK/noema.log"; fail "the no-EMA refusal"; }

cat "$WORK/a.log" "$WORK/b1.log" "$WORK/b2.log" | grep -v -E "step [0-9]+/"
note "ok: the resumed run continues the same schedule and average"
