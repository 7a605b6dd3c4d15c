#!/usr/bin/env bash
# One output folder, one run: a second run on a folder in use exits 2 naming the folder
# and the holder; a run killed outright leaves no lock behind, and the next run says
# that the previous one did not end cleanly.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 400 4
OUT="$WORK/out"
args=(--data "$WORK/data" "${TINY[@]}" --batch-size 2 --conv-algo direct --output-dir "$OUT")


note "run A holds $OUT"
"$RD_BIN" "${args[@]}" --epochs 100 --log-every 1 --progress lines >"$WORK/a.log" 2>&1 &
pid_a=$!
wait_for "$WORK/a.log" "(Epoch 1/100) step 2/" 60 || { cat "$WORK/a.log"; fail "run A did not start"; }

note "run B on the same folder"
rc=0
"$RD_BIN" "${args[@]}" --epochs 1 >"$WORK/b.log" 2>&1 || rc=$?
cat "$WORK/b.log"
[ "$rc" = 2 ] || fail "second run exited $rc, expected 2"
grep -q -F "resnet_ddp: error: --output-dir: '$OUT' is in use by another run (host $(hostname) pid $pid_a " "$WORK/b.log" ||
  fail "the refusal does not name the folder and the holder (pid $pid_a)"
grep -q -- "--output-dir" "$WORK/b.log" || fail "no hint"
! grep -q 'Train set size' "$WORK/b.log" || fail "run B started"

note "run A crashes (SIGKILL): its lock goes with it"
kill -KILL "$pid_a"
wait "$pid_a" 2>/dev/null || true
"$RD_BIN" "${args[@]}" --epochs 1 --max-steps 1 --resume none >"$WORK/c.log" 2>&1 || { cat "$WORK/c.log"; fail "run C failed"; }
cat "$WORK/c.log"
grep -q -F "Notice: the previous run in $OUT (host $(hostname) pid $pid_a " "$WORK/c.log" ||
  fail "the stale lock of the killed run was not reported"
[ ! -s "$OUT/resnet_ddp.lock" ] || fail "a clean exit left a record in the lock file: $(cat "$OUT/resnet_ddp.lock")"

note "after a clean exit the next run starts without a notice"
"$RD_BIN" "${args[@]}" --epochs 1 --max-steps 1 --resume none >"$WORK/d.log" 2>&1 || { cat "$WORK/d.log"; fail "run D failed"; }
! grep -q 'previous run' "$WORK/d.log" || { cat "$WORK/d.log"; fail "stale notice after a clean exit"; }

note "--eval-only reads and takes no lock, even while a run holds the folder"
"$RD_BIN" "${args[@]}" --epochs 100 --resume none --log-every 1 --progress lines >"$WORK/e.log" 2>&1 &
pid_e=$!
wait_for "$WORK/e.log" "(Epoch 1/100) step 2/" 60 || { cat "$WORK/e.log"; fail "run E did not start"; }
"$RD_BIN" "${args[@]}" --eval-only --resume "$OUT/last.h5" >"$WORK/f.log" 2>&1 || { cat "$WORK/f.log"; fail "eval-only refused"; }
kill -TERM "$pid_e"
wait "$pid_e" || fail "run E did not stop cleanly on SIGTERM"
[ ! -s "$OUT/resnet_ddp.lock" ] || fail "a preempted run left a record in the lock file"
note "ok"
