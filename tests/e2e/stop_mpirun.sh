#!/usr/bin/env bash
# Ctrl-C (SIGINT to mpirun's process group) and SIGTERM to mpirun keep the work: with
# the launcher's grace raised (OMPI_MCA_odls_base_sigkill_timeout, as the job scripts
# set it), mpirun's SIGTERM reaches the ranks before its SIGKILL, they finish the step,
# rank 0 saves last.h5 and says so, and the same command resumes at that step. Rank 0
# says at once that it got the signal. Steps this short fit in Open MPI's default grace of
# 1 s: no notice asks to raise it (stop_mpirun_long_step.sh has the long steps).
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
  # it may be lost once mpirun terminates the job (and closing them hangs the ranks up:
  # SIGHUP, a stop request like the others).
  setsid "$RD_MPIEXEC" --stdin none --output-filename "$WORK/$name.out" --oversubscribe --bind-to none -np 2 \
    "$RD_BIN" "${args[@]}" --epochs 500 --output-dir "$WORK/$name" >"$WORK/$name.mpirun" 2>&1 &
  pid=$!
  wait_for "$WORK/$name.out/1/rank.0/stdout" "(Epoch 2/500) Time:" 60 ||
    { cat "$WORK/$name.mpirun" "$WORK/$name.out"/1/rank.*/std*; fail "$name: training did not start"; }
  if [ "$how" = group ]; then kill -INT -- "-$pid"; else kill -TERM "$pid"; fi
  wait "$pid" || rc=$?
  cat "$WORK/$name.out"/1/rank.*/stderr >&2 || true
  cp "$WORK/$name.out/1/rank.0/stdout" "$WORK/$name.log"
  grep -q -E "^resnet_ddp: got SIG(TERM|INT) at epoch [0-9]+ (step [0-9]+ of 16|\(validation\)); saving last.h5 " \
    "$WORK/$name.out/1/rank.0/stderr" || fail "$name: rank 0 did not say at once that it got the signal"
  # Rank 0's last lines may be lost (mpirun stops reading the ranks' output while it ends
  # the job), so the evidence is on disk: last.h5 at the step the ranks stopped (or the
  # end of an epoch when the stop came during validation), and a lock released by a
  # clean exit: after mpirun's SIGKILL the next run would say the previous one "ended
  # without releasing it".
  "$RD_BIN" info "$WORK/$name/last.h5" >"$WORK/$name.info" 2>&1 || { cat "$WORK/$name.log"; fail "$name: no readable last.h5"; }
  # A stop after an epoch's last step but before its validation is "N steps of epoch E
  # (preempted)" with N = 16: the resume validates epoch E ("at epoch E step 16"); a stop
  # during or after validation is "E completed" and resumes at epoch E+1.
  local line epoch step at
  line=$(grep '^epoch: ' "$WORK/$name.info")
  if [[ $line =~ ^epoch:\ +([0-9]+)\ completed\ \+\ ([0-9]+)\ steps\ of\ epoch\ [0-9]+\ \(preempted\)$ ]]; then
    epoch=$((BASH_REMATCH[1] + 1))
    step=${BASH_REMATCH[2]}
    at="epoch $epoch step $step"
  elif [[ $line =~ ^epoch:\ +([0-9]+)\ completed$ ]]; then
    epoch=${BASH_REMATCH[1]}
    step=16
    at="epoch $((epoch + 1))"
  else
    cat "$WORK/$name.info"
    fail "$name: unexpected last.h5: $line"
  fi
  [ "$epoch" -ge 3 ] || fail "$name: last.h5 is from epoch $epoch, before the stop"
  if grep -q '^Preempted at epoch' "$WORK/$name.log"; then
    grep -q -x -F "Preempted at epoch $epoch step $step; checkpoint saved to $WORK/$name/last.h5" "$WORK/$name.log" ||
      fail "$name: the printed stop does not match last.h5"
  fi
  # The same command again resumes there.
  "$RD_MPIEXEC" --oversubscribe --bind-to none -np 2 "$RD_BIN" "${args[@]}" --epochs $((epoch + 1)) --resume auto \
    --output-dir "$WORK/$name" >"$WORK/$name.resume.log" 2>&1 || { cat "$WORK/$name.resume.log"; fail "$name: resume"; }
  grep -q -x -F "Resuming from $WORK/$name/last.h5 at $at" "$WORK/$name.resume.log" ||
    { cat "$WORK/$name.resume.log"; fail "$name: did not resume at $at"; }
  ! grep -q "ended without releasing it" "$WORK/$name.resume.log" ||
    { cat "$WORK/$name.resume.log"; fail "$name: the ranks were killed (mpirun exit $rc), not stopped"; }
}

note "Ctrl-C: SIGINT to the process group of mpirun and its ranks"
stop_run ctrlc group
note "SIGTERM to mpirun"
stop_run term term

note "at Open MPI's default grace, steps that fit in it bring no notice"
env -u OMPI_MCA_odls_base_sigkill_timeout "$RD_MPIEXEC" --oversubscribe --bind-to none -np 2 "$RD_BIN" "${args[@]}" --epochs 1 \
  --max-steps 3 --output-dir "$WORK/notice" >"$WORK/notice.log" 2>&1 || { cat "$WORK/notice.log"; fail "notice run"; }
! grep -q "OMPI_MCA_odls_base_sigkill_timeout" "$WORK/notice.log" || { cat "$WORK/notice.log"; fail "a notice for short steps"; }
! grep -q "OMPI_MCA_odls_base_sigkill_timeout" "$WORK/ctrlc.log" || fail "a notice although the grace is set"
note "ok"
