#!/usr/bin/env bash
# Help and docs say what the program does (review ecosystem D9): `train --help` lists
# every --init format (.h5, .safetensors, .pth) and YAML for --config, the EMA flags
# are in the help of train, predict and export, and every column a run writes to
# metrics.csv is documented in docs/usage.md. `--check --recipe` prints the flags the
# preset expands to. The progress lines carry the epoch's elapsed time and ETA.
source "$(dirname "$0")/common.sh"

"$RD_BIN" train --help >"$WORK/train_help" || fail "train --help"
init_line=$(grep -A3 -- "--init FILE" "$WORK/train_help" | tr -s ' \n' ' ')
for fmt in .h5 .safetensors .pth; do
  grep -q -F -- "$fmt" <<<"$init_line" || fail "train --help: --init does not mention $fmt: $init_line"
done
grep -A2 -- "--config" "$WORK/train_help" | grep -q "YAML" || fail "train --help: --config does not mention YAML"
grep -q -- "--init-ema" "$WORK/train_help" || fail "train --help lacks --init-ema"
for cmd in predict export; do
  "$RD_BIN" $cmd --help | grep -q -- "--ema " || fail "$cmd --help lacks --ema"
done

synth_data "$WORK/data" 8 4
"$RD_BIN" --data "$WORK/data" --arch resnet_tiny --image-size 32 --threads 1 --workers 1 --log-every 1 \
  --batch-size 4 --epochs 1 --model-ema --model-ema-steps 1 --output-dir "$WORK/out" >"$WORK/train.log" 2>&1 ||
  { cat "$WORK/train.log"; fail "training"; }
header=$(head -n 1 "$WORK/out/metrics.csv")
missing=
for col in ${header//,/ }; do
  grep -q -F -- "$col" "$RD_ROOT/docs/usage.md" || missing="$missing $col"
done
[ -z "$missing" ] || fail "metrics.csv columns not in docs/usage.md:$missing"
echo "metrics.csv: ${header//,/ } - all in docs/usage.md"

note "progress lines: elapsed<remaining"
grep -E '^\(Epoch 1/1\) step [0-9]+/2 .* img/s [0-9]+:[0-9]{2}<([0-9]+:[0-9]{2}|\?)$' "$WORK/train.log" ||
  { cat "$WORK/train.log"; fail "no elapsed<ETA on the progress lines"; }

note "--check prints a recipe's expansion"
"$RD_BIN" --data "$WORK/data" "${TINY[@]}" --recipe torchvision-resnet-v1 --epochs 1 --lr-warmup-epochs 0 \
  --output-dir "$WORK/out2" --check >"$WORK/check.log" 2>&1 || { cat "$WORK/check.log"; fail "--check --recipe"; }
grep "^check: recipe: *torchvision-resnet-v1: .*--lr 0.1" "$WORK/check.log" ||
  { cat "$WORK/check.log"; fail "--check does not print the recipe's flags"; }
echo "PASS"
