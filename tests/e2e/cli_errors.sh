#!/usr/bin/env bash
# Bad flags, bad values, missing paths and bad checkpoints: exit status 2 and one
# message naming the flag or file (rank 0 only), before any training; existing
# checkpoints are never overwritten.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 24 12
# expect_usage_error PATTERN ARGS...: one process, status 2, message matches.
expect_usage_error() {
  local pattern=$1 rc=0
  shift
  "$RD_BIN" "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
  [ "$rc" = 2 ] || { cat "$WORK/out" "$WORK/err"; fail "'$*' exited $rc, expected 2"; }
  grep -q -- "$pattern" "$WORK/err" || { cat "$WORK/err"; fail "'$*': message does not mention '$pattern'"; }
}

note "flags and values"
expect_usage_error "--lrr" --data "$WORK/data" --lrr 1
expect_usage_error "--lr" --data "$WORK/data" --lr abc
expect_usage_error "--batch-size" --data "$WORK/data" --batch-size 0
expect_usage_error "--arch" --data "$WORK/data" --arch resnet99
expect_usage_error "--scheduler" --data "$WORK/data" --scheduler step
expect_usage_error "--precision" --data "$WORK/data" --precision fp8
expect_usage_error "--data" --epochs 2
expect_usage_error "--data" --data "$WORK/no_such_dir"
expect_usage_error "--init" --data "$WORK/data" --init "$WORK/none.h5"
expect_usage_error "--resume" --data "$WORK/data" --resume "$WORK/none.h5"
expect_usage_error "--output-dir" --data "$WORK/data" --output-dir /proc/rd_cannot_write_here
expect_usage_error "unknown command" frobnicate
expect_usage_error "--checkpoint" predict "$WORK/data"
expect_usage_error "--checkpoint" predict --checkpoint "$WORK/none.h5" "$WORK/data"
expect_usage_error "checkpoint" info "$WORK/none.h5"
for cmd in train predict info synth pack; do
  "$RD_BIN" $cmd --help >"$WORK/help" || fail "$cmd --help exited non-zero"
  grep -q -i "usage" "$WORK/help" || fail "$cmd --help prints no usage"
done

note "under mpirun: rank 0 alone reports, every rank exits before training"
rc=0
mpi 2 --data "$WORK/data" --lr abc >"$WORK/out" 2>"$WORK/err" || rc=$?
[ "$rc" != 0 ] || fail "mpirun run with a bad flag succeeded"
[ "$(grep -c 'resnet_ddp: error: --lr' "$WORK/err")" = 1 ] || { cat "$WORK/err"; fail "expected exactly one error line"; }
! grep -q "Train set size" "$WORK/out" || fail "training started despite the bad flag"

note "bad checkpoints are rejected and nothing is overwritten"
OUT="$WORK/out_ckpt"
small=(--data "$WORK/data" "${TINY[@]}" --batch-size 4 --epochs 1 --max-steps 1 --head fc)
mpi 2 "${small[@]}" --output-dir "$OUT" >"$WORK/log" 2>&1 || { cat "$WORK/log"; fail "setup run"; }
sum_before=$(md5sum "$OUT/last.h5" "$OUT/best_model.h5")
# Another head: --resume auto finds last.h5 but it does not fit.
rc=0
mpi 2 "${small[@]/fc/mlp}" --output-dir "$OUT" --epochs 2 >"$WORK/log" 2>&1 || rc=$?
[ "$rc" != 0 ] || fail "a checkpoint with another head was accepted"
grep -q -- "does not match this run: it was trained with --head fc" "$WORK/log" || { cat "$WORK/log"; fail "head mismatch message"; }
[ "$(grep -c 'resnet_ddp: error' "$WORK/log")" = 1 ] || fail "the mismatch should be reported once"
# A corrupt last.h5.
cp "$OUT/last.h5" "$WORK/good.h5"
head -c 3000 "$WORK/good.h5" >"$OUT/last.h5"
sum_corrupt=$(md5sum "$OUT/last.h5" "$OUT/best_model.h5")
rc=0
mpi 2 "${small[@]}" --output-dir "$OUT" --epochs 2 >"$WORK/log" 2>&1 || rc=$?
[ "$rc" != 0 ] || fail "a corrupt last.h5 was accepted"
grep -q -F "checkpoint '$OUT/last.h5'" "$WORK/log" || { cat "$WORK/log"; fail "corrupt file not named"; }
[ "$(md5sum "$OUT/last.h5" "$OUT/best_model.h5")" = "$sum_corrupt" ] || fail "a rejected run modified the checkpoints"
# Not a checkpoint at all.
echo "not hdf5" >"$WORK/text.h5"
expect_usage_error "not an HDF5 file" --data "$WORK/data" "${TINY[@]}" --resume "$WORK/text.h5" --output-dir "$WORK/o2"
expect_usage_error "not an HDF5 file" info "$WORK/text.h5"
expect_usage_error "not an HDF5 file" predict --checkpoint "$WORK/text.h5" "$WORK/data"
# The intact copy still works, and --eval-only evaluates it without writing.
cp "$WORK/good.h5" "$OUT/last.h5"
mpi 2 "${small[@]}" --output-dir "$OUT" --eval-only >"$WORK/log" 2>&1 || { cat "$WORK/log"; fail "--eval-only"; }
grep -q -E '^Val loss: [0-9.e-]+, Val accuracy: [0-9.e-]+$' "$WORK/log" || { cat "$WORK/log"; fail "--eval-only output"; }
[ "$(md5sum "$OUT/last.h5" "$OUT/best_model.h5")" = "$sum_before" ] || fail "--eval-only modified checkpoints"

note "a write that fails part-way (file-size limit, like a full disk) keeps the previous checkpoint"
# Each rank runs under `ulimit -f` (300 KiB: below even the weights-only best_model.h5);
# shared-memory transport off, its segment files would hit the limit too.
rc=0
OMPI_MCA_btl=self,tcp "$RD_MPIEXEC" --oversubscribe --bind-to none -np 2 bash -c \
  'ulimit -f 300 && exec "$0" "$@"' "$RD_BIN" "${small[@]}" --output-dir "$OUT" --epochs 2 --resume auto \
  >"$WORK/log" 2>&1 || rc=$?
[ "$rc" != 0 ] || { cat "$WORK/log"; fail "a failed checkpoint write was not reported"; }
grep -q -F "cannot write checkpoint '$OUT/" "$WORK/log" || { cat "$WORK/log"; fail "write failure message"; }
grep -q "previous checkpoint (if any) is unchanged" "$WORK/log" || fail "write failure message (kept)"
[ "$(md5sum "$OUT/last.h5" "$OUT/best_model.h5")" = "$sum_before" ] || fail "a failed write damaged a checkpoint"
! ls -a "$OUT" | grep -q '\.tmp\.' || fail "temporary file left behind"

note "a diverging loss stops with the step named"
rc=0
mpi 2 --data "$WORK/data" "${TINY[@]}" --batch-size 4 --epochs 1 --optimizer sgd --momentum 0 --lr 1e30 \
  --output-dir "$WORK/o3" >"$WORK/log" 2>&1 || rc=$?
[ "$rc" != 0 ] || { cat "$WORK/log"; fail "training with lr 1e30 succeeded"; }
grep -q -E "loss became NaN or Inf at epoch 1 step [0-9]+" "$WORK/log" || { cat "$WORK/log"; fail "NaN message"; }
[ ! -e "$WORK/o3/last.h5" ] || fail "a diverged run must not write a checkpoint"
note "ok"
