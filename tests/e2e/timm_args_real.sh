#!/usr/bin/env bash
# timm's args.yaml as timm's train.py writes it: with timm's defaults, every
# key that cannot be honoured here is named in one error (exit 2); with those keys set
# to what this program does, the file trains as it is, its data path included, with the
# keys that change nothing listed once. Needs timm and its train.py (tools/timm_venv.sh
# TRAIN_PY puts them in RD_TIMM_DIR, default ~/.cache/resnet_ddp/timm); else skipped.
source "$(dirname "$0")/common.sh"

dir=${RD_TIMM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/resnet_ddp/timm}
py=$dir/venv/bin/python3
if ! [ -x "$py" ] || ! [ -f "$dir/train.py" ] || ! "$py" -c "import timm" 2>/dev/null; then
  echo "SKIP: no timm and train.py in $dir (tools/timm_venv.sh PATH/TO/pytorch-image-models/train.py)" >&2
  exit 77
fi

DATA="$WORK/data"
"$RD_BIN" synth --out "$DATA" --train 8 --val 4 --size 32x32 --format png --threads 1 \
  --train-split train --val-split validation >/dev/null

# timm_args NAME FLAGS...: runs timm's train.py (one short epoch on the CPU), which
# writes WORK/timm/NAME/args.yaml at start.
timm_args() {
  local name=$1
  shift
  (cd "$WORK" && timeout 300 "$py" "$dir/train.py" "$DATA" --model resnet18 --img-size 32 --epochs 1 -b 2 \
    --workers 1 --device cpu --output "$WORK/timm" --experiment "$name" "$@") >"$WORK/timm_$name.log" 2>&1 ||
    { tail -20 "$WORK/timm_$name.log"; fail "timm's train.py failed"; }
  [ -f "$WORK/timm/$name/args.yaml" ] || fail "timm's train.py wrote no args.yaml"
}

note "timm's defaults: what differs here, all in one error"
timm_args defaults
rc=0
"$RD_BIN" --config "$WORK/timm/defaults/args.yaml" --threads 1 --check >"$WORK/out" 2>&1 || rc=$?
[ "$rc" = 2 ] || { cat "$WORK/out"; fail "timm's default args.yaml: exit $rc, expected 2"; }
for want in "color_jitter: 0.4" "interpolation: ''" "train_interpolation: random" \
  "warmup_epochs: 5: without warmup_prefix" "4 problems, listed above"; do
  grep -q -F -- "$want" "$WORK/out" || { cat "$WORK/out"; fail "the error does not name '$want'"; }
done

note "set to what this program does: it trains from the file alone"
timm_args honoured --interpolation bilinear --train-interpolation bilinear --color-jitter 0 --lr 0.01 \
  --warmup-prefix --warmup-epochs 1 --warmup-lr 0.001 --opt adamw --weight-decay 0.05 --mixup 0.2 \
  --cutmix 1.0 --reprob 0.25 --remode const --aa rand-m9-n2 --smoothing 0.1 --crop-pct 0.875
# The file names the data; the model is shrunk for the test.
"$RD_BIN" --config "$WORK/timm/honoured/args.yaml" --arch resnet_tiny --threads 1 --max-steps 1 \
  --output-dir "$WORK/ours" >"$WORK/out" 2>&1 || { cat "$WORK/out"; fail "the honoured args.yaml did not train"; }
grep -q "ignored, as they do not change training here: .*checkpoint_hist.*experiment" "$WORK/out" ||
  { cat "$WORK/out"; fail "the ignored keys are not listed"; }
[ "$(grep -c "ignored, as they" "$WORK/out")" = 1 ] || { cat "$WORK/out"; fail "the ignored keys listed more than once"; }
"$RD_BIN" info "$WORK/ours/last.h5" >"$WORK/info"
for want in "--data $DATA" "--batch-size 2" "--epochs 2" "--optimizer adamw" "--lr 0.01" \
  "--weight-decay 0.05" "--label-smoothing 0.1" "--scheduler cosineannealinglr" "--lr-warmup-epochs 1" \
  "--lr-warmup-decay 0.1" "--train-crop-size 32" "--val-resize-size 36" "--auto-augment ra" "--ra-magnitude 9" \
  "--random-erase 0.25" "--mixup-alpha 0.2" "--cutmix-alpha 1.0" "--no-sync-bn" "--normalize imagenet"; do
  grep -q -F -- "$want" "$WORK/info" || { cat "$WORK/info"; fail "the recorded command line lacks '$want'"; }
done
echo "PASS"
