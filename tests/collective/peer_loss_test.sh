#!/bin/bash
# peer_loss_test.sh MPIEXEC PROGRAM NPROCS SIGNAL VICTIM
# One rank of an N-rank job is killed (KILL) or frozen (STOP) mid-run. Passes
# when the job ends with a non-zero status within 30 s and its output names the
# lost rank (from our watchdog, or from mpirun for a killed process).
set -u
mpiexec=$1 program=$2 np=$3 sig=$4 victim=$5
work=$(mktemp -d)
trap 'if [ -s "$work/pid" ]; then kill -9 "$(cat "$work/pid")" 2>/dev/null; fi; rm -rf "$work"' EXIT
export RD_HEARTBEAT_S=0.5 RD_PEER_TIMEOUT_S=4
start_ns=$(date +%s%N)
timeout -s KILL 90 "$mpiexec" --oversubscribe --bind-to none -np "$np" "$program" \
  --victim "$victim" --signal "$sig" --pidfile "$work/pid" >"$work/log" 2>&1
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start_ns) / 1000000 ))
cat "$work/log"
echo "peer_loss_test: np=$np signal=$sig victim=$victim exit=$rc after ${elapsed_ms} ms"
if [ "$rc" -eq 0 ]; then echo "FAIL: the job exited 0 although rank $victim was lost"; exit 1; fi
# mpirun passes on a SIGKILL as 137 too: the 90 s guard is recognised by the time.
if [ "$elapsed_ms" -ge 89000 ]; then echo "FAIL: the job hung (killed by the 90 s guard)"; exit 1; fi
if [ "$elapsed_ms" -gt 30000 ]; then echo "FAIL: took ${elapsed_ms} ms (limit 30 s)"; exit 1; fi
# A frozen rank is noticed by our heartbeat; a killed one by mpirun or the heartbeat.
if [ "$sig" = STOP ]; then pattern="lost contact with rank $victim"
else pattern="lost contact with rank $victim|process rank $victim "; fi
if ! grep -Eq "$pattern" "$work/log"; then echo "FAIL: output does not contain '$pattern'"; exit 1; fi
echo PASS
