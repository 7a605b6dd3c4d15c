#!/usr/bin/env bash
# --cuda-graphs on the emulated device, one rank: the same run with graphs on and off prints
# the same loss and accuracy at every step and the same validation, and writes bit-identical
# weights, buffers and optimizer state (h5diff), over two epochs (the second re-records
# after validation and the short last batch changed the memory), and the "on" run replayed
# graphs (RD_EMU_STATS graph_launches), so a change that makes recording fail (an
# allocation, a host wait or a query in the recorded work: the emulator refuses them and
# the run exits non-zero) or silently falls back to eager work turns this red.
#   $1 = emulated-device resnet_ddp, $2 = CPU resnet_ddp (makes the data), $3 = mpiexec,
#   $4 = case: fp32 | fp16_overflow (an injected overflow at update 4: that step's forward runs
#   eagerly; its optimizer step, already a replay, skips on the device's verdict) | accum_ema_bf16
#   (--accum-steps 2: two backward graphs; --model-ema) | mixing (MixUp / CutMix: the forward
#   stays eager, the backward is replayed) | adamw_segments (AdamW with per-parameter decay: the
#   per-segment update replayed) | syncbn_2ranks (two ranks: the forward with SyncBatchNorm's
#   all-reduces and the backward with them and the gradient buckets' all-reduces replayed; the
#   step split's timing mark inside the backward) | fp16_overflow_2ranks (two ranks, rank 1
#   injects an overflow once graphs replay: every rank runs that step's forward eagerly, as
#   NCCL wants, and skips the update)
set -euo pipefail
EMU_BIN=$1
CPU_BIN=$2
RD_MPIEXEC=$3
CASE=$4
LAUNCH=()
TRAIN=26
if [ "$CASE" = syncbn_2ranks ] || [ "$CASE" = fp16_overflow_2ranks ]; then
  export RD_EMU_DEVICE_COUNT=2
  LAUNCH=("$RD_MPIEXEC" --oversubscribe --bind-to none -np 2)
  TRAIN=52
fi

# shellcheck source=tests/gpu_emu/common.sh
source "$(dirname "$0")/common.sh" graphs

# 26 images a rank in batches of 4: 7 steps an epoch, the last one of 2 images (another shape).
"$CPU_BIN" synth --out "$WORK/data" --train "$TRAIN" --val 8 --size 32x32 --format png --threads 1 >/dev/null
COMMON=(--device cuda --data "$WORK/data" --arch resnet_tiny --image-size 32 --threads 1 --workers 1 --batch-size 4
  --augment none --epochs 2 --log-every 1 --progress lines --tensorboard off --lr 1e-3 --seed 3)

# run ON|OFF ARGS...: one training run; log, counters and checkpoints under $WORK/ON|OFF.
run() {
  local mode=$1
  shift
  mkdir -p "$WORK/$mode"
  RD_EMU_STATS="$WORK/$mode/stats" "${LAUNCH[@]}" "$EMU_BIN" "${COMMON[@]}" --output-dir "$WORK/$mode/out" --cuda-graphs "$mode" \
    "$@" >"$WORK/$mode/log" 2>&1 || { cat "$WORK/$mode/log"; fail "--cuda-graphs $mode $* exited non-zero"; }
}

