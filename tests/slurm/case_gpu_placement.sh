#!/usr/bin/env bash
# A 4-GPU node shape under Slurm (gres/gpu, played by the emulated CUDA device): the GPU
# job script's default launcher gives every rank its own cores near its GPU, never one
# core. Each rank records its Cpus_allowed_list as the job ran it (a wrapper around
# resnet_ddp): with the cores for it (>= 2 per rank) the 4 sets are disjoint and as large
# as the binding says; on a smaller machine the ranks are not bound and each may use all
# of the job's CPUs. The job log names the binding.
set -euo pipefail
export RD_SLURM_GPUS=4  # read by harness.sh: four GPUs (and four CPUs) per emulated node
# shellcheck source=tests/slurm/harness.sh
source "$(dirname "$0")/harness.sh"
# shellcheck source=tests/slurm/train_common.sh
source "$(dirname "$0")/train_common.sh"
RD_SCRIPT_NAME=case_gpu_placement
# shellcheck source=jobs/common.sh
source "$RD_REPO/jobs/common.sh"
rd_slurm_start 260
rd_make_dataset 16 8 32x32
export RD_EMU_DEVICE_COUNT=4
# Each rank prints its allowed CPUs, then runs the real program.
wrapper=$RD_SLURM_DIR/resnet_ddp_recording_cpus
cat >"$wrapper" <<WRAP
#!/bin/sh
echo "placement: rank \${OMPI_COMM_WORLD_RANK:-?} \$(grep Cpus_allowed_list /proc/self/status)"
exec "$RESNET_DDP_BIN" "\$@"
WRAP
chmod +x "$wrapper"
export RESNET_DDP_BIN=$wrapper
unset RESNET_DDP_LAUNCHER
cd "$RD_SLURM_DIR/jobs"
job=$(rd_sbatch -N 1 --ntasks-per-node=4 --gpus-per-node=4 -t 3 "$RD_REPO/jobs/frontera_rtx.slurm" \
  --arch resnet_tiny --image-size 32 --batch-size 2 --epochs 1 --max-steps 1 --augment none \
  --output-dir "$RD_SLURM_DIR/out")
result=$(rd_slurm_wait "$job" 150)
[[ $result == "COMPLETED 0:0" ]] || { rd_job_log "$job" >&2; rd_fail "4-GPU job $job ended $result"; }
rd_expect_log "$job" "^frontera_rtx.slurm: GPU ranks: each on its own cores near its GPU" 1
gpu_binding=$(rd_mpirun_gpu_binding 4 1 4 "$(rd_node_cores)" "$(rd_node_sockets)")
rd_expect_log "$job" "^Training command: mpirun -np 4 ${gpu_binding//./\\.} " 1
lists=$(rd_job_log "$job" | sed -n 's/^placement: rank [0-9]* Cpus_allowed_list:[[:space:]]*//p')
[[ $(wc -l <<<"$lists") == 4 ]] || { rd_job_log "$job" >&2; rd_fail "expected 4 ranks' Cpus_allowed_list, got: $lists"; }
job_cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
all=()
while read -r list; do
  cpus=()
  for range in ${list//,/ }; do
    for ((cpu = ${range%-*}; cpu <= ${range#*-}; cpu++)); do cpus+=("$cpu"); done
  done
  ((${#cpus[@]} >= 2)) || rd_fail "a GPU rank ran on one core: Cpus_allowed_list $list"
  if [[ $gpu_binding == *PE=* ]]; then
    pe=${gpu_binding#*PE=}
    pe=${pe%% *}
    ((${#cpus[@]} == pe)) || rd_fail "a rank may use $list, not the $pe cores of its binding"
  else
    [[ $list == "$job_cpus" ]] || rd_fail "unbound rank may use $list, not all of the job's CPUs $job_cpus"
  fi
  all+=("${cpus[@]}")
done <<<"$lists"
if [[ $gpu_binding == *PE=* ]]; then
  [[ $(printf '%s\n' "${all[@]}" | sort -u | wc -l) == "${#all[@]}" ]] ||
    rd_fail "the 4 ranks' core sets overlap: $(tr '\n' ' ' <<<"$lists")"
fi
rd_expect_log "$job" "^\\(Epoch 1/1\\) Val loss: " 1
rd_log "PASS: 4 GPU ranks under $gpu_binding; their allowed CPUs: $(tr '\n' ' ' <<<"$lists")"
