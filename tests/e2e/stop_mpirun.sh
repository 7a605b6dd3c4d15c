#!/usr/bin/env bash
# Ctrl-C (SIGINT to mpirun's process group) and SIGTERM to mpirun keep the work: with
# the launcher's grace raised (OMPI_MCA_odls_base_sigkill_timeout, as the job scripts
# set it), mpirun's SIGTERM reaches the ranks before its SIGKILL, they finish the step,
# rank 0 saves last.h5 and says so, and the same command resumes at that step. At Open
# MPI's default grace of 1 s a notice says what to set.
source "$(dirname "$0")/common.sh"
command -v setsid >/dev/null || { echo "SKIP: setsid (util-linux) is not installed" >&2; exit 77; }

synth_data "$WORK/data" 64 8
# Many epochs of a small model: the stop lands while training runs. Few lines: mpirun
# stops reading the ranks' output while it terminates the job (it prints what is left
# at the end), so a rank printing hundreds of lines a second would block on the pipe.
args=(--data "$WORK/data" --arch resnet_tiny --image-size 32 --threads 1 --workers 1 --batch-size 2
  --log-every 0 --progress none --tensorboard off)
export OMPI_MCA_odls_base_sigkill_timeout=5

# stop_run NAME HOW: starts 2 ranks in their own session, stops them with HOW once
# training runs (group: SIGINT to the process group, as Ctrl-C; term: SIGTERM to mpirun).
stop_run() {
  local name=$1 how=$2 pid rc=0
  # The ranks' output goes to files (--output-filename): through mpirun's pseudo-terminals
  # it is lost once mpirun terminates the job, and with stdin at /dev/null (as under
  # ctest) the ranks were seen to die at mpirun's SIGTERM instead of saving.
  setsid "$RD_MPIEXEC" --stdin none --output-filename "$WORK/$name.out" --oversubscribe --bind-to none -np 2 \
    "$RD_BIN" "${args[@]}" --epochs 500 --output-dir "$WORK/$name" >"$WORK/$name.mpirun" 2>&1 &
  pid=$!
  wait_for "$WORK/$name.out/1/rank.0/stdout" "(Epoch 2/500) Time:" 60 ||
    { cat "$WORK/$name.mpirun" "$WORK/$name.out"/1/rank.*/std*; fail "$name: training did not start"; }
  if [ "$how" = group ]; then kill -INT -- "-$pid"; else kill -TERM "$pid"; fi
  wait "$pid" || rc=$?
  cat "$WORK/$name.out"/1/rank.*/stderr >&2 || true
  cp "$WORK/$name.out/1/rank.0/stdout" "$WORK/$name.log"
  # The checkpoint is the evidence: a mid-epoch last.h5, written by the stop (an
  # epoch-end save never records steps), and the line saying so.
  "$RD_BIN" info "$WORK/$name/last.h5" >"$WORK/$name.info" 2>&1 || { cat "$WORK/$name.log"; fail "$name: no readable last.h5"; }
  local line epoch step
  line=$(grep '^epoch: ' "$WORK/$name.info")
  if [[ $line =~ ^epoch:\ +([0-9]+)\ completed\ \+\ ([0-9]+)\ steps\ of\ epoch\ [0-9]+\ \(preempted\)$ ]]; then
    epoch=$((BASH_REMATCH[1] + 1))
    step=${BASH_REMATCH[2]}
  elif [[ $line =~ ^epoch:\ +([0-9]+)\ completed$ ]] && grep -q "^Preempted at epoch ${BASH_REMATCH[1]} step 16;" "$WORK/$name.log"; then
    epoch=${BASH_REMATCH[1]}  # stopped during validation: the epoch's own save
    step=16
  else
    cat "$WORK/$name.log" "$WORK/$name.info"
    fail "$name: last.h5 was not written by the stop (mpirun exit $rc): $line"
  fi
  grep -q -x -F "Preempted at epoch $epoch step $step; checkpoint saved to $WORK/$name/last.h5" "$WORK/$name.log" ||
    { tail -n 5 "$WORK/$name.log"; fail "$name: rank 0 did not say where it stopped"; }
  # The same command again resumes there (16 steps an epoch: a stop after the last step
  # resumes the next epoch).
  local at="epoch $epoch step $step"
  [ "$step" = 16 ] && at="epoch $((epoch + 1))"
  "$RD_MPIEXEC" --oversubscribe --bind-to none -np 2 "$RD_BIN" "${args[@]}" --epochs $((epoch + 1)) --resume auto \
    --output-dir "$WORK/$name" >"$WORK/$name.resume.log" 2>&1 || { cat "$WORK/$name.resume.log"; fail "$name: resume"; }
  grep -q -x -F "Resuming from $WORK/$name/last.h5 at $at" "$WORK/$name.resume.log" ||
    { cat "$WORK/$name.resume.log"; fail "$name: did not resume at $at"; }
}

note "Ctrl-C: SIGINT to the process group of mpirun and its ranks"
stop_run ctrlc group
note "SIGTERM to mpirun"
stop_run term term

note "at Open MPI's default grace a notice says what to set"
env -u OMPI_MCA_odls_base_sigkill_timeout "$RD_MPIEXEC" --oversubscribe --bind-to none -np 2 "$RD_BIN" "${args[@]}" --epochs 1 \
  --max-steps 1 --output-dir "$WORK/notice" >"$WORK/notice.log" 2>&1 || { cat "$WORK/notice.log"; fail "notice run"; }
grep -q -F "Notice: Ctrl-C or a SIGTERM to mpirun kills the ranks 1 s later, before they can save last.h5; export OMPI_MCA_odls_base_sigkill_timeout=10" \
  "$WORK/notice.log" || { cat "$WORK/notice.log"; fail "no notice at the default grace"; }
! grep -q "OMPI_MCA_odls_base_sigkill_timeout" "$WORK/ctrlc.log" || fail "a notice although the grace is set"
note "ok"
