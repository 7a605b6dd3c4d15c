#!/usr/bin/env bash
# jobs/imagenet.slurm as a user submits it: an ImageNet-layout archive (imagenet/{train,val})
# staged to both nodes, the torchvision-resnet-v1 recipe printed in full at start, the
# user's flags after it winning (a tiny model and crop here), top-1/top-5 at the end, and
# the staged copy removed. On the emulated GPUs, as the script is a GPU job.
set -euo pipefail
export RD_SLURM_GPUS=1  # read by harness.sh: one GPU per emulated node
# shellcheck source=tests/slurm/harness.sh
source "$(dirname "$0")/harness.sh"
# shellcheck source=tests/slurm/train_common.sh
source "$(dirname "$0")/train_common.sh"
rd_slurm_start 260
data=$RD_SLURM_DIR/data
mkdir -p "$data/src"
"$RESNET_DDP_BIN" synth --out "$data/src/imagenet" --train 16 --val 8 --size 48x40 --threads 1 \
  >"$data/synth.log" 2>&1 || { cat "$data/synth.log" >&2; rd_fail "resnet_ddp synth failed"; }
mv "$data/src/imagenet/Train" "$data/src/imagenet/train"
mv "$data/src/imagenet/Validation" "$data/src/imagenet/val"
tar -cf "$data/imagenet.tar" -C "$data/src" imagenet
export RESNET_DDP_DATA_SRC=$data/imagenet.tar RESNET_DDP_STAGE_DIR=$RD_SLURM_DIR/data/stage/%n
export RESNET_DDP_MODULES="" RD_EMU_DEVICE_COUNT=1
cd "$RD_SLURM_DIR/jobs"
job=$(rd_sbatch -N 2 --ntasks-per-node=1 --gpus-per-task=1 -t 3 "$RD_REPO/jobs/imagenet.slurm" \
  --arch resnet_tiny --epochs 1 --batch-size 4 --train-crop-size 32 --val-resize-size 36 --val-crop-size 32 \
  --workers 1 --output-dir "$RD_SLURM_DIR/out")
result=$(rd_slurm_wait "$job" 150)
[[ $result == "COMPLETED 0:0" ]] || { rd_job_log "$job" >&2; rd_fail "imagenet job $job ended $result"; }
# Anywhere in a line: the ranks' stdout and stderr reach the job log through mpirun apart.
rd_expect_log "$job" "Recipe torchvision-resnet-v1: --head fc .*--lr 0\\.1 .*--train-crop-size 224 " 1
rd_expect_log "$job" "^Training command: .*--device cuda" 1
rd_expect_log "$job" "^Train set size: 16, Validation set size: 8" 1
rd_expect_log "$job" "^\\(Epoch 1/1\\) Val loss: " 1
rd_expect_log "$job" "Acc@1 [0-9.]+ Acc@5 [0-9.]+" 1
rd_expect_log "$job" "^Distributed environment has been properly closed\$" 1
for node in "${RD_SLURM_NODES[@]}"; do
  rd_expect_log "$job" "^stage_data.sh: node $node: staged imagenet.tar to $RD_SLURM_DIR/data/stage/$node/imagenet " 1
done
leftover=$(find "$RD_SLURM_DIR/data/stage" -mindepth 2 2>/dev/null || true)
[[ -z $leftover ]] || rd_fail "staged data left behind after job $job: $leftover"
rd_log "PASS: jobs/imagenet.slurm staged an ImageNet-layout archive, ran the recipe with the user's flags winning"
