#!/usr/bin/env bash
# Ctrl-C under an interactive mpirun with steps longer than Open MPI's kill grace (1 s by
# default: mpirun sends SIGTERM to the ranks 1 s after the Ctrl-C and SIGKILL 1 s later).
# The ranks may be killed before the step ends and saves, so rank 0 prints one line the
# moment the signal arrives: where the run is, that the work since the last checkpoint is
# lost if the kill comes first, and where the same command resumes. Whichever happens
# (saved within the grace, or killed), the output says it and the same command resumes
# there. A notice after the second step already said the grace is too short.
source "$(dirname "$0")/common.sh"
command -v setsid >/dev/null || { echo "SKIP: setsid (util-linux) is not installed" >&2; exit 77; }

synth_data "$WORK/data" 64 8
# Steps of 1.6 s on any machine: a small model plus RD_INJECT_STEP_DELAY_MS (the image
# size alone gave 0.4 s steps on one machine and 4 s on another); 8 steps an epoch on 2
# ranks, a checkpoint every 2 steps.
export RD_INJECT_STEP_DELAY_MS=1500
args=(--data "$WORK/data" --arch resnet18 --image-size 32 --threads 1 --workers 1 --batch-size 4 --epochs 1
  --checkpoint-every 2 --log-every 0 --progress none --tensorboard off --output-dir "$WORK/run")
unset OMPI_MCA_odls_base_sigkill_timeout  # Open MPI's default grace, as an interactive user has it

# What the terminal shows: mpirun's own output (the ranks' lines go through it).
setsid "$RD_MPIEXEC" --oversubscribe --bind-to none -x RD_INJECT_STEP_DELAY_MS -np 2 "$RD_BIN" "${args[@]}" >"$WORK/run.out" 2>&1 &
pid=$!
# wait_running PATTERN|FILE: until PATTERN is in run.out (or FILE exists), while mpirun runs.
wait_running() {
  local deadline=$((SECONDS + 120))
  until { [[ $1 == /* ]] && [ -e "$1" ]; } || grep -q -- "$1" "$WORK/run.out" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ] || { cat "$WORK/run.out"; fail "waiting for $1"; }
    sleep 0.05
  done
}
wait_running "Notice: a step takes"
# mpirun forwards a rank's output in pieces: the line's start can be in run.out before its end.
notice="Notice: a step takes [0-9.]+ s, and after a Ctrl-C or a SIGTERM to mpirun Open MPI gives the ranks 1 s between its SIGTERM and SIGKILL: .*export OMPI_MCA_odls_base_sigkill_timeout=[0-9]+ before mpirun"
deadline=$((SECONDS + 30))
until grep -q -E "$notice" "$WORK/run.out"; do
  [ $SECONDS -lt $deadline ] || { cat "$WORK/run.out"; fail "the notice does not say what to export"; }
  sleep 0.05
done
# Ctrl-C once the first checkpoint (step 2) is written and a later step runs.
wait_running "$WORK/run/last.h5"
sleep 0.5
kill -INT -- "-$pid"
wait "$pid" || true
cat "$WORK/run.out"

re='^resnet_ddp: got SIG(TERM|INT) at epoch 1 step ([0-9]+) of 8; saving last\.h5 when this step ends\. Open MPI kills the ranks 1 s after its SIGTERM \(a step takes [0-9.]+ s\); if that comes first, the work since the last checkpoint is lost and the same command resumes from (.+) at (epoch 1 step [0-9]+)\. To give a long step time: export OMPI_MCA_odls_base_sigkill_timeout=[0-9]+ before mpirun$'
# Anywhere in a line: stderr and stdout reach mpirun apart and may share a line of run.out.
line=$(grep -o -E "resnet_ddp: got SIG.*" "$WORK/run.out" | head -n 1)
[[ $line =~ $re ]] || fail "no line at the signal saying what a kill loses and how to resume: '$line'"
signal_step=${BASH_REMATCH[2]}
from=${BASH_REMATCH[3]}
at=${BASH_REMATCH[4]}
[ "$from" = "$WORK/run/last.h5" ] || fail "the line names $from, not $WORK/run/last.h5"
if saved=$(grep -o -E "^Preempted at epoch 1 step [0-9]+" "$WORK/run.out"); then
  note "the step ended within the grace and was saved: $saved"
  at=${saved#Preempted at }
else
  # Killed after the stop began: the kill may come before the step's save (the line's
  # position) or between the save and its "Preempted" line (the step that was stopping).
  note "killed before the step's line came out: the line said the run resumes at $at"
fi
saved_at="epoch 1 step $signal_step"

note "the same command resumes at $at (or, when the kill came after the save, at $saved_at)"
"$RD_MPIEXEC" --oversubscribe --bind-to none -x RD_INJECT_STEP_DELAY_MS -np 2 "$RD_BIN" "${args[@]}" >"$WORK/resume.out" 2>&1 ||
  { cat "$WORK/resume.out"; fail "the resumed run failed"; }
grep -q -x -F "Resuming from $WORK/run/last.h5 at $at" "$WORK/resume.out" ||
  { [ -z "${saved:-}" ] && grep -q -x -F "Resuming from $WORK/run/last.h5 at $saved_at" "$WORK/resume.out"; } ||
  { cat "$WORK/resume.out"; fail "did not resume at $at"; }
note "ok"
