#!/usr/bin/env bash
# The flags and layouts users bring from timm, PyTorch's examples and torchvision: an
# ImageNet-style train/ val/ tree through synth, train, --eval-only, pack and predict;
# timm's spellings (-b, -j, --model, --opt, --sched, --output) and --amp; a --config
# file that the command line overrides, recorded written-out in the checkpoint; and
# the errors (missing split folders, a bad line in the file) with exit status 2.
source "$(dirname "$0")/common.sh"

# expect_usage_error PATTERN ARGS...: one process, status 2, message contains PATTERN.
expect_usage_error() {
  local pattern=$1 rc=0
  shift
  "$RD_BIN" "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
  [ "$rc" = 2 ] || { cat "$WORK/out" "$WORK/err"; fail "'$*' exited $rc, expected 2"; }
  grep -q -F -- "$pattern" "$WORK/err" || { cat "$WORK/err"; fail "'$*': message does not contain '$pattern'"; }
}

DATA="$WORK/inet"
note "synth writes an ImageNet-style tree"
"$RD_BIN" synth --out "$DATA" --train 24 --val 12 --size 32x32 --format png --threads 1 \
  --train-split train --val-split val >/dev/null
[ -d "$DATA/train/C0" ] && [ -d "$DATA/val/C0" ] && [ ! -e "$DATA/Train" ] || fail "synth did not write train/ val/"

note "without the split flags: the folders found and the flags to use"
expect_usage_error "--data $DATA: no folder 'Train' for the Train split (--train-split); folders there: train, val (use --train-split train --val-split val)" \
  --data "$DATA" "${TINY[@]}" --epochs 1
expect_usage_error "no folder 'valid' for the Validation split (--val-split); folders there: train, val (use --val-split val)" \
  --data "$DATA" "${TINY[@]}" --train-split train --val-split valid --epochs 1
expect_usage_error "--val-split: expected the name of a folder inside --data" --data "$DATA" --val-split ../val

note "a --config file in timm's spellings; the command line overrides --epochs"
cat >"$WORK/recipe.conf" <<'EOF'
# ImageNet layout, timm spellings
train-split = train
val_split = val
--model resnet_tiny
image-size = 32
-b 4
epochs = 3          # the command line says 1
opt = sgd
sched = cosine
lr = 0.05
threads = 1
conv-algo = direct
log-interval = 0
EOF
mpi 2 --data "$DATA" --config "$WORK/recipe.conf" --epochs 1 -j 1 --output "$WORK/a" >"$WORK/a.log" 2>&1 ||
  { cat "$WORK/a.log"; fail "training from the config file"; }
grep -q -F "Train: 24 images in 3 classes from $DATA/train" "$WORK/a.log" || { cat "$WORK/a.log"; fail "train/ not read"; }
grep -q -F "Validation: 12 images in 3 classes from $DATA/val" "$WORK/a.log" || fail "val/ not read"
grep -q -F "2 rank(s) x batch 4 x accum 1 = global batch 8, sgd lr 0.05, scheduler cosine" "$WORK/a.log" ||
  { cat "$WORK/a.log"; fail "-b / --opt / --sched / lr from the file not applied"; }
grep -q '^(Epoch 1/1) Current best val acc' "$WORK/a.log" || { cat "$WORK/a.log"; fail "--epochs 1 on the command line must win"; }
[ -f "$WORK/a/best_model.h5" ] || fail "--output did not name the output folder"
"$RD_BIN" info "$WORK/a/last.h5" >"$WORK/info"
grep -q -- "--train-split train --val-split val --arch resnet_tiny --image-size 32 --batch-size 4" "$WORK/info" ||
  { cat "$WORK/info"; fail "the recorded command line lacks the file's flags"; }
! grep -q -- "--config" "$WORK/info" || fail "the recorded command line still names the config file"
# Accuracy only: 2 ranks trained, 1 evaluates, and the loss sums in another order.
want=$(sed -n 's/^Best model (val loss: [^,]*, val accuracy: \([^)]*\)).*/Val accuracy: \1/p' "$WORK/a.log")
[ -n "$want" ] || fail "no final evaluation"

