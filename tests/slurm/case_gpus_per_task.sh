#!/usr/bin/env bash
# The GPU job script under a Slurm whose nodes have GPUs (gres/gpu, played by the emulated
# CUDA device): with --gpus-per-task=1 Slurm shows each task only its own GPU
# (CUDA_VISIBLE_DEVICES=0 and =1), so both ranks use their cuda:0 and the start-up lines
# name two different GPUs; with --gpus-per-node=2 and mpirun every rank sees both and local
# rank i takes GPU i. Both train to the end on the GPU path, not on the CPU.
set -euo pipefail
export RD_SLURM_GPUS=2  # read by harness.sh: two GPUs (and two CPUs) per emulated node
# shellcheck source=tests/slurm/harness.sh
source "$(dirname "$0")/harness.sh"
# shellcheck source=tests/slurm/train_common.sh
source "$(dirname "$0")/train_common.sh"
rd_slurm_start 260
rd_make_dataset 16 8 32x32
export RD_EMU_DEVICE_COUNT=2  # the emulated node's GPUs (CUDA_VISIBLE_DEVICES filters them)
args=(--arch resnet_tiny --image-size 32 --batch-size 4 --epochs 1 --workers 1 --augment none)
cd "$RD_SLURM_DIR/jobs"

# srun starts the ranks, one GPU bound to each task.
export RESNET_DDP_LAUNCHER="srun --mpi=pmix"
job=$(rd_sbatch -N 1 --ntasks-per-node=2 --gpus-per-task=1 -t 3 "$RD_REPO/jobs/frontera_rtx.slurm" \
  "${args[@]}" --output-dir "$RD_SLURM_DIR/per_task")
result=$(rd_slurm_wait "$job" 100)
[[ $result == "COMPLETED 0:0" ]] || { rd_job_log "$job" >&2; rd_fail "--gpus-per-task=1 job $job ended $result"; }
rd_expect_log "$job" "^Training command: srun --mpi=pmix .*--device cuda" 1
rd_expect_log "$job" "^rank 0/2: .* device cuda:0 \\(Emulated .*, PCI 0000:10:00" 1
rd_expect_log "$job" "^rank 1/2: .* device cuda:0 \\(Emulated .*, PCI 0000:11:00" 1
rd_expect_log "$job" "^\\(Epoch 1/1\\) Val loss: " 1
rd_expect_log "$job" "^Distributed environment has been properly closed\$" 1
rd_log "--gpus-per-task=1: each rank on its own GPU"

# mpirun starts the ranks, both GPUs visible to each: local rank i takes GPU i.
unset RESNET_DDP_LAUNCHER
job=$(rd_sbatch -N 1 --ntasks-per-node=2 --gpus-per-node=2 -t 3 "$RD_REPO/jobs/frontera_rtx.slurm" \
  "${args[@]}" --output-dir "$RD_SLURM_DIR/per_node")
result=$(rd_slurm_wait "$job" 100)
[[ $result == "COMPLETED 0:0" ]] || { rd_job_log "$job" >&2; rd_fail "--gpus-per-node=2 job $job ended $result"; }
rd_expect_log "$job" "^rank 0/2: .* device cuda:0 \\(Emulated .*, PCI 0000:10:00" 1
rd_expect_log "$job" "^rank 1/2: .* device cuda:1 \\(Emulated .*, PCI 0000:11:00" 1
rd_expect_log "$job" "^\\(Epoch 1/1\\) Val loss: " 1
rd_log "PASS: GPU job script under gres/gpu: one GPU per task and all GPUs per node each pick the right device"
