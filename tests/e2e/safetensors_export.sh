#!/usr/bin/env bash
# `resnet_ddp export` as a PyTorch user meets it: a checkpoint from a short ResNet-18
# run is exported; the `safetensors` package loads it into torchvision's model with
# strict=True, the tensors equal the .h5's bit for bit, and torchvision's outputs match
# `resnet_ddp predict`. Then the way back: --init / predict / --eval-only with the
# .safetensors give exactly the .h5's results, a re-export is identical, and 16-bit
# (F16, BF16) files from save_file, with or without our metadata, load too.
# Needs the venv of tools/py_venv.sh (PyPI's safetensors on Debian's torch);
# exits 77 (skipped) only when that venv cannot be created.
source "$(dirname "$0")/common.sh"

PY=$("$RD_ROOT/tools/py_venv.sh" 2>"$WORK/venv.err") || {
  cat "$WORK/venv.err" >&2
  echo "SKIP: no Python environment with safetensors + torchvision (tools/py_venv.sh failed, see above)" >&2
  exit 77
}
CHECK=("$PY" "$(dirname "$0")/check_safetensors.py")
# ResNet-18 (torchvision has no resnet_tiny) at the images' own size: no resize in the comparison.
MODEL=(--threads 1 --workers 1 --log-every 0 --conv-algo direct)
synth_data "$WORK/data" 12 6
OUT="$WORK/out"
note "training ResNet-18 for 2 steps"
"$RD_BIN" --data "$WORK/data" --arch resnet18 --image-size 32 --normalize imagenet --batch-size 4 --epochs 1 \
  --max-steps 2 --augment none --output-dir "$OUT" "${MODEL[@]}" >"$WORK/train.log" 2>&1 ||
  { cat "$WORK/train.log"; fail "training"; }
CKPT=$OUT/best_model.h5
ST=$WORK/model.safetensors

note "export"
"$RD_BIN" export --checkpoint "$CKPT" --out "$ST" >"$WORK/export.log" 2>&1 || { cat "$WORK/export.log"; fail "export"; }
cat "$WORK/export.log"
grep -q "^Exported 124 tensors (resnet18, mlp head, 3 classes)" "$WORK/export.log" || fail "export summary"
! ls -A "$WORK" | grep -q '\.tmp\.' || fail "export left a temporary file"

note "predict with the .h5, then torchvision + safetensors on the same images"
"$RD_BIN" predict --checkpoint "$CKPT" --json --threads 1 --workers 1 "$WORK/data/Validation" >"$WORK/pred_h5.json" ||
  fail "predict with the .h5"
"${CHECK[@]}" torchvision "$ST" "$CKPT" "$WORK/pred_h5.json" || fail "torchvision check"

note "predict with the .safetensors: identical output"
"$RD_BIN" predict --checkpoint "$ST" --json --threads 1 --workers 1 "$WORK/data/Validation" >"$WORK/pred_st.json" ||
  fail "predict with the .safetensors"
diff <(grep -v '"checkpoint"' "$WORK/pred_h5.json") <(grep -v '"checkpoint"' "$WORK/pred_st.json") ||
  fail "predict differs between the .h5 and the .safetensors"

note "info reads it"
"$RD_BIN" info "$ST" >"$WORK/info" || fail "info"
grep -q -x "format:          safetensors (resnet_ddp .* export)" "$WORK/info" || { cat "$WORK/info"; fail "info format"; }
grep -q -x "classes:         3 (C0, C2, C4)" "$WORK/info" || { cat "$WORK/info"; fail "info classes"; }

note "round trip: --eval-only with --init model.safetensors == --resume best_model.h5"
"$RD_BIN" --data "$WORK/data" --eval-only --resume "$CKPT" "${MODEL[@]}" >"$WORK/eval_h5.log" 2>&1 ||
  { cat "$WORK/eval_h5.log"; fail "eval-only .h5"; }
"$RD_BIN" --data "$WORK/data" --eval-only --init "$ST" --arch resnet18 --image-size 32 --normalize imagenet \
  "${MODEL[@]}" >"$WORK/eval_st.log" 2>&1 || { cat "$WORK/eval_st.log"; fail "eval-only --init .safetensors"; }
want=$(grep '^Val loss' "$WORK/eval_h5.log")
got=$(grep '^Val loss' "$WORK/eval_st.log")
echo "h5:          $want"
echo "safetensors: $got"
[ -n "$want" ] && [ "$want" = "$got" ] || fail "evaluation differs"
grep -q "^Initialised weights from $ST" "$WORK/eval_st.log" || fail "--init line"

note "--eval-only --resume model.safetensors: the model flags come from its metadata"
"$RD_BIN" --data "$WORK/data" --eval-only --resume "$ST" "${MODEL[@]}" >"$WORK/eval_st2.log" 2>&1 ||
  { cat "$WORK/eval_st2.log"; fail "eval-only --resume .safetensors"; }
grep -q -x -F "Model settings from $ST: --arch resnet18 --image-size 32 --normalize imagenet" "$WORK/eval_st2.log" ||
  { cat "$WORK/eval_st2.log"; fail "model settings not taken from the metadata"; }
[ "$(grep '^Val loss' "$WORK/eval_st2.log")" = "$want" ] || fail "eval-only --resume .safetensors differs"

note "re-export from the .safetensors: the same tensors"
"$RD_BIN" export --checkpoint "$ST" --out "$WORK/again.safetensors" >/dev/null || fail "re-export"
"${CHECK[@]}" same "$ST" "$WORK/again.safetensors" || fail "re-export differs"

note "training starts from --init model.safetensors"
"$RD_BIN" --data "$WORK/data" --init "$ST" --arch resnet18 --image-size 32 --normalize imagenet --batch-size 4 \
  --epochs 1 --max-steps 1 --augment none --output-dir "$WORK/out2" "${MODEL[@]}" >"$WORK/train2.log" 2>&1 ||
  { cat "$WORK/train2.log"; fail "training from --init .safetensors"; }

note "16-bit files from save_file: exact widening, with and without our metadata"
for dt in F16 BF16; do
  "${CHECK[@]}" lowp "$ST" "$WORK/m_$dt.safetensors" "$dt" || fail "writing $dt"
  "$RD_BIN" export --checkpoint "$WORK/m_$dt.safetensors" --out "$WORK/w_$dt.safetensors" >/dev/null ||
    fail "export of the $dt file"
  "${CHECK[@]}" widened "$WORK/w_$dt.safetensors" "$WORK/m_$dt.safetensors" || fail "$dt widening"
done
"${CHECK[@]}" lowp "$ST" "$WORK/plain.safetensors" BF16 --no-metadata || fail "writing a file without metadata"
"$RD_BIN" --data "$WORK/data" --eval-only --init "$WORK/plain.safetensors" --arch resnet18 --image-size 32 \
  --normalize imagenet "${MODEL[@]}" >"$WORK/eval_plain.log" 2>&1 ||
  { cat "$WORK/eval_plain.log"; fail "--init with a plain torchvision safetensors file"; }
grep '^Val loss' "$WORK/eval_plain.log"
echo "PASS"
