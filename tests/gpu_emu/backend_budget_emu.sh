#!/usr/bin/env bash
# The CUDA backend's share of the step budget, on the emulated device's counters
# (RD_EMU_STATS=PATH writes PATH.rank<R>: "name value" per line at exit), one rank:
#   model_ema: --model-ema (an EMA update every step) allocates nothing per step: a run of
#              4 steps and one of 8 make the same number of allocations;
#   one_rank:  one rank makes no NCCL call (its collectives are identities, no reducer);
#   planned:   the setup plans every shape of the epoch (the short last batch included): a
#              run stopped after its first step searched as often as two whole epochs.
#   $1 = emulated-device resnet_ddp, $2 = CPU resnet_ddp (makes the data set), $3 = case
set -euo pipefail
EMU_BIN=$1
CPU_BIN=$2
CASE=$3

# shellcheck source=tests/gpu_emu/common.sh
source "$(dirname "$0")/common.sh" budget

# 46 training images in batches of 4: 12 steps an epoch, the last one of 2 images.
"$CPU_BIN" synth --out "$WORK/data" --train 46 --val 8 --size 32x32 --format png --threads 1 >/dev/null

# train NAME ARGS...: one rank (an MPI singleton) on the emulated GPU; counters in $WORK/NAME.rank0.
train() {
  local name=$1
  shift
  RD_EMU_STATS="$WORK/$name" "$EMU_BIN" --device cuda --data "$WORK/data" --arch resnet_tiny --image-size 32 \
    --threads 1 --workers 1 --batch-size 4 --augment none --log-every 1 --progress lines --tensorboard off \
    --output-dir "$WORK/out_$name" "$@" >"$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name exited non-zero"; }
  [ -s "$WORK/$name.rank0" ] || fail "$name wrote no counters ($WORK/$name.rank0)"
}
# stat NAME COUNTER
stat() {
  local v
  v=$(awk -v k="$2" '$1 == k { print $2 }' "$WORK/$1.rank0")
  [ -n "$v" ] || fail "no counter '$2' in $1's stats"
  echo "$v"
}

case "$CASE" in
  model_ema)
    train short --epochs 1 --max-steps 4 --model-ema --model-ema-steps 1
    train long --epochs 1 --max-steps 8 --model-ema --model-ema-steps 1
    a=$(stat short allocs) b=$(stat long allocs)
    echo "--- allocations: 4 steps $a, 8 steps $b"
    [ "$a" = "$b" ] || fail "--model-ema allocates per step: $a allocations in 4 steps, $b in 8"
    ;;
  one_rank)
    train one --epochs 1 --max-steps 3
    n=$(stat one nccl)
    echo "--- NCCL calls with one rank: $n"
    [ "$n" = 0 ] || { cat "$WORK/one.rank0"; fail "one rank made $n NCCL calls"; }
    ;;
  planned)
    train first_step --epochs 1 --max-steps 1
    train two_epochs --epochs 2
    a=$(stat first_step cudnn_find) b=$(stat two_epochs cudnn_find)
    echo "--- cuDNN searches: 1 step $a, 2 epochs $b"
    [ "$a" -gt 0 ] || fail "no cuDNN search counted"
    [ "$a" = "$b" ] || fail "searches after the setup: $a in a run of 1 step, $b in 2 epochs"
    grep -q '^(Epoch 2/2) step ' "$WORK/two_epochs.log" || { cat "$WORK/two_epochs.log"; fail "no second epoch"; }
    ;;
  *) fail "unknown case $CASE" ;;
esac
echo "PASS: $CASE"
