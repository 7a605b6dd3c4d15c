#!/usr/bin/env bash
# Two experiments in one job script share an --output-dir: the second (another --lr) is
# refused with the difference listed, started by `srun --mpi=pmix` (another job step) as by
# `mpirun` (the job scripts' default launcher). Then the job requeues itself, and its
# restart continues the run with other flags unasked: only a requeue of the job that
# wrote the checkpoint may .
set -euo pipefail
# shellcheck source=tests/slurm/harness.sh
source "$(dirname "$0")/harness.sh"
# shellcheck source=tests/slurm/train_common.sh
source "$(dirname "$0")/train_common.sh"
rd_slurm_start 280
data=$RD_SLURM_DIR/data
"$RESNET_DDP_BIN" synth --out "$data" --train 16 --val 8 --size 32x32 --threads 1 >"$RD_SLURM_DIR/synth.log" 2>&1 ||
  { cat "$RD_SLURM_DIR/synth.log" >&2; rd_fail "resnet_ddp synth failed"; }
out=$RD_SLURM_DIR/run

# One rank per experiment; `run` prints its exit status so the log shows each outcome.
script=$RD_SLURM_DIR/two_experiments.slurm
cat >"$script" <<EOF
#!/usr/bin/env bash
#SBATCH --requeue
#SBATCH --open-mode=append
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
args=(--data $data --arch resnet_tiny --image-size 32 --batch-size 4 --workers 1 --threads 1 --augment none
  --output-dir $out)
run() { "\$@" "\${args[@]}" --epochs "\$EPOCHS" --lr "\$LR"; echo "experiment exit \$?"; }
echo "job \$SLURM_JOB_ID restart \${SLURM_RESTART_COUNT:-0}"
if [[ \${SLURM_RESTART_COUNT:-0} == 0 ]]; then
  EPOCHS=1 LR=1e-4 run srun --mpi=pmix -n 1 $RESNET_DDP_BIN
  EPOCHS=1 LR=1e-2 run srun --mpi=pmix -n 1 $RESNET_DDP_BIN
  EPOCHS=1 LR=1e-3 run mpirun --oversubscribe -np 1 $RESNET_DDP_BIN
  scontrol requeue "\$SLURM_JOB_ID"
else
  EPOCHS=2 LR=1e-4 run srun --mpi=pmix -n 1 $RESNET_DDP_BIN
fi
EOF

job=$(rd_sbatch -J twoexp -N 1 -n 1 -t 5 "$script")
result=$(
  start=$SECONDS
  while ((SECONDS - start < 240)); do
    state=$(rd_job_field "$job" JobState)
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL) break ;;
    esac
    sleep 0.5
  done
  echo "$state restarts $(rd_job_field "$job" Restarts)"
)
[[ $result == "COMPLETED restarts 1" ]] || { rd_job_log "$job" >&2; rd_fail "job $job ended '$result', expected COMPLETED after 1 requeue"; }
rd_job_log "$job" >&2

rd_log "restart 0: the first experiment trains, the two others are refused with the difference"
rd_expect_log "$job" "^job $job restart 0\$" 1
rd_expect_log "$job" "^experiment exit 0\$" 2
rd_expect_log "$job" "^experiment exit 2\$" 2
rd_expect_log "$job" "holds another run \\($out/last.h5, 1 epoch\\(s\\) done\\) whose settings differ" 2
rd_expect_log "$job" "^  --lr 0.01 \\(that run: 0.0001\\)\$" 1
rd_expect_log "$job" "^  --lr 0.001 \\(that run: 0.0001\\)\$" 1
rd_expect_log "$job" "^\\(Slurm job $job: only a requeue of the job that wrote the checkpoint \\(job $job step 0, restart 0\\) continues it unasked\\)\$" 2

rd_log "restart 1: the requeue continues with --epochs 2 unasked"
rd_expect_log "$job" "^job $job restart 1\$" 1
rd_expect_log "$job" "^Resuming from $out/last.h5 at epoch 2\$" 1
rd_expect_log "$job" "^Resume: --epochs 2 instead of the checkpoint's 1\$" 1
rd_expect_log "$job" "^\\(Epoch 2/2\\) Val loss: " 1
"$RESNET_DDP_BIN" info "$out/last.h5" >"$RD_SLURM_DIR/info.txt" || rd_fail "info $out/last.h5"
grep -q -E "^resume 1: .* --epochs 2 --lr 1e-4\$" "$RD_SLURM_DIR/info.txt" ||
  { cat "$RD_SLURM_DIR/info.txt" >&2; rd_fail "last.h5 does not record the requeue's resume"; }
rd_log "PASS: another experiment in the job refused, the job's requeue continued"
