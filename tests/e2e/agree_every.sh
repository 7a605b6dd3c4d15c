#!/usr/bin/env bash
# Several ranks agree (stop signal, non-finite loss, the step sums) every few steps, not
# at every step: the results do not depend on how often (the same metrics.csv with
# --log-every 1, where they agree every step, and 7), and a SIGTERM stops every rank at
# the step the stop line names.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 1200 40
args=(--data "$WORK/data" --arch resnet_tiny --image-size 32 --threads 1 --workers 1 --batch-size 2
  --lr 1e-3 --progress lines --tensorboard off --seed 5)

note "the same 20 steps, agreeing every step and every few steps"
for every in 1 7; do
  mpi 2 "${args[@]}" --epochs 1 --max-steps 20 --log-every "$every" --output-dir "$WORK/every$every" \
    >"$WORK/every$every.log" 2>&1 || { cat "$WORK/every$every.log"; fail "--log-every $every failed"; }
done
cut -d, -f3-6 "$WORK/every1/metrics.csv" >"$WORK/m1"
cut -d, -f3-6 "$WORK/every7/metrics.csv" >"$WORK/m7"
cmp -s "$WORK/m1" "$WORK/m7" || { cat "$WORK/m1" "$WORK/m7"; fail "the metrics depend on --log-every"; }
grep -q '^(Epoch 1/1) step 14/20 loss' "$WORK/every7.log" || { cat "$WORK/every7.log"; fail "progress lines"; }

note "SIGTERM to rank 0 with --log-every 7: every rank stops at the step the stop line names"
# Upscaled inputs make a step slow enough (tens of ms) for the signal to land mid-epoch.
mpi 2 "${args[@]}" --image-size 96 --epochs 1 --log-every 7 --output-dir "$WORK/stop" >"$WORK/stop.log" 2>&1 &
preempt $! "$WORK/stop.log" "(Epoch 1/1) step 14/" 0 TERM
cat "$WORK/stop.log"
notice=$(grep -o -E 'got SIGTERM at epoch 1 step [0-9]+ of [0-9]+; saving last.h5 when (this step|step [0-9]+) ends' \
  "$WORK/stop.log") || fail "no stop line"
at=$(sed 's/.* step \([0-9]*\) of .*/\1/' <<<"$notice")
named=$(sed -n 's/.*when step \([0-9]*\) ends/\1/p' <<<"$notice")
[ -n "$named" ] || named=$at
stopped=$(sed -n 's/^Preempted at epoch 1 step \([0-9]*\);.*/\1/p' "$WORK/stop.log")
[ "$stopped" = "$named" ] || fail "stopped at step $stopped; the stop line named step $named (signal at step $at)"
[ "$named" -ge "$at" ] && [ "$named" -lt $((at + 7)) ] || fail "named step $named is not within 7 steps of $at"
"$RD_BIN" info "$WORK/stop/last.h5" | grep -q "+ $stopped steps of epoch 1 (preempted)" || fail "last.h5 step"
note "ok"
