#!/usr/bin/env bash
# A plain `scancel` of a running jobs/cpu.slurm job keeps the work: Slurm sends SIGTERM to
# every process of the job, the ranks finish their step and rank 0 saves last.h5 before
# mpirun's SIGKILL (the script raises its grace, OMPI_MCA_odls_base_sigkill_timeout) and
# Slurm's (KillWait); a job resubmitted on that folder resumes there, and finds the lock
# released by a clean exit (a killed run would leave it "without releasing it").
set -euo pipefail
# shellcheck source=tests/slurm/harness.sh
source "$(dirname "$0")/harness.sh"
# shellcheck source=tests/slurm/train_common.sh
source "$(dirname "$0")/train_common.sh"
rd_slurm_start 200
rd_make_dataset 48 12 40x40
out=$RD_SLURM_DIR/out
common=(--arch resnet_tiny --image-size 32 --batch-size 2 --workers 1 --augment none --log-every 0
  --tensorboard off --output-dir "$out")

cd "$RD_SLURM_DIR/jobs"
job=$(rd_sbatch -N 2 --ntasks-per-node=1 -t 5 "$RD_REPO/jobs/cpu.slurm" "${common[@]}" --epochs 1000)
rd_wait_for_log "$job" '^\(Epoch 3/1000\) Time: ' 90
timeout 10 scancel "$job"
result=$(rd_slurm_wait "$job" 60)
[[ $result == CANCELLED* ]] || { rd_job_log "$job" >&2; rd_fail "cancelled job $job ended $result"; }
[[ -f $out/last.h5 ]] || { rd_job_log "$job" >&2; rd_fail "no $out/last.h5 after scancel"; }
info=$("$RESNET_DDP_BIN" info "$out/last.h5" | grep '^epoch: ')
if [[ $info =~ ^epoch:\ +([0-9]+)\ completed\ \+\ ([0-9]+)\ steps ]]; then
  at="epoch $((BASH_REMATCH[1] + 1)) step ${BASH_REMATCH[2]}"
  total=$((BASH_REMATCH[1] + 1))
elif [[ $info =~ ^epoch:\ +([0-9]+)\ completed$ ]]; then
  at="epoch $((BASH_REMATCH[1] + 1))"
  total=$((BASH_REMATCH[1] + 1))
else
  rd_fail "unexpected last.h5: $info"
fi
((total >= 3)) || rd_fail "last.h5 ($info) predates the cancel"
rd_log "cancelled; last.h5: $info"

# Resubmitted on the same folder (the script's default folder is per submission).
# A new job (not a requeue) that changes a flag (--epochs) continues the run only when
# asked: --resume auto.
job=$(rd_sbatch -N 2 --ntasks-per-node=1 -t 5 "$RD_REPO/jobs/cpu.slurm" "${common[@]}" --epochs "$total" --resume auto)
result=$(rd_slurm_wait "$job" 120)
[[ $result == "COMPLETED 0:0" ]] || { rd_job_log "$job" >&2; rd_fail "resumed job $job ended $result"; }
rd_expect_log "$job" "^Resuming from $out/last.h5 at $at\$" 1
rd_expect_log "$job" "ended without releasing it" 0
rd_expect_log "$job" "^Distributed environment has been properly closed\$" 1
rd_log "PASS: scancel saved last.h5 ($info) and the resubmitted job resumed at $at"
