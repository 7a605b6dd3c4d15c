#!/bin/bash
# message_passing_test.sh MPIEXEC PROGRAM NPROCS: every tutorial line is printed
# exactly once (the launcher decides how lines of different ranks interleave).
set -u
mpiexec=$1 program=$2 np=$3
out=$("$mpiexec" --oversubscribe --bind-to none -np "$np" "$program" --device auto --elements 1000 2>&1)
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: exit status $rc"; exit 1; }
for ((r = 1; r < np; r++)); do
  for line in "worker_0 sent data to Rank $r" "worker_$r has received data from rank 0"; do
    n=$(grep -cx "$line" <<<"$out")
    [ "$n" -eq 1 ] || { echo "FAIL: '$line' printed $n times"; exit 1; }
  done
done
echo PASS
