#!/usr/bin/env bash
# The private cluster itself: a 2-node job runs one task on each emulated node.
set -euo pipefail
# shellcheck source=tests/slurm/harness.sh
source "$(dirname "$0")/harness.sh"
rd_slurm_start 60

# shellcheck disable=SC2016  # expanded inside the job, not here
job=$(rd_sbatch -J cluster -N 2 --ntasks-per-node=1 -t 1 \
  --wrap 'scontrol show hostnames "$SLURM_JOB_NODELIST"; srun --ntasks-per-node=1 bash -c "echo task on \$SLURMD_NODENAME"')
result=$(rd_slurm_wait "$job" 40)
[[ $result == "COMPLETED 0:0" ]] || { rd_job_log "$job" >&2; rd_fail "job $job ended $result"; }
for node in "${RD_SLURM_NODES[@]}"; do
  rd_expect_log "$job" "^$node\$" 1
  rd_expect_log "$job" "^task on $node\$" 1
done
rd_log "PASS: one task ran on each of ${RD_SLURM_NODES[*]}"
