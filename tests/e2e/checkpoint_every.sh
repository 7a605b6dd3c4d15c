#!/usr/bin/env bash
# --checkpoint-every N: last.h5 every N optimizer steps inside an epoch, so a crash
# (kill -9, no chance to save) loses at most N steps; the next run resumes at that step
# and, with --deterministic, ends bit-identical to a run that never stopped.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 40 8
args=(--data "$WORK/data" --arch resnet_tiny --image-size 64 --threads 1 --workers 1 --conv-algo direct --batch-size 2
  --epochs 2 --augment none --deterministic --checkpoint-every 3 --log-every 1 --progress lines)

note "reference: 2 epochs without interruption"
"$RD_BIN" "${args[@]}" --output-dir "$WORK/a" >"$WORK/a.log" 2>&1 || { cat "$WORK/a.log"; fail "reference run"; }

note "the same run killed with SIGKILL after step 7 of epoch 1"
"$RD_BIN" "${args[@]}" --output-dir "$WORK/b" >"$WORK/b1.log" 2>&1 &
pid=$!
deadline=$((SECONDS + 60))
until grep -q '^(Epoch 1/2) step 7/' "$WORK/b1.log" 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || { cat "$WORK/b1.log"; fail "run did not start"; }
  sleep 0.02
done
kill -KILL "$pid"
wait "$pid" 2>/dev/null || true
"$RD_BIN" info "$WORK/b/last.h5" >"$WORK/info" || fail "no last.h5 after the crash"
cat "$WORK/info"
step=$(sed -n 's/.*+ \([0-9]*\) steps of epoch 1 .*/\1/p' "$WORK/info")
[ -n "$step" ] && [ $((step % 3)) = 0 ] && [ "$step" -ge 6 ] || fail "last.h5 is not a step-$step checkpoint of epoch 1 (expected a multiple of 3, >= 6)"

note "resume from step $step"
"$RD_BIN" "${args[@]}" --output-dir "$WORK/b" >"$WORK/b2.log" 2>&1 || { cat "$WORK/b2.log"; fail "resumed run"; }
grep -q -x -F "Resuming from $WORK/b/last.h5 at epoch 1 step $step" "$WORK/b2.log" || { cat "$WORK/b2.log"; fail "did not resume at step $step"; }
grep -q '^(Epoch 2/2) Val loss' "$WORK/b2.log" || fail "resumed run did not finish"
[ "$(grep '^(Epoch 2/2) Val loss' "$WORK/a.log")" = "$(grep '^(Epoch 2/2) Val loss' "$WORK/b2.log")" ] ||
  fail "final validation differs from the uninterrupted run"
if command -v h5diff >/dev/null; then
  for group in /state_dict /optimizer; do
    h5diff "$WORK/a/last.h5" "$WORK/b/last.h5" "$group" "$group" >"$WORK/diff" || { head "$WORK/diff"; fail "$group differs"; }
  done
fi
note "ok"
