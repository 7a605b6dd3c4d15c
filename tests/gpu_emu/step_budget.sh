#!/usr/bin/env bash
# The steady-state step's budget on the emulated device: resnet_ddp --device cuda runs N and
# 2N steps of the same epoch (ResNet-18 at 32 px, batch 4) with RD_EMU_STATS, and the
# difference of the two runs' counters, divided by N, is what one steady-state step asks of
# the device (warm-up, validation and shut-down are the same in both runs and cancel).
# Asserted per step and rank: host waits <= the case's bound, no allocation or free, no
# cuDNN Find, NCCL calls = SyncBatchNorm's + the gradient buckets' (0 with one rank).
#   $1 = emulated-device resnet_ddp, $2 = CPU resnet_ddp (makes the data), $3 = mpiexec
set -euo pipefail
EMU_BIN=$1
CPU_BIN=$2
RD_MPIEXEC=$3
export RD_EMU_DEVICE_COUNT=2

# shellcheck source=tests/gpu_emu/common.sh
source "$(dirname "$0")/common.sh" step_budget

# Steps 1-2 (warm-up: allocations, plans, the optimizer's state) cancel; steps 3-4 are
# steady state.
N=2
# 2N steps x 2 ranks x batch 4 x 2 micro-batches: 64 images.
"$CPU_BIN" synth --out "$WORK/data" --train 64 --val 8 --size 32x32 --format png --threads 1 >/dev/null
COMMON=(--data "$WORK/data" --arch resnet18 --image-size 32 --threads 1 --workers 1 --batch-size 4 --augment none
  --epochs 1 --log-every 0 --progress none --tensorboard off --lr 1e-3 --seed 3 --device cuda)


# polls_within_backoff NAME STATS_FILE: a run's not-ready polls against the bound of
# Note [Bounded host polling] (src/backend/cuda/nccl_comm.cpp): per wait POLLS_BEFORE_CAP,
# plus one per POLL_CAP_US of host time between two polls of it (query_not_ready_gap_us:
# the emulated work inside the queries left out). Counted over the whole run, warm-up
# included, so the figures of one run bound it exactly; a fixed 20 us poll makes several
# times more.
polls_within_backoff() {
  local polls waits gap bound
  polls=$(counter "$2" host_waits.query_not_ready)
  waits=$(counter "$2" query_not_ready_first)
  gap=$(counter "$2" query_not_ready_gap_us)
  bound=$(awk -v w="$waits" -v k="$POLLS_BEFORE_CAP" -v g="$gap" -v c="$POLL_CAP_US" 'BEGIN { printf "%d", w * k + g / c }')
  echo "$1 $(basename "$2"): $polls not-ready polls in $waits waits, $((gap / 1000)) ms between polls: bound $bound"
  [ "$polls" -le "$bound" ] || fail "$1: $polls not-ready polls in $(basename "$2"), the backoff allows $bound"
}

