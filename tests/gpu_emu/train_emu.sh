#!/usr/bin/env bash
# resnet_ddp --device cuda on the emulated device, 2 ranks (NCCL stand-in over MPI),
# against the same run on the CPU backend: the loss and accuracy of every step and
# the epoch's validation agree within the error model below.
#   $1 = emulated-device resnet_ddp, $2 = CPU resnet_ddp, $3 = mpiexec, $4 = repo root,
#   $5 = case: fp32 | fp16_overflow | bf16 | preempt_resume | predict_export | device_choice |
#        mixup_cutmix | presets
#
# Error model (per step, on the running mean printed by --log-every 1, 4 decimals):
#   fp32: cuDNN/cuBLAS stand-ins sum in float64, the CPU backend in float32 with its
#         own summation order: |loss difference| <= 2e-3, accuracy identical. The CPU
#         reference convolves directly (CPU_REF): its Winograd kernels round 10-20x
#         more (own F(4x4,3x3) on AVX2 CPUs, oneDNN's on AVX-512; their own float64
#         tests bound them), and Adam's first step at lr 1e-3 turns that into a
#         machine-dependent loss difference: 3.2e-3 at step 2 on a native AVX2 CPU
#         with Winograd, 4e-4 with direct convolutions.
#   fp16 / bf16 activations (weights, gradients, BN statistics stay float32): one
#         rounding of 2^-11 / 2^-8 relative per stored activation, through 20-50
#         layers, magnified where a batch norm normalises few values (ResNet-50 at
#         32x32: layer4 is 1x1, 8 values per channel with SyncBN; measured 3.4e-2 at
#         its first step): |loss difference| <= 6e-2 against the CPU's fp32;
#         accuracy within one sample in eight (an arg-max of near-equal logits can
#         flip).
set -euo pipefail
EMU_BIN=$1
CPU_BIN=$2
RD_MPIEXEC=$3
# $4, the source tree, is passed by the registrations but not needed here.
CASE=$5
export RD_EMU_DEVICE_COUNT=2

# shellcheck source=tests/gpu_emu/common.sh
source "$(dirname "$0")/common.sh" gpu_emu

"$CPU_BIN" synth --out "$WORK/data" --train 32 --val 16 --size 32x32 --format png --threads 1 >/dev/null

# The CPU backend's reference run: direct convolutions on every ISA (error model above).
CPU_REF=(--device cpu --conv-algo direct)
COMMON=(--data "$WORK/data" --image-size 32 --threads 1 --workers 1 --batch-size 4 --augment none
  --log-every 1 --progress lines --tensorboard off --lr 1e-3 --seed 3)

# run NP BIN LOG ARGS...: one training run; its log in LOG.
run() {
  local np=$1 bin=$2 log=$3
  shift 3
  "$RD_MPIEXEC" --oversubscribe --bind-to none -np "$np" "$bin" "${COMMON[@]}" "$@" >"$log" 2>&1 ||
    { cat "$log"; fail "$(basename "$bin") $* exited non-zero"; }
}

# steps LOG: "loss acc" of every step line, one per line.
steps() { sed -n 's/^(Epoch [0-9]*\/[0-9]*) step [0-9]*\/[0-9]* loss \([0-9.e+-]*\) acc \([0-9.e+-]*\).*/\1 \2/p' "$1"; }

# compare A B LOSS_TOL ACC_TOL [FIRST_N]: step lines of two logs agree.
compare() {
  local a=$1 b=$2 ltol=$3 atol=$4 n=${5:-100000}
  steps "$a" | head -n "$n" >"$WORK/a.steps"
  steps "$b" | head -n "$n" >"$WORK/b.steps"
  [ -s "$WORK/a.steps" ] || { cat "$a"; fail "no step lines in $a"; }
  [ "$(wc -l <"$WORK/a.steps")" = "$(wc -l <"$WORK/b.steps")" ] || fail "step counts differ: $a vs $b"
  paste -d' ' "$WORK/a.steps" "$WORK/b.steps" | awk -v lt="$ltol" -v at="$atol" '
    { dl = $1 - $3; if (dl < 0) dl = -dl; da = $2 - $4; if (da < 0) da = -da;
      printf "step %d: loss %s vs %s (|d| %.2g), acc %s vs %s\n", NR, $1, $3, dl, $2, $4;
      if (dl > lt || da > at + 1e-9) bad = 1 }
    END { exit bad }' || fail "steps differ beyond the error model (loss $ltol, accuracy $atol)"
}

