#!/usr/bin/env bash
# A recipe's switches turned off: torchvision-resnet-v2 turns on RASampler,
# which needs 256 training images, and the weight EMA. On 8 images the recipe is refused;
# --no-ra-sampler makes it run, and --no-model-ema / `model_ema: false` in YAML /
# `model-ema = false` in a .conf file leave the EMA out (no "EMA Acc@1" line).
source "$(dirname "$0")/common.sh"

DATA="$WORK/data"
synth_data "$DATA" 8 4
# The recipe at 32 px, short: its crop sizes and warmup scaled down, one step per epoch.
SMALL=(--recipe torchvision-resnet-v2 "${TINY[@]}" --train-crop-size 32 --val-resize-size 36
  --val-crop-size 32 -b 4 --epochs 2 --lr-warmup-epochs 1 --max-steps 1)

note "the recipe as published is refused on 8 images (RASampler needs 256)"
rc=0
"$RD_BIN" --data "$DATA" "${SMALL[@]}" --output-dir "$WORK/ra" --check >"$WORK/out" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q -- "--ra-sampler: RASampler visits" "$WORK/out" ||
  { cat "$WORK/out"; fail "the recipe with RASampler on 8 images: exit $rc, expected 2 naming --ra-sampler"; }

note "--no-ra-sampler: ready; the EMA still runs"
"$RD_BIN" --data "$DATA" "${SMALL[@]}" --no-ra-sampler --output-dir "$WORK/ema" >"$WORK/out" 2>&1 ||
  { cat "$WORK/out"; fail "--recipe torchvision-resnet-v2 --no-ra-sampler failed"; }
grep -q "EMA Acc@1" "$WORK/out" || { cat "$WORK/out"; fail "the recipe's EMA did not run"; }

printf 'model_ema: false\nra_sampler: false\n' >"$WORK/off.yaml"
printf 'model-ema = false\nno-ra-sampler\n' >"$WORK/off.conf"
for how in "--no-model-ema --no-ra-sampler" "--config $WORK/off.yaml" "--config $WORK/off.conf"; do
  note "$how: no EMA, and the switch recorded off"
  out="$WORK/run_${how//[^a-z]/_}"
  # shellcheck disable=SC2086  # $how is words on purpose
  "$RD_BIN" --data "$DATA" "${SMALL[@]}" $how --output-dir "$out" >"$WORK/out" 2>&1 ||
    { cat "$WORK/out"; fail "$how: the run failed"; }
  ! grep -q "EMA" "$WORK/out" || { cat "$WORK/out"; fail "$how: the EMA ran anyway"; }
  "$RD_BIN" info "$out/last.h5" >"$WORK/info"
  grep -q -- "--no-model-ema" "$WORK/info" || { cat "$WORK/info"; fail "$how: the command line lacks --no-model-ema"; }
done

note "a value that is not a switch's is an error naming the file and the line"
printf 'lr: 0.1\nmodel_ema: sometimes\n' >"$WORK/bad.yaml"
rc=0
"$RD_BIN" --data "$DATA" "${SMALL[@]}" --config "$WORK/bad.yaml" --check >"$WORK/out" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q -- "bad.yaml:2: --model-ema: a switch: expected true or false" "$WORK/out" ||
  { cat "$WORK/out"; fail "model_ema: sometimes: exit $rc, expected 2 naming bad.yaml:2"; }
echo "PASS"
