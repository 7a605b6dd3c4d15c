#!/usr/bin/env bash
# A launcher that starts N tasks without giving them one MPI world (srun without PMI,
# torchrun) makes N lone trainings: resnet_ddp must refuse with exit 2 and the fix.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 8 4
args=(--data "$WORK/data" "${TINY[@]}" --batch-size 2 --epochs 1 --max-steps 1 --conv-algo direct)
# A clean environment: no launcher variables from whoever runs the tests.
clean=(env -u SLURM_STEP_ID -u SLURM_STEPID -u SLURM_NTASKS -u SLURM_NPROCS -u SLURM_PROCID -u WORLD_SIZE -u RANK
  -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u PMI_SIZE -u PMI_RANK -u PMIX_RANK)

# expect_refusal NAME VAR=VALUE...: one process started as if by that launcher.
expect_refusal() {
  local name=$1 rc=0
  shift
  note "$name"
  "${clean[@]}" "$@" "$RD_BIN" "${args[@]}" --output-dir "$WORK/$name" >"$WORK/$name.log" 2>&1 || rc=$?
  cat "$WORK/$name.log"
  [ "$rc" = 2 ] || fail "$name: exit $rc, expected 2"
  grep -q '^resnet_ddp: error: MPI gave this process a world of 1 rank' "$WORK/$name.log" || fail "$name: no reason"
  for fix in 'srun --mpi=pmix' 'srun --mpi=list' 'mpirun -np N'; do
    grep -q -F -- "$fix" "$WORK/$name.log" || fail "$name: the message does not mention '$fix'"
  done
  ! grep -q 'Train set size' "$WORK/$name.log" || fail "$name: started training"
  [ ! -e "$WORK/$name/last.h5" ] || fail "$name: wrote a checkpoint"
}

expect_refusal srun_without_pmi SLURM_JOB_ID=1 SLURM_STEP_ID=0 SLURM_NTASKS=4 SLURM_PROCID=0
expect_refusal srun_nprocs SLURM_JOB_ID=1 SLURM_STEPID=0 SLURM_NPROCS=2 SLURM_PROCID=0
expect_refusal torchrun WORLD_SIZE=2 RANK=0 LOCAL_RANK=0
grep -q 'SLURM_NTASKS=4' "$WORK/srun_without_pmi.log" || fail "the message does not name SLURM_NTASKS=4"
grep -q 'WORLD_SIZE=2' "$WORK/torchrun.log" || fail "the message does not name WORLD_SIZE=2"

note "a batch script (no step) with SLURM_NTASKS=4 may run one process"
"${clean[@]}" SLURM_JOB_ID=1 SLURM_NTASKS=4 "$RD_BIN" "${args[@]}" --output-dir "$WORK/batch" >"$WORK/batch.log" 2>&1 ||
  { cat "$WORK/batch.log"; fail "a one-process run in a batch script was refused"; }

note "mpirun's world of 2 inside a step of 4 tasks is fine (world > 1)"
"${clean[@]}" SLURM_JOB_ID=1 SLURM_STEP_ID=0 SLURM_NTASKS=4 "$RD_MPIEXEC" --oversubscribe --bind-to none -np 2 \
  "$RD_BIN" "${args[@]}" --output-dir "$WORK/mpirun" >"$WORK/mpirun.log" 2>&1 ||
  { cat "$WORK/mpirun.log"; fail "mpirun -np 2 was refused"; }
grep -q 'rank 0/2' "$WORK/mpirun.log" || { cat "$WORK/mpirun.log"; fail "expected a world of 2"; }
note "ok"