# both MIN_LAUNCHES STEPS ARGS...: the run with and without graphs (STEPS optimizer steps
# printed); the same output and state.
both() {
  local min_launches=$1 steps=$2
  shift 2
  run on "$@"
  run off "$@"
  local printed=(-E '^\(Epoch [0-9]+/[0-9]+\) (step|Val|Average)')
  grep "${printed[@]}" "$WORK/on/log" | sed 's/ [0-9.]* img\/s.*//' >"$WORK/on.lines"
  grep "${printed[@]}" "$WORK/off/log" | sed 's/ [0-9.]* img\/s.*//' >"$WORK/off.lines"
  [ "$(grep -c step "$WORK/on.lines")" = "$steps" ] || { cat "$WORK/on/log"; fail "$CASE: not $steps step lines"; }
  diff "$WORK/on.lines" "$WORK/off.lines" || fail "$CASE: the printed losses differ with and without graphs"
  local group
  for group in /state_dict /optimizer; do
    h5diff -q "$WORK/on/out/last.h5" "$WORK/off/out/last.h5" "$group" "$group" ||
      { h5diff -r "$WORK/on/out/last.h5" "$WORK/off/out/last.h5" "$group" "$group" | head -20; fail "$CASE: $group differs"; }
  done
  local launches eager
  launches=$(counter "$WORK/on/stats.rank0" graph_launches)
  eager=$(counter "$WORK/off/stats.rank0" graph_launches)
  echo "$CASE: graph launches $launches with graphs on, $eager off; kernel launches" \
    "$(counter "$WORK/on/stats.rank0" kernel_launches) on, $(counter "$WORK/off/stats.rank0" kernel_launches) off"
  [ "$eager" = 0 ] || fail "$CASE: --cuda-graphs off launched $eager graphs"
  grep -Eq '^\(Epoch 2/2\) CUDA graphs: [0-9]+ forward/backward/optimizer passes replayed, [0-9]+ recorded$' "$WORK/on/log" ||
    { cat "$WORK/on/log"; fail "$CASE: no 'CUDA graphs' line for epoch 2"; }
  ! grep -q 'CUDA graphs' "$WORK/off/log" || fail "$CASE: a 'CUDA graphs' line with --cuda-graphs off"
  [ "$launches" -ge "$min_launches" ] || fail "$CASE: $launches graph launches, expected at least $min_launches"
}

# Graph launches at least (as measured): per epoch, the 6 full batches' forward and backward,
# less the warm-up (a shape's first eager run; the next records) and the two sums slots'
# recordings, plus the optimizer steps replayed once settled (each epoch's short batch and
# validation allocate, so the optimizer re-settles then). The forward after a replayed
# optimizer step reads the staged weights the launch marked stale: MixUp / CutMix's eager
# forward and validation re-stage them, and would print other losses if it did not.
# Steps: 7 per epoch (4 with --accum-steps 2).
case "$CASE" in
  fp32) both 24 14 --precision fp32 ;;
  fp16_overflow) RD_INJECT_OVERFLOW_STEP=4 both 23 14 --precision fp16 ;;
  accum_ema_bf16) RD_EMU_DEVICE=a100 both 16 8 --precision bf16 --accum-steps 2 --model-ema --model-ema-steps 1 ;;
  mixing) both 17 14 --precision fp32 --mixup-alpha 0.2 --cutmix-alpha 1.0 ;;
  # The per-segment update in a graph: AdamW's factor 1 - lr * decay formed from the device's
  # lr, the norm layers' own decay, the bias corrections of each replay's step count, and a
  # learning rate that the schedule changes for epoch 2.
  adamw_segments) both 24 14 --precision fp32 --optimizer adamw --weight-decay 0.05 --norm-weight-decay 0 \
    --scheduler cosine ;;
  syncbn_2ranks) both 24 14 --precision fp32 --sync-bn ;;
  fp16_overflow_2ranks) RD_INJECT_OVERFLOW_STEP=5 RD_INJECT_OVERFLOW_RANK=1 both 23 14 --precision fp16 --sync-bn ;;
  *) fail "unknown case $CASE" ;;
esac
# The exposed communication is timed inside the replayed backward (an event record node).
[ "$CASE" != syncbn_2ranks ] || grep -Eq '^\(Epoch 2/2\) Step time: .* exposed comm [0-9.]+ ' "$WORK/on/log" ||
  { cat "$WORK/on/log"; fail "syncbn_2ranks: no step split with exposed comm"; }
[ "${CASE%_2ranks}" != fp16_overflow ] || grep -Eq "fp16: [0-9]+ steps? skipped for non-finite gradients" "$WORK/on/log" ||
  { cat "$WORK/on/log"; fail "fp16_overflow: no step was skipped"; }
echo "graphs: $CASE replayed bit for bit"
