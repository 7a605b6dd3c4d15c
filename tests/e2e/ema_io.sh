#!/usr/bin/env bash
# The weight EMA leaves the program: a ResNet-18 --model-ema run's
# last.h5 gives `export --ema` (the /model_ema tensors bit for bit, unlike `export`),
# `predict --ema` (equal to predict on the exported EMA file, different from the model's),
# `--init FILE --init-ema` from the .h5, from the exported file and from torchvision's
# (checkpoint["model_ema"], AveragedModel names) and timm's (state_dict_ema) .pth
# checkpoints, all evaluating alike. Refusals, each exit 2 naming the file: a checkpoint
# without an EMA for export/predict/--init-ema, --init-ema without --init. Also: a .pth
# --init without --normalize imagenet warns once (in the run and in --check).
# Needs Debian's python3 with torch, torchvision, h5py and numpy (exit 77 without).
source "$(dirname "$0")/common.sh"

torch_python torch torchvision h5py numpy
CHECK=("$PY" "$(dirname "$0")/check_ema_io.py")
MODEL=(--arch resnet18 --image-size 32 --threads 1 --workers 1 --log-every 0 --conv-algo direct)
synth_data "$WORK/data" 12 6
OUT=$WORK/out

note "a ResNet-18 run with --model-ema (3 steps, the EMA updated each step)"
"$RD_BIN" --data "$WORK/data" "${MODEL[@]}" --normalize imagenet --batch-size 4 --epochs 1 --augment none \
  --lr 0.01 --model-ema --model-ema-steps 1 --model-ema-decay 0.9 --output-dir "$OUT" >"$WORK/train.log" 2>&1 ||
  { cat "$WORK/train.log"; fail "training"; }
CKPT=$OUT/last.h5

note "export and export --ema"
"$RD_BIN" export --checkpoint "$CKPT" --out "$WORK/model.safetensors" >"$WORK/export.log" || fail "export"
"$RD_BIN" export --ema --checkpoint "$CKPT" --out "$WORK/ema.safetensors" >"$WORK/export_ema.log" || fail "export --ema"
cat "$WORK/export.log" "$WORK/export_ema.log"
grep -q "^Exported 124 tensors (resnet18, mlp head, 3 classes) from $CKPT (its weight EMA, /model_ema) to " \
  "$WORK/export_ema.log" || fail "export --ema does not say it wrote the EMA"
"${CHECK[@]}" exported "$CKPT" "$WORK/model.safetensors" "$WORK/ema.safetensors" || fail "exported tensors"

note "predict --ema: the EMA's probabilities (those of the exported EMA file), not the model's"
P=(--json --threads 1 --workers 1 "$WORK/data/Validation")
"$RD_BIN" predict --checkpoint "$CKPT" "${P[@]}" >"$WORK/pred_model.json" 2>/dev/null || fail "predict"
"$RD_BIN" predict --ema --checkpoint "$CKPT" "${P[@]}" >"$WORK/pred_ema.json" 2>"$WORK/pred_ema.err" ||
  { cat "$WORK/pred_ema.err"; fail "predict --ema"; }
grep -q "predict: weights: the weight EMA (/model_ema)" "$WORK/pred_ema.err" || fail "predict --ema does not say so"
grep -q '"weights": "model_ema"' "$WORK/pred_ema.json" || fail "predict --ema JSON lacks weights: model_ema"
"$RD_BIN" predict --checkpoint "$WORK/ema.safetensors" "${P[@]}" >"$WORK/pred_ema_st.json" 2>/dev/null ||
  fail "predict with the exported EMA"
probs() { grep -v '"checkpoint"\|"weights"' "$1"; }
diff <(probs "$WORK/pred_ema.json") <(probs "$WORK/pred_ema_st.json") ||
  fail "predict --ema differs from predict on the exported EMA"
! diff -q <(probs "$WORK/pred_model.json") <(probs "$WORK/pred_ema.json") >/dev/null ||
  fail "predict --ema gives the model's probabilities"

note "--init FILE --init-ema: .h5, the exported EMA, torchvision's and timm's .pth evaluate alike"
"${CHECK[@]}" pth "$WORK/model.safetensors" "$WORK/ema.safetensors" "$WORK" || fail "writing the .pth files"
E=(--data "$WORK/data" --eval-only "${MODEL[@]}" --normalize imagenet)
eval_loss() {  # eval_loss LOG ARGS...: the run's Val loss line
  local log=$1
  shift
  "$RD_BIN" "${E[@]}" "$@" >"$log" 2>&1 || { cat "$log" >&2; fail "--eval-only $*"; }
  grep '^Val loss' "$log"
}
want=$(eval_loss "$WORK/e_st.log" --init "$WORK/ema.safetensors")
model_loss=$(eval_loss "$WORK/e_model.log" --init "$CKPT")
for f in "$CKPT" "$WORK/torchvision.pth" "$WORK/timm.pth"; do
  got=$(eval_loss "$WORK/e.log" --init "$f" --init-ema)
  echo "$f --init-ema: $got"
  [ "$got" = "$want" ] || fail "--init $f --init-ema: '$got', the exported EMA gives '$want'"
done
[ "$model_loss" != "$want" ] || fail "the model and its EMA evaluate alike: the test proves nothing"
grep -q "^Initialised weights from $WORK/timm.pth (its weight EMA, checkpoint\['state_dict_ema'\])" "$WORK/e.log" ||
  { cat "$WORK/e.log"; fail "--init-ema does not name the .pth key it read"; }