val_loss() { sed -n 's/^(Epoch [0-9]*\/[0-9]*) Val loss: \([^,]*\),.*/\1/p' "$1" | tail -n 1; }

# gpu_then_cpu WHAT ARGS...: the same 2-rank run on the emulated GPU (gpu.log) and on the
# CPU backend in fp32 (cpu.log); the first must have used the emulated device.
gpu_then_cpu() {
  local what=$1
  shift
  note "emulated GPU, $what"
  run 2 "$EMU_BIN" "$WORK/gpu.log" "$@" --device cuda --output-dir "$WORK/gpu"
  grep -q "cuda:0 (Emulated" "$WORK/gpu.log" || { cat "$WORK/gpu.log"; fail "the run did not use the emulated GPU"; }
  note "CPU backend, fp32"
  run 2 "$CPU_BIN" "$WORK/cpu.log" "$@" "${CPU_REF[@]}" --output-dir "$WORK/cpu"
}

# same_val_loss TOL: the last validation loss of gpu.log and cpu.log within TOL.
same_val_loss() {
  awk -v a="$(val_loss "$WORK/gpu.log")" -v b="$(val_loss "$WORK/cpu.log")" -v tol="$1" \
    'BEGIN { d = a - b; if (d < 0) d = -d; printf "val loss %s vs %s\n", a, b; exit !(d <= tol) }' ||
    fail "validation loss differs"
}

