#!/bin/bash
# nccl_message_passing_test.sh MPIEXEC PROGRAM NPROCS: message_passing --device cuda
# on the emulated device (NCCL send/recv between real processes). As
# tests/collective/message_passing_test.sh (which runs --device auto), plus: every
# rank reports a CUDA device, and a message large enough for MPI's rendezvous
# protocol (4 MB) arrives intact too (the program exits non-zero on a mismatch).
set -u
mpiexec=$1 program=$2 np=$3
for elements in 1000 1048579; do
  out=$("$mpiexec" --oversubscribe --bind-to none -np "$np" "$program" --device cuda --verbose \
        --elements "$elements" 2>&1)
  rc=$?
  echo "$out"
  [ "$rc" -eq 0 ] || { echo "FAIL: exit status $rc (--elements $elements)"; exit 1; }
  for ((r = 0; r < np; r++)); do
    grep -Eq "^rank $r/$np: .*device cuda:[0-9]+$" <<<"$out" ||
      { echo "FAIL: rank $r did not report a CUDA device"; exit 1; }
  done
  for ((r = 1; r < np; r++)); do
    for line in "worker_0 sent data to Rank $r" "worker_$r has received data from rank 0"; do
      n=$(grep -cx "$line" <<<"$out")
      [ "$n" -eq 1 ] || { echo "FAIL: '$line' printed $n times (--elements $elements)"; exit 1; }
    done
  done
done
echo PASS