note "a bad line in the file: named with its line number, exit 2"
printf 'lr = 0.1\nbacth_size = 3\n' >"$WORK/bad.conf"
expect_usage_error "$WORK/bad.conf:2: unknown flag '--bacth-size'" --data "$DATA" --config "$WORK/bad.conf"
printf -- '--batchsize 3\n' >"$WORK/bad2.conf"
expect_usage_error "$WORK/bad2.conf:1: unknown flag '--batchsize' for 'train' (did you mean --batch-size?)" \
  --data "$DATA" --config "$WORK/bad2.conf"
expect_usage_error "--config $WORK/none.conf: cannot open" --data "$DATA" --config "$WORK/none.conf"
# The shipped example parses: the run gets as far as the missing dataset.
expect_usage_error "--data: no such file or directory: '$WORK/none'" --data "$WORK/none" --config "$RD_ROOT/jobs/example.conf"
expect_usage_error "unknown flag '--opts' for 'train' (did you mean --optimizer, also spelled --opt?)" --data "$DATA" --opts sgd

note "--eval-only reads val/ too"
"$RD_BIN" --data "$DATA" --train-split train --val-split val --threads 1 --conv-algo direct -j 1 --eval-only \
  --resume "$WORK/a/best_model.h5" >"$WORK/eval.log" 2>&1 || { cat "$WORK/eval.log"; fail "eval-only on train/ val/"; }
grep -q -E "^Val loss: [0-9.e-]+, $want\$" "$WORK/eval.log" || { cat "$WORK/eval.log"; fail "eval-only gave another result than training's ($want)"; }

note "pack reads train/ val/ and stores Train / Validation; predict agrees on both"
"$RD_BIN" pack --data "$DATA" --train-split train --val-split val --out "$WORK/p.h5" --image-size 32 --threads 1 \
  >"$WORK/pack.log" 2>&1 || { cat "$WORK/pack.log"; fail "pack with split flags"; }
grep -q "Train 24, Validation 12, Test 0 images" "$WORK/pack.log" || { cat "$WORK/pack.log"; fail "pack counts"; }
"$RD_BIN" predict --checkpoint "$WORK/a/best_model.h5" --threads 1 -j 1 --train-split train --val-split val "$DATA" \
  >"$WORK/pred_dir" 2>&1 || { cat "$WORK/pred_dir"; fail "predict on the tree"; }
"$RD_BIN" predict --checkpoint "$WORK/a/best_model.h5" --threads 1 -b 5 "$WORK/p.h5" >"$WORK/pred_h5" 2>&1 ||
  { cat "$WORK/pred_h5"; fail "predict on the packed file"; }
expect_usage_error "it holds class folders: for a dataset root with split folders of other names give them with --train-split NAME --val-split NAME" \
  predict --checkpoint "$WORK/a/best_model.h5" --threads 1 "$DATA"
acc_dir=$(grep '^Accuracy:' "$WORK/pred_dir")
[ -n "$acc_dir" ] || { cat "$WORK/pred_dir"; fail "predict on the tree printed no accuracy"; }
[ "$acc_dir" = "$(grep '^Accuracy:' "$WORK/pred_h5")" ] || fail "tree and packed file: $acc_dir vs $(grep '^Accuracy:' "$WORK/pred_h5")"

note "--amp: bf16 on this CPU when it has AVX512-BF16/AMX, else the refusal --precision bf16 gives"
base=(--data "$DATA" --train-split train --val-split val "${TINY[@]}" --epochs 1 --max-steps 1)
if "$RD_BIN" "${base[@]}" --amp --output-dir "$WORK/b" >"$WORK/b.log" 2>&1; then
  grep -q "bf16 convolutions" "$WORK/b.log" || { cat "$WORK/b.log"; fail "--amp on the CPU did not run bf16"; }
else
  rc=$?
  [ "$rc" = 2 ] || { cat "$WORK/b.log"; fail "--amp refused with status $rc, expected 2"; }
  grep -q -F -- "--amp (--precision bf16 on cpu): CPU backend: bf16 needs a CPU with AVX512-BF16 or AMX" "$WORK/b.log" ||
    { cat "$WORK/b.log"; fail "--amp refused without naming it and the reason"; }
fi
note "--amp then --precision fp32: the later wins"
"$RD_BIN" "${base[@]}" --amp --precision fp32 --output-dir "$WORK/c" >"$WORK/c.log" 2>&1 ||
  { cat "$WORK/c.log"; fail "--amp --precision fp32"; }
! grep -q "bf16 convolutions" "$WORK/c.log" || { cat "$WORK/c.log"; fail "--precision fp32 after --amp still ran bf16"; }
note "ok"