case "$CASE" in
  fp32)
    # ResNet-18, SyncBN (default), 2 micro-batches per step, NHWC (the CUDA default).
    gpu_then_cpu fp32 --arch resnet18 --epochs 1 --accum-steps 2
    compare "$WORK/gpu.log" "$WORK/cpu.log" 2e-3 0
    same_val_loss 2e-3
    ;;
  mixup_cutmix)
    # MixUp / CutMix: the draws depend on (seed, epoch, step, rank) alone, so
    # the emulated GPU's mix_images + softmax_xent_mixed must follow the CPU run's steps.
    gpu_then_cpu "fp32, MixUp + CutMix" --arch resnet_tiny --epochs 1 --mixup-alpha 0.2 --cutmix-alpha 1.0
    grep -q "Batch mixing: MixUp or CutMix" "$WORK/gpu.log" || { cat "$WORK/gpu.log"; fail "mixing not on"; }
    compare "$WORK/gpu.log" "$WORK/cpu.log" 2e-3 0
    ;;
  presets)
    # torchvision's reference presets: RandomResizedCrop + TrivialAugmentWide, RandomErasing
    # after Normalize (Backend::erase_rectangles on the device), Resize + CenterCrop
    # evaluation (a crop larger than the resize: CenterCrop's zero padding). The data
    # decisions do not depend on the backend, so fp32's error model applies, over 2 steps:
    # on these augmented images (flat black borders, batches of 4 per rank) float32
    # summation differences grow faster than in case fp32 (measured without erasing:
    # |d| 0, 0, 4e-4, 6.4e-3 at steps 1-4).
    gpu_then_cpu "fp32, presets" --arch resnet18 --epochs 1 --max-steps 2 --train-crop-size 32 --auto-augment ta_wide \
      --random-erase 0.7 --val-resize-size 30 --val-crop-size 32 --normalize imagenet
    compare "$WORK/gpu.log" "$WORK/cpu.log" 2e-3 0
    same_val_loss 2e-3
    ;;
  fp16_overflow)
    # ResNet-50 (bottlenecks) in fp16 with dynamic loss scaling; rank 1 injects an
    # overflow into step 2's gradient: every rank must skip that step (the all-reduce
    # spreads the inf) and training go on with a halved scale. The scale starts at 2:
    # at 32x32 the 1x1 layer4 batch norms over 8 values give activation gradients near
    # 10^3, so 64 and more overflow by themselves.
    args=(--arch resnet50 --epochs 1 --loss-scale 2)
    note "emulated GPU, fp16, overflow injected at step 2 on rank 1"
    RD_INJECT_OVERFLOW_STEP=2 RD_INJECT_OVERFLOW_RANK=1 \
      run 2 "$EMU_BIN" "$WORK/gpu.log" "${args[@]}" --max-steps 3 --device cuda --precision fp16 --output-dir "$WORK/gpu"
    cat "$WORK/gpu.log"
    grep -q "fp16: 1 step skipped for non-finite gradients (loss scale now 1.0)" "$WORK/gpu.log" ||
      fail "the overflow step was not skipped exactly once, with the scale halved"
    # Only the step before the overflow is compared: the reference stops there.
    note "CPU backend, fp32 (the step before the overflow)"
    run 2 "$CPU_BIN" "$WORK/cpu.log" "${args[@]}" --max-steps 1 "${CPU_REF[@]}" --output-dir "$WORK/cpu"
    compare "$WORK/gpu.log" "$WORK/cpu.log" 6e-2 0.125 1
    ;;
  bf16)
    export RD_EMU_DEVICE=a100  # bf16 needs compute capability 8.0
    args=(--arch resnet18 --epochs 1 --no-sync-bn)
    note "emulated A100, bf16"
    run 2 "$EMU_BIN" "$WORK/gpu.log" "${args[@]}" --device cuda --precision bf16 --output-dir "$WORK/gpu"
    note "CPU backend, fp32"
    run 2 "$CPU_BIN" "$WORK/cpu.log" "${args[@]}" "${CPU_REF[@]}" --output-dir "$WORK/cpu"
    compare "$WORK/gpu.log" "$WORK/cpu.log" 6e-2 0.125
    ;;
  preempt_resume)
    # Stop after step 2 of epoch 1 (--max-steps stands in for the signal, which the
    # CPU e2e tests cover), resume, finish; equal to the uninterrupted run.
    args=(--arch resnet18 --epochs 2 --device cuda --checkpoint-every 1)
    note "uninterrupted"
    run 2 "$EMU_BIN" "$WORK/full.log" "${args[@]}" --output-dir "$WORK/full"
    note "preempted after 2 steps, then resumed"
    "$RD_MPIEXEC" --oversubscribe --bind-to none -np 2 "$EMU_BIN" "${COMMON[@]}" "${args[@]}" \
      --output-dir "$WORK/part" >"$WORK/part1.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 600); do
      grep -q "(Epoch 1/2) step 2/" "$WORK/part1.log" 2>/dev/null && break
      sleep 0.1
    done
    rank0=""
    for p in $(pgrep -P "$pid") $(for c in $(pgrep -P "$pid"); do pgrep -P "$c"; done); do
      if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=0"; then rank0=$p; fi
    done
    [ -n "$rank0" ] || { cat "$WORK/part1.log"; fail "cannot find rank 0"; }
    kill -TERM "$rank0" || true  # reported below if the run had already ended
    wait "$pid" || { cat "$WORK/part1.log"; fail "preempted run exited non-zero"; }
    # The signal is honoured at the next step boundary: epoch 1 or, on a slow
    # machine that reached the end of epoch 1 first, epoch 2.
    grep -q -E "^Preempted at epoch [12] step" "$WORK/part1.log" ||
      { cat "$WORK/part1.log"; fail "no preemption (SIGTERM to rank 0 after step 2 of 8)"; }
    run 2 "$EMU_BIN" "$WORK/part2.log" "${args[@]}" --output-dir "$WORK/part"
    grep -q -E "^Resuming from $WORK/part/last.h5 at epoch [12]( step|$)" "$WORK/part2.log" ||
      { cat "$WORK/part2.log"; fail "did not resume"; }
    a=$(val_loss "$WORK/full.log")
    b=$(val_loss "$WORK/part2.log")
    note "final val loss: uninterrupted $a, preempted + resumed $b"
    awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-4) }' ||
      fail "the resumed run does not equal the uninterrupted one"
    ;;
  predict_export)
    args=(--arch resnet18 --epochs 1 --device cuda)
    run 2 "$EMU_BIN" "$WORK/train.log" "${args[@]}" --output-dir "$WORK/out"
    acc=$(sed -n 's/^Best model (val loss: [^,]*, val accuracy: \([^)]*\)).*/\1/p' "$WORK/train.log")
    [ -n "$acc" ] || { cat "$WORK/train.log"; fail "no best model line"; }
    "$EMU_BIN" predict --checkpoint "$WORK/out/best_model.h5" --device cuda --threads 1 --workers 1 \
      --split Validation "$WORK/data" >"$WORK/predict.log" 2>&1 || { cat "$WORK/predict.log"; fail "predict failed"; }
    cat "$WORK/predict.log"
    grep -q "^predict: device cuda:0 (Emulated" "$WORK/predict.log" || fail "predict did not use the emulated GPU"
    pacc=$(grep -o -E '[Aa]ccuracy[: ]+[0-9.]+' "$WORK/predict.log" | head -n 1 | grep -o -E '[0-9.]+$')
    note "validation accuracy: training $acc, predict $pacc"
    awk -v a="$acc" -v b="$pacc" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-6) }' ||
      fail "predict's accuracy differs from the run's"
    "$EMU_BIN" export --checkpoint "$WORK/out/best_model.h5" --out "$WORK/out/model.safetensors" >"$WORK/export.log" 2>&1 ||
      { cat "$WORK/export.log"; fail "export failed"; }
    [ -s "$WORK/out/model.safetensors" ] || fail "no safetensors file"
    ;;
  device_choice)
    # Which GPU each rank takes, said in its start-up line (review ecosystem D2, D15).
    args=(--arch resnet_tiny --epochs 1 --max-steps 1)
    note "all of the node's GPUs visible: local rank i takes GPU i"
    run 2 "$EMU_BIN" "$WORK/all.log" "${args[@]}" --device auto --output-dir "$WORK/all"
    grep -q "^rank 0/2: .* device cuda:0 (Emulated .*, PCI 0000:10:00" "$WORK/all.log" || { cat "$WORK/all.log"; fail "rank 0's GPU"; }
    grep -q "^rank 1/2: .* device cuda:1 (Emulated .*, PCI 0000:11:00" "$WORK/all.log" || { cat "$WORK/all.log"; fail "rank 1's GPU"; }
    note "one GPU per rank (Slurm --gpus-per-task=1 sets CUDA_VISIBLE_DEVICES per task)"
    cat >"$WORK/per_task.sh" <<'WRAP'
