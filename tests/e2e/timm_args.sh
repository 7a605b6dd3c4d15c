#!/usr/bin/env bash
# A timm args.yaml (tests/train/timm_args.yaml, written by hand in timm's format) trains
# as it is: the mapped keys become flags (recorded in the checkpoint), the
# keys that change nothing here are listed once, and a switch the file turns on can be
# turned off on the command line (--no-ra-sampler: RASampler needs 256 images).
# tests/e2e/timm_args_real.sh does the same with a file timm's own train.py writes.
source "$(dirname "$0")/common.sh"

DATA="$WORK/data"
"$RD_BIN" synth --out "$DATA" --train 8 --val 4 --size 32x32 --format png --threads 1 \
  --train-split train --val-split validation >/dev/null
note "the hand-written args.yaml, with a small model"
"$RD_BIN" --data "$DATA" --config "$RD_ROOT/tests/train/timm_args.yaml" --arch resnet_tiny --threads 1 \
  --no-ra-sampler --max-steps 1 --output-dir "$WORK/out" >"$WORK/log" 2>&1 ||
  { cat "$WORK/log"; fail "the args.yaml did not train"; }
grep -q "timm_args.yaml: ignored, as they do not change training here: amp_dtype, channels_last, checkpoint_hist" \
  "$WORK/log" || { cat "$WORK/log"; fail "the ignored keys are not listed"; }
"$RD_BIN" info "$WORK/out/last.h5" >"$WORK/info"
for want in "--optimizer adamw" "--lr 0.002" "--epochs 4" "--lr-warmup-decay 0.1" "--clip-grad-norm 1.0" \
  "--auto-augment ra" "--ra-magnitude 9" "--val-resize-size 36" "--no-sync-bn" "--no-ra-sampler" "epoch:           4"; do
  grep -q -F -- "$want" "$WORK/info" || { cat "$WORK/info"; fail "the checkpoint lacks '$want'"; }
done

note "what cannot be honoured is refused, every key at once"
sed -e 's/^lr: 0.002$/lr: null/' -e 's/^lr_base: 0.1$/lr_base: null/' -e 's/^drop_path: null$/drop_path: 0.1/' -e 's/^remode: const$/remode: pixel/' \
  "$RD_ROOT/tests/train/timm_args.yaml" >"$WORK/bad.yaml"
rc=0
"$RD_BIN" --data "$DATA" --config "$WORK/bad.yaml" --check >"$WORK/log" 2>&1 || rc=$?
[ "$rc" = 2 ] || { cat "$WORK/log"; fail "exit $rc, expected 2"; }
for want in "bad.yaml:33: drop_path: 0.1" "bad.yaml:45: lr: null" "bad.yaml:75: remode: pixel" "3 problems"; do
  grep -q -F -- "$want" "$WORK/log" || { cat "$WORK/log"; fail "the error does not name '$want'"; }
done
echo "PASS"