# budget NAME NP MAX_HOST_WAITS NCCL_PER_STEP ALLOCS_PER_STEP ARGS...: one case. With
# GRAPHS_PER_STEP set: that many CUDA graph launches per step, asserted (and N from the caller);
# with MAX_KERNELS_PER_STEP set: at most that many kernel launches per step.
budget() {
  local name=$1 np=$2 max_waits=$3 nccl_expected=$4 allocs_expected=$5
  shift 5
  local steps
  for steps in $N $((2 * N)); do
    rm -rf "$WORK/out"
    RD_EMU_STATS="$WORK/$name.$steps" "$RD_MPIEXEC" --oversubscribe --bind-to none -np "$np" "$EMU_BIN" \
      "${COMMON[@]}" --max-steps "$steps" --output-dir "$WORK/out" "$@" >"$WORK/log" 2>&1 ||
      { cat "$WORK/log"; fail "$name: resnet_ddp --max-steps $steps exited non-zero"; }
    grep -q "cuda:0 (Emulated" "$WORK/log" || { cat "$WORK/log"; fail "$name: the run did not use the emulated GPU"; }
  done
  local rank what short long per
  for ((rank = 0; rank < np; ++rank)); do
    local line="$name rank $rank per step:"
    declare -A got=()
    for what in host_waits allocs frees cudnn_find nccl kernel_launches graph_launches host_waits.stream_sync \
      host_waits.event_sync host_waits.blocking_copy host_waits.pageable_copy host_waits.query_not_ready \
      query_not_ready_first query_not_ready_gap_us; do
      short=$(counter "$WORK/$name.$N.rank$rank" "$what")
      long=$(counter "$WORK/$name.$((2 * N)).rank$rank" "$what")
      if [ "$short" = missing ] || [ "$long" = missing ]; then fail "$name: no counter $what in the stats files"; fi
      per=$(awk -v a="$short" -v b="$long" -v n="$N" 'BEGIN { printf "%g", (b - a) / n }')
      got[$what]=$per
      line+=" $what $per"
    done
    echo "$line"
    # Several ranks: the bucket waits' host polls (queries that found the collective still
    # running) depend on the other rank's timing, so the blocking waits are held to the
    # budget, and the polls to the backoff's bound (polls_within_backoff) in each run.
    local waits=${got[host_waits]}
    if [ "$np" != 1 ]; then
      waits=$(awk -v a="$waits" -v q="${got[host_waits.query_not_ready]}" 'BEGIN { printf "%g", a - q }')
      echo "$name rank $rank: ${got[host_waits.query_not_ready]} not-ready polls per step in" \
        "${got[query_not_ready_first]} waits, $(awk -v g="${got[query_not_ready_gap_us]}" \
          'BEGIN { printf "%.1f", g / 1000 }') ms between polls"
      polls_within_backoff "$name" "$WORK/$name.$N.rank$rank"
      polls_within_backoff "$name" "$WORK/$name.$((2 * N)).rank$rank"
    fi
    awk -v p="$waits" -v m="$max_waits" 'BEGIN { exit !(p <= m) }' ||
      fail "$name: $waits host waits per step, the budget is $max_waits"
    for what in allocs frees; do
      [ "${got[$what]}" = "$allocs_expected" ] || fail "$name: ${got[$what]} $what per step, expected $allocs_expected"
    done
    [ "${got[cudnn_find]}" = 0 ] || fail "$name: ${got[cudnn_find]} cuDNN Finds per step, expected 0"
    [ "${got[nccl]}" = "$nccl_expected" ] || fail "$name: ${got[nccl]} NCCL calls per step, expected $nccl_expected"
    [ -z "${GRAPHS_PER_STEP:-}" ] || [ "${got[graph_launches]}" = "$GRAPHS_PER_STEP" ] ||
      fail "$name: ${got[graph_launches]} graph launches per step, expected $GRAPHS_PER_STEP"
    [ -z "${MAX_KERNELS_PER_STEP:-}" ] ||
      awk -v k="${got[kernel_launches]}" -v m="$MAX_KERNELS_PER_STEP" 'BEGIN { exit !(k <= m) }' ||
      fail "$name: ${got[kernel_launches]} kernel launches per step, at most $MAX_KERNELS_PER_STEP expected"
    unset got
  done
}

# NCCL per step: none with one rank; on two, the gradient buckets all-reduce once per step
# (ResNet-18's 44.7 MB in 25 MB buckets: BUCKETS) and SyncBatchNorm twice per batch norm
# and micro-batch (20 batch norms: statistics forward, gradient sums backward).
BUCKETS=3
SYNC_BN=40
# PollBackoff's kPollsBeforeCap and kMaxPollSleep (src/backend/cuda/nccl_comm.cpp).
POLLS_BEFORE_CAP=10
POLL_CAP_US=500
export RD_EMU_DEVICE=a100  # bf16 needs compute capability 8.0
# Host waits per step: at most one, for the previous step's sums (on the emulated device
# the queue has run by then, so it counts 0). fp16 is held to that 0: its overflow
# decision, loss scale and step count stay on the device (Backend::amp_unscale), and a
# host read of the verdict (a wait the emulator counts even when the queue has run)
# would make it 1.
budget fp32_1rank 1 1 0 0 --precision fp32
budget bf16_1rank 1 1 0 0 --precision bf16
budget fp16_1rank 1 0 0 0 --precision fp16
budget ema_1rank 1 1 0 0 --precision fp32 --model-ema --model-ema-steps 1
# MixUp / CutMix: the mixed copy of the input is allocated once (warm-up), then reused.
budget mixing_1rank 1 1 0 0 --precision fp32 --mixup-alpha 0.2 --cutmix-alpha 1.0
# Two ranks, eager: the collectives as the step issues them (replayed graphs issue them
# without a host call: the graphs cases below).
budget syncbn_accum_2ranks 2 1 $((BUCKETS + 2 * SYNC_BN)) 0 --precision fp32 --sync-bn --accum-steps 2 --cuda-graphs off
# --cuda-graphs (on by default): the cases above record their forward, backward and
# optimizer graphs in steps 3-4, so their counts are those of the work as issued; an NCCL
# call made while recording counts once, its replays are graph launches. From step 5 on,
# each step replays its forward, its backward and its optimizer step, three launches, and
# issues two kernels of its own (the upload's conversion and the loss sums' reset; the eager
# fp16 optimizer added three: the unscale, its verdict and the update). On two ranks the
# replays hold every collective (SyncBatchNorm's and the buckets'): no NCCL call and no
# blocking host wait per step; the host waits for the buckets only at the next read-back,
# polling within the backoff's bound and the collective deadline.
N=4 GRAPHS_PER_STEP=3 MAX_KERNELS_PER_STEP=2 budget graphs_fp16_1rank 1 0 0 0 --precision fp16
N=4 GRAPHS_PER_STEP=3 MAX_KERNELS_PER_STEP=2 budget graphs_fp16_2ranks 2 0 0 0 --precision fp16 --sync-bn
echo "step budget: every case within its bounds"
