#!/usr/bin/env bash
# jobs/frontera_rtx.slurm (sized down to 2 nodes x 1 CPU rank) is preempted the way its
# --signal=B:USR1@120 line does it near the time limit: SIGUSR1 to the batch script only.
# The script passes it on, training saves last.h5 and the job ends cleanly, staged data
# removed; the resubmitted job resumes from last.h5 and completes.
set -euo pipefail
# shellcheck source=tests/slurm/harness.sh
source "$(dirname "$0")/harness.sh"
# shellcheck source=tests/slurm/train_common.sh
source "$(dirname "$0")/train_common.sh"
rd_slurm_start 200
rd_make_dataset 48 12 40x40
out=$RD_SLURM_DIR/out
# CPU nodes: the GPU script asks for --device cuda unless told otherwise.
common=(--device cpu --arch resnet_tiny --image-size 32 --batch-size 2 --workers 1 --augment none --output-dir "$out")

# The manual path: the job ends after its clean stop instead of requeueing itself
# (case_requeue.sh covers the requeue).
export RESNET_DDP_REQUEUE=0
cd "$RD_SLURM_DIR/jobs"
# Many epochs: the signal must land while training runs.
job=$(rd_sbatch -N 2 --ntasks-per-node=1 -t 5 "$RD_REPO/jobs/frontera_rtx.slurm" "${common[@]}" --epochs 1000)
rd_wait_for_log "$job" '^\(Epoch 1/1000\) Time: ' 90
timeout 10 scancel --batch --signal=USR1 "$job"
result=$(rd_slurm_wait "$job" 60)
[[ $result == "COMPLETED 0:0" ]] || { rd_job_log "$job" >&2; rd_fail "preempted job $job ended $result"; }
rd_expect_log "$job" "^Training command: mpirun -np 2 .*/resnet_ddp --data $RD_STAGE/%n/Dataset_2 --threads 1 --device cpu --arch resnet_tiny .* --epochs 1000\$" 1
rd_expect_log "$job" "^frontera_rtx.slurm: got SIGUSR1: passing it to the launcher" 1
rd_expect_log "$job" "^Preempted at epoch [0-9]+ step [0-9]+; checkpoint saved to $out/last.h5\$" 1
[[ -f $out/last.h5 ]] || rd_fail "no $out/last.h5 after preemption"
rd_expect_staged_and_removed "$job"
epoch=$(rd_job_log "$job" | sed -n 's/^Preempted at epoch \([0-9]*\) step.*/\1/p')
rd_log "preempted in epoch $epoch; checkpoint saved"

# Resubmit; fewer epochs so the test stays short: finish the interrupted epoch and one more.
total=$((epoch + 1))
# A new job (not a requeue) that changes a flag (--epochs) continues the run only when
# asked: --resume auto.
job=$(rd_sbatch -N 2 --ntasks-per-node=1 -t 5 "$RD_REPO/jobs/frontera_rtx.slurm" "${common[@]}" --epochs "$total" --resume auto)
result=$(rd_slurm_wait "$job" 120)
[[ $result == "COMPLETED 0:0" ]] || { rd_job_log "$job" >&2; rd_fail "resumed job $job ended $result"; }
rd_expect_log "$job" "^Resuming from $out/last.h5 at epoch ($epoch|$((epoch + 1)))( step [0-9]+)?$" 1
rd_expect_log "$job" "^\\(Epoch 1/$total\\) " 0
rd_expect_log "$job" "^\\(Epoch $total/$total\\) Val loss: " 1
rd_expect_log "$job" "^Distributed environment has been properly closed\$" 1
rd_expect_staged_and_removed "$job"
rd_log "PASS: USR1 preemption saved last.h5; the resubmitted job resumed in epoch $epoch and finished"
