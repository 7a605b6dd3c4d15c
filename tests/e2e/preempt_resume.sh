#!/usr/bin/env bash
# SIGTERM to one rank mid-epoch: every rank finishes its step, rank 0 writes
# last.h5, all exit 0 with "Preempted at epoch e step s; checkpoint saved to
# PATH" (SIGUSR1 alike). The next run resumes at that step and completes. A
# second signal ends the process at once.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 1200 40
OUT="$WORK/out"
# Upscaled inputs make steps slow enough (tens of ms) to land a signal mid-epoch.
args=(--data "$WORK/data" --arch resnet_tiny --image-size 96 --threads 1 --workers 1 --batch-size 2
  --epochs 2 --lr 1e-3 --output-dir "$OUT" --log-every 1 --progress lines)


note "run 1: SIGTERM to rank 1 after a few steps"
mpi 2 "${args[@]}" >"$WORK/run1.log" 2>&1 &
preempt $! "$WORK/run1.log" "(Epoch 1/2) step 3/" 1 TERM
cat "$WORK/run1.log"
line=$(grep -E '^Preempted at epoch 1 step [0-9]+; checkpoint saved to ' "$WORK/run1.log") ||
  fail "no preemption message"
grep -q -F "checkpoint saved to $OUT/last.h5" <<<"$line" || fail "preemption message names the wrong file"
step=$(sed 's/^Preempted at epoch 1 step \([0-9]*\);.*/\1/' <<<"$line")
[ "$step" -ge 3 ] && [ "$step" -lt 300 ] || fail "stopped at step $step, expected mid-epoch (3..299)"
! grep -q 'Val loss' "$WORK/run1.log" || fail "a preempted run must not finish the epoch"
"$RD_BIN" info "$OUT/last.h5" >"$WORK/info"
grep -q "+ $step steps of epoch 1 (preempted)" "$WORK/info" || { cat "$WORK/info"; fail "last.h5 does not record the step"; }

note "run 2: resume from step $step"
mpi 2 "${args[@]}" >"$WORK/run2.log" 2>&1 || { cat "$WORK/run2.log"; fail "resumed run failed"; }
cat "$WORK/run2.log"
grep -q -F "Resuming from $OUT/last.h5 at epoch 1 step $step" "$WORK/run2.log" || fail "did not resume at the step"
first=$(grep -m 1 -o -E '^\(Epoch 1/2\) step [0-9]+/' "$WORK/run2.log" | sed 's/.*step \([0-9]*\)\//\1/')
[ "$first" = $((step + 1)) ] || fail "resumed run started at step $first, expected $((step + 1))"
grep -q '^(Epoch 2/2) Current best val acc' "$WORK/run2.log" || fail "resumed run did not finish"
grep -q '^Best model (val loss' "$WORK/run2.log" || fail "no final evaluation"
[ "$(cut -d, -f1 "$OUT/metrics.csv" | tail -n +2 | tr '\n' ' ')" = "1 2 " ] || fail "metrics.csv rows: $(cat "$OUT/metrics.csv")"
# All 300 steps of epoch 1 happened exactly once across the two runs.
"$RD_BIN" info "$OUT/last.h5" >"$WORK/info"
grep -q "global step:     600" "$WORK/info" || { cat "$WORK/info"; fail "global step count"; }

note "run 3: SIGUSR1 (Slurm --signal) to rank 0 preempts the same way"
mpi 2 "${args[@]}" --resume none --output-dir "$WORK/out_usr1" >"$WORK/usr1.log" 2>&1 &
preempt $! "$WORK/usr1.log" "(Epoch 1/2) step 3/" 0 USR1
grep -q -E "^Preempted at epoch 1 step [0-9]+; checkpoint saved to $WORK/out_usr1/last.h5\$" "$WORK/usr1.log" ||
  { cat "$WORK/usr1.log"; fail "no preemption after SIGUSR1"; }

note "run 4: two signals end the process at once"
# ResNet-18's checkpoint takes long enough to write that the second signal
# arrives while the first one's orderly stop is still under way.
mpi 2 "${args[@]}" --arch resnet18 --image-size 32 --resume none --output-dir "$WORK/out3" >"$WORK/run3.log" 2>&1 &
mpirun_pid=$!
wait_for "$WORK/run3.log" "(Epoch 1/2) step 2/" 60 || { cat "$WORK/run3.log"; fail "run 4 did not start"; }
pid0=$(rank_pid "$mpirun_pid" 0) || fail "cannot find rank 0"
start=$SECONDS
kill -TERM "$pid0"
sleep 0.05
kill -TERM "$pid0"
rc=0
wait "$mpirun_pid" || rc=$?
[ "$rc" != 0 ] || fail "a double signal should not look like success"
[ $((SECONDS - start)) -lt 20 ] || fail "took $((SECONDS - start)) s to stop after two signals"
note "ok"