"$RD_BIN" "${E[@]}" --init "$WORK/torchvision.pth" --init-ema --check >"$WORK/check.log" 2>&1 ||
  { cat "$WORK/check.log"; fail "--check --init-ema"; }
grep -q "^check: init: .*torchvision.pth (its weight EMA, checkpoint\['model_ema'\])" "$WORK/check.log" ||
  { cat "$WORK/check.log"; fail "--check does not say which EMA it reads"; }
got=$(eval_loss "$WORK/e.log" --init "$WORK/torchvision.pth")
[ "$got" = "$model_loss" ] || fail "--init torchvision.pth (no --init-ema) should read checkpoint['model']"

note "tools/h5_to_torch.py --ema: a plain state_dict of the EMA"
"$PY" "$RD_ROOT/tools/h5_to_torch.py" --ema "$CKPT" "$WORK/ema_plain.pth" >"$WORK/h5_to_torch.log" 2>&1 ||
  { cat "$WORK/h5_to_torch.log"; fail "h5_to_torch.py --ema"; }
grep -q "(the weight EMA, /model_ema)" "$WORK/h5_to_torch.log" || fail "h5_to_torch.py --ema does not say so"
got=$(eval_loss "$WORK/e.log" --init "$WORK/ema_plain.pth")
[ "$got" = "$want" ] || fail "h5_to_torch.py --ema's .pth: '$got', the exported EMA gives '$want'"
rc=0
"$PY" "$RD_ROOT/tools/h5_to_torch.py" --ema "$OUT/best_model.h5" "$WORK/none.pth" >"$WORK/h5_to_torch.log" 2>&1 || rc=$?
if [ "$rc" = 0 ] || ! grep -q "has no weight EMA (/model_ema)" "$WORK/h5_to_torch.log"; then
  cat "$WORK/h5_to_torch.log"
  fail "h5_to_torch.py --ema of best_model.h5 (exit $rc)"
fi

note "training starts from the EMA"
"$RD_BIN" --data "$WORK/data" "${MODEL[@]}" --normalize imagenet --batch-size 4 --epochs 1 --max-steps 1 \
  --augment none --init "$CKPT" --init-ema --output-dir "$WORK/out2" >"$WORK/train2.log" 2>&1 ||
  { cat "$WORK/train2.log"; fail "training from --init-ema"; }
grep -q "^Initialised weights from $CKPT (its weight EMA, /model_ema)" "$WORK/train2.log" || fail "init line"

note "refusals: no EMA in the file, --init-ema without --init"
expect_refusal() {  # expect_refusal WHAT PATTERN CMD...: exit 2 with PATTERN in the message
  local what=$1 pattern=$2 rc=0
  shift 2
  "$@" >"$WORK/refused.log" 2>&1 || rc=$?
  if [ "$rc" != 2 ] || ! grep -q -- "$pattern" "$WORK/refused.log"; then
    cat "$WORK/refused.log"
    fail "$what (exit $rc)"
  fi
  grep -- "error:" "$WORK/refused.log"
}
BEST=$OUT/best_model.h5
expect_refusal "export --ema of best_model.h5" "checkpoint '$BEST': has no weight EMA (/model_ema)" \
  "$RD_BIN" export --ema --checkpoint "$BEST" --out "$WORK/x.safetensors"
[ ! -e "$WORK/x.safetensors" ] || fail "export --ema wrote a file after refusing"
expect_refusal "predict --ema of a safetensors file" "checkpoint '$WORK/model.safetensors': a safetensors file holds" \
  "$RD_BIN" predict --ema --checkpoint "$WORK/model.safetensors" "${P[@]}"
expect_refusal "--init-ema of best_model.h5" "checkpoint '$BEST': has no weight EMA" \
  "$RD_BIN" "${E[@]}" --init "$BEST" --init-ema
expect_refusal "--init-ema of a .pth without an EMA" "PyTorch file '$WORK/plain.pth': holds no weight EMA.*'model', 'epoch'" \
  "$RD_BIN" "${E[@]}" --init "$WORK/plain.pth" --init-ema
expect_refusal "--init-ema without --init" "--init-ema: only with --init FILE" \
  "$RD_BIN" "${E[@]}" --init-ema --resume "$CKPT"

note ".pth --init without --normalize imagenet: one warning (run and --check); none with it"
NO_NORM=(--data "$WORK/data" "${MODEL[@]}" --batch-size 4 --epochs 1 --max-steps 1 --augment none
  --init "$WORK/timm.pth")
"$RD_BIN" "${NO_NORM[@]}" --output-dir "$WORK/out3" >"$WORK/nonorm.log" 2>&1 || { cat "$WORK/nonorm.log"; fail "run"; }
[ "$(grep -c "Warning: --init $WORK/timm.pth is PyTorch weights (torchvision's expect ImageNet normalisation)" \
  "$WORK/nonorm.log")" = 1 ] || { cat "$WORK/nonorm.log"; fail "not exactly one normalisation warning"; }
"$RD_BIN" "${NO_NORM[@]}" --output-dir "$WORK/out4" --check >"$WORK/nonorm_check.log" 2>&1 || fail "--check"
grep -q "^check: init: .*warning: --init .* add --normalize imagenet" "$WORK/nonorm_check.log" ||
  { cat "$WORK/nonorm_check.log"; fail "--check does not warn"; }
"$RD_BIN" "${NO_NORM[@]}" --normalize imagenet --output-dir "$WORK/out5" >"$WORK/norm.log" 2>&1 || fail "run"
! grep -q "ImageNet normalisation" "$WORK/norm.log" || fail "warned although --normalize imagenet was given"
echo "PASS"
