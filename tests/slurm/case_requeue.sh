#!/usr/bin/env bash
# Preemption with automatic requeue: jobs/cpu.slurm (2 nodes x 1 rank, --deterministic,
# --checkpoint-every 2, no --output-dir) gets SIGUSR1 mid-epoch the way its
# --signal=B:USR1@120 line delivers it. Training saves last.h5 at the step, the script
# runs `scontrol requeue`, and the same job id comes back, appends to its log
# (--open-mode=append), resumes at that step from output_model/<job name>_<job id>/last.h5
# and finishes every epoch with the same final parameters as a job that was never
# interrupted. Both jobs have one name: the second submission must not continue the
# first one's finished run (each submission gets its own folder).
set -euo pipefail
# shellcheck source=tests/slurm/harness.sh
source "$(dirname "$0")/harness.sh"
# shellcheck source=tests/slurm/train_common.sh
source "$(dirname "$0")/train_common.sh"
rd_slurm_start 400
command -v h5diff >/dev/null || rd_skip "h5diff (Debian hdf5-tools) is not installed"
rd_make_dataset 40 8 40x40
args=(--arch resnet_tiny --image-size 64 --batch-size 2 --workers 1 --augment none --epochs 3 --deterministic
  --conv-algo direct --checkpoint-every 2 --log-every 1 --progress lines)

cd "$RD_SLURM_DIR/jobs"
# wait_done JOB TIMEOUT: the job's final state once it ended (a requeue passes through
# REQUEUED/PENDING on the way).
wait_done() {
  local job=$1 start=$SECONDS state
  while ((SECONDS - start < $2)); do
    state=$(rd_job_field "$job" JobState)
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
        echo "$state $(rd_job_field "$job" ExitCode) restarts $(rd_job_field "$job" Restarts)"
        return 0
        ;;
    esac
    sleep 0.5
  done
  rd_log "job $job still ${state:-unknown} after $2 s; log:"
  rd_job_log "$job" >&2 || true
  return 1
}

rd_log "reference: the same job, never interrupted"
ref=$(rd_sbatch -J rq -N 2 --ntasks-per-node=1 -t 5 "$RD_REPO/jobs/cpu.slurm" "${args[@]}")
result=$(wait_done "$ref" 150)
[[ $result == "COMPLETED 0:0 restarts 0" ]] || { rd_job_log "$ref" >&2; rd_fail "reference job $ref ended $result"; }
rd_expect_log "$ref" "^Training command: .* --output-dir output_model/rq_$ref .*--epochs 3 " 1
[[ -f output_model/rq_$ref/last.h5 ]] || rd_fail "no output_model/rq_$ref/last.h5 (the per-submission default folder)"

# The signal goes out at epoch 1 step 4 of 3 x 10 steps; how far training gets before
# it lands depends on the machine (scancel's round trip through slurmctld), so any
# stop counts, in any epoch but after the last step. At an epoch's last step (step 10
# of 10) two stops print the same line: a signal seen during the step saves before the
# epoch's validation (the job resumes at that step and validates), one seen after it
# stops after the validation (the job resumes at the next epoch).
rd_log "the same job, signalled in the middle of epoch 1"
job=$(rd_sbatch -J rq -N 2 --ntasks-per-node=1 -t 5 "$RD_REPO/jobs/cpu.slurm" "${args[@]}")
rd_wait_for_log "$job" '^\(Epoch 1/3\) step 4/' 120
timeout 10 scancel --batch --signal=USR1 "$job"
# Slurm holds a requeued job back for AuthInfo's cred_expire (20 s in the harness).
result=$(wait_done "$job" 240)
[[ $result == "COMPLETED 0:0 restarts 1" ]] || { rd_job_log "$job" >&2; rd_fail "job $job ended $result, expected COMPLETED after 1 requeue"; }
out=$PWD/output_model/rq_$job
line=$(rd_job_log "$job" | grep -E "^Preempted at epoch [1-3] step [0-9]+; checkpoint saved to $out/last.h5\$") ||
  { rd_job_log "$job" >&2; rd_fail "no preemption"; }
epoch=${line#Preempted at epoch }
epoch=${epoch%% *}
step=${line#Preempted at epoch "$epoch" step }
step=${step%%;*}
rd_expect_log "$job" "^cpu.slurm: got SIGUSR1: passing it to the launcher" 1
rd_expect_log "$job" "^cpu.slurm: requeueing job $job \\(scontrol requeue\\); it resumes from its last.h5\$" 1
resume_at="epoch $epoch step $step"
[[ $step == 10 ]] && resume_at="(epoch $epoch step 10|epoch $((epoch + 1)))"
rd_expect_log "$job" "^Resuming from output_model/rq_$job/last.h5 at $resume_at\$" 1
rd_expect_log "$job" "^\\(Epoch 3/3\\) Val loss: " 1
rd_expect_log "$job" "^Distributed environment has been properly closed\$" 2
# Both runs of the job wrote to the one log.
rd_expect_log "$job" "^cpu.slurm: job $job " 2
rd_log "preempted at epoch $epoch step $step, requeued, resumed and finished"

for group in /state_dict /optimizer; do
  h5diff "output_model/rq_$ref/last.h5" "$out/last.h5" "$group" "$group" >"$RD_SLURM_DIR/h5diff.txt" 2>&1 ||
    { cat "$RD_SLURM_DIR/h5diff.txt" >&2; rd_fail "$group differs between the requeued and the uninterrupted job"; }
done
ref_val=$(rd_job_log "$ref" | grep '^(Epoch 3/3) Val loss')
got_val=$(rd_job_log "$job" | grep '^(Epoch 3/3) Val loss')
[[ $ref_val == "$got_val" ]] || rd_fail "final validation differs: '$got_val' vs '$ref_val'"
rd_log "PASS: the requeued job ended with bit-identical parameters and optimizer state ($ref_val)"