#!/bin/bash
export CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK
exec "$@"
WRAP
    chmod +x "$WORK/per_task.sh"
    "$RD_MPIEXEC" --oversubscribe --bind-to none -np 2 "$WORK/per_task.sh" "$EMU_BIN" "${COMMON[@]}" "${args[@]}" \
      --device cuda --output-dir "$WORK/one" >"$WORK/one.log" 2>&1 || { cat "$WORK/one.log"; fail "one GPU per rank"; }
    grep -q "^rank 0/2: .* device cuda:0 (Emulated .*, PCI 0000:10:00" "$WORK/one.log" || { cat "$WORK/one.log"; fail "rank 0 under one GPU per task"; }
    grep -q "^rank 1/2: .* device cuda:0 (Emulated .*, PCI 0000:11:00" "$WORK/one.log" || { cat "$WORK/one.log"; fail "rank 1 under one GPU per task"; }
    grep -q "^(Epoch 1/1) Val loss" "$WORK/one.log" || fail "one GPU per rank did not train"
    note "more ranks than visible GPUs: refused at start"
    rc=0
    "$RD_MPIEXEC" --oversubscribe --bind-to none -np 4 "$EMU_BIN" "${COMMON[@]}" "${args[@]}" --device cuda \
      --output-dir "$WORK/four" >"$WORK/four.log" 2>&1 || rc=$?
    [ "$rc" = 2 ] || { cat "$WORK/four.log"; fail "4 ranks on 2 GPUs exited $rc, expected 2"; }
    grep -q "4 ranks on node .* but 2 GPUs visible" "$WORK/four.log" || { cat "$WORK/four.log"; fail "the reason"; }
    note "no GPU visible: --device auto warns once and uses the CPU"
    CUDA_VISIBLE_DEVICES='' run 2 "$EMU_BIN" "$WORK/none.log" "${args[@]}" --device auto --output-dir "$WORK/none"
    [ "$(grep -c 'WARNING: --device auto: training on the CPU backend' "$WORK/none.log")" = 1 ] || { cat "$WORK/none.log"; fail "one warning"; }
    grep -q "no CUDA device visible (cudaGetDeviceCount: no CUDA-capable device is detected" "$WORK/none.log" || fail "the warning's reason"
    ;;
  *) fail "unknown case $CASE" ;;
esac
echo "PASS: $CASE"
