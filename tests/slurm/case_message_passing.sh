#!/usr/bin/env bash
# jobs/message_passing.slurm across the two emulated nodes (1 rank each) prints the
# tutorial's lines, and the ranks really ran on different nodes.
set -euo pipefail
# shellcheck source=tests/slurm/harness.sh
source "$(dirname "$0")/harness.sh"
: "${RESNET_DDP_MESSAGE_PASSING_BIN:?set it to the message_passing program}"
export RESNET_DDP_MESSAGE_PASSING_BIN
rd_slurm_start 90

# Submitted from an unrelated directory: the script must find its helpers on its own.
cd "$RD_SLURM_DIR/jobs"
job=$(rd_sbatch -N 2 --ntasks-per-node=1 -t 2 "$RD_REPO/jobs/message_passing.slurm")
result=$(rd_slurm_wait "$job" 60)
[[ $result == "COMPLETED 0:0" ]] || { rd_job_log "$job" >&2; rd_fail "job $job ended $result"; }
rd_expect_log "$job" '^Training command: mpirun -np 2 .*/message_passing$' 1
rd_expect_log "$job" '^worker_0 sent data to Rank 1$' 1
rd_expect_log "$job" '^worker_1 has received data from rank 0$' 1
rd_expect_log "$job" '^message_passing.slurm: 2 rank\(s\) on 2 node\(s\) \(1 per node\)' 1
rd_log "PASS: message_passing over 2 emulated nodes"
