#!/usr/bin/env bash
# --eval-only (and --resume FILE) take arch, head, image size and normalisation from the
# checkpoint, so scoring a model needs only the file; an explicit conflicting flag is
# refused naming it (instead of a silently wrong number at the default 244 px).
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 32 12
OUT="$WORK/out"
"$RD_BIN" --data "$WORK/data" --arch resnet_tiny --head fc --image-size 32 --normalize imagenet --threads 1 \
  --conv-algo direct --workers 1 --batch-size 4 --epochs 1 --log-every 0 --output-dir "$OUT" >"$WORK/train.log" 2>&1 ||
  { cat "$WORK/train.log"; fail "training"; }
want=$(sed -n 's/^Best model (val loss: \([^,]*\), val accuracy: \([^)]*\)).*/Val loss: \1, Val accuracy: \2/p' "$WORK/train.log")
[ -n "$want" ] || { cat "$WORK/train.log"; fail "no final evaluation"; }

note "--eval-only --resume best_model.h5 with no model flags"
"$RD_BIN" --data "$WORK/data" --threads 1 --conv-algo direct --workers 1 --eval-only --resume "$OUT/best_model.h5" \
  >"$WORK/eval.log" 2>&1 || { cat "$WORK/eval.log"; fail "eval-only without model flags failed"; }
cat "$WORK/eval.log"
grep -q -x -F "Model settings from $OUT/best_model.h5: --arch resnet_tiny --head fc --image-size 32 --normalize imagenet" \
  "$WORK/eval.log" || fail "the model settings were not taken from the checkpoint"
grep -q -x -F "$want" "$WORK/eval.log" || fail "eval-only gave $(grep '^Val loss' "$WORK/eval.log"), training's final evaluation $want"

note "the same flags given explicitly agree"
"$RD_BIN" --data "$WORK/data" --arch resnet_tiny --head fc --image-size 32 --normalize imagenet --threads 1 \
  --conv-algo direct --workers 1 --eval-only --resume "$OUT/best_model.h5" >"$WORK/eval2.log" 2>&1 ||
  { cat "$WORK/eval2.log"; fail "eval-only with matching flags failed"; }
grep -q -x -F "$want" "$WORK/eval2.log" || fail "explicit flags: different result"
! grep -q '^Model settings' "$WORK/eval2.log" || fail "nothing was taken from the checkpoint, yet a line says so"

# conflict FLAG VALUE CHECKPOINT_VALUE
conflict() {
  local rc=0
  "$RD_BIN" --data "$WORK/data" --threads 1 --eval-only --resume "$OUT/best_model.h5" "$1" "$2" >"$WORK/c.log" 2>&1 || rc=$?
  cat "$WORK/c.log"
  [ "$rc" = 2 ] || fail "$1 $2: exit $rc, expected 2"
  grep -q -F -- "resnet_ddp: error: $1 $2: checkpoint '$OUT/best_model.h5' does not match this run: it was trained with $1 $3" "$WORK/c.log" ||
    fail "$1 $2: the error does not name the flag and the checkpoint's value"
}
note "explicit conflicting flags are errors"
conflict --image-size 244 32
conflict --arch resnet18 resnet_tiny
conflict --head mlp fc
conflict --normalize none imagenet
note "ok"
