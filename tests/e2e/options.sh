#!/usr/bin/env bash
# The less-travelled training paths run end to end: SyncBatchNorm, gradient
# accumulation, SGD + cosine, --init from a weights file with another head,
# resuming on a different number of ranks, and the metrics CSV across a resume.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 64 24
base=(--data "$WORK/data" "${TINY[@]}" --batch-size 4)

note "sync-bn + accum-steps 2 + sgd/nesterov + cosine on 2 ranks"
mpi 2 "${base[@]}" --epochs 2 --sync-bn --accum-steps 2 --optimizer sgd --momentum 0.9 --nesterov \
  --scheduler cosine --lr 0.05 --output-dir "$WORK/a" >"$WORK/a.log" 2>&1 || { cat "$WORK/a.log"; fail "run a"; }
grep -q "global batch 16" "$WORK/a.log" || { cat "$WORK/a.log"; fail "global batch with accumulation"; }
grep -q '^(Epoch 2/2) Current best val acc' "$WORK/a.log" || fail "run a did not finish"
"$RD_BIN" info "$WORK/a/last.h5" >"$WORK/info"
grep -q "optimizer:       sgd, step 8," "$WORK/info" || { cat "$WORK/info"; fail "sgd steps: 2 epochs x 8 batches / accum 2"; }
grep -q "scheduler:       cosine" "$WORK/info" || fail "cosine state"

note "resume the 2-rank checkpoint on 1 rank"
mpi 1 "${base[@]}" --epochs 3 --optimizer sgd --momentum 0.9 --nesterov --scheduler cosine --lr 0.05 \
  --accum-steps 2 --output-dir "$WORK/a" --resume auto >"$WORK/a3.log" 2>&1 || { cat "$WORK/a3.log"; fail "resume on 1 rank"; }
grep -q "Notice: checkpoint was trained on 2 ranks, this run has 1" "$WORK/a3.log" || { cat "$WORK/a3.log"; fail "world-size notice"; }
grep -q '^(Epoch 3/3) Current best val acc' "$WORK/a3.log" || fail "resumed run did not finish"
[ "$(cut -d, -f1,16 "$WORK/a/metrics.csv" | tail -n +2 | tr '\n' ' ')" = "1,2 2,2 3,1 " ] ||
  fail "metrics.csv rows: $(cat "$WORK/a/metrics.csv")"

note "--init from a checkpoint with another head (weights only)"
mpi 2 "${base[@]}" --head fc --epochs 1 --max-steps 2 --init "$WORK/a/best_model.h5" --output-dir "$WORK/b" \
  >"$WORK/b.log" 2>&1 || { cat "$WORK/b.log"; fail "--init run"; }
grep -q "Initialised weights from $WORK/a/best_model.h5" "$WORK/b.log" || { cat "$WORK/b.log"; fail "init message"; }
grep -q "Notice: --init: the head in" "$WORK/b.log" || fail "head notice"
note "--precision bf16 (bf16 convolutions on CPUs with AVX512-BF16/AMX; a clear refusal elsewhere)"
if mpi 2 "${base[@]}" --epochs 2 --precision bf16 --lr 0.003 --output-dir "$WORK/c" >"$WORK/c.log" 2>&1; then
  grep -q "bf16 convolutions" "$WORK/c.log" || { cat "$WORK/c.log"; fail "bf16 run does not say it uses bf16"; }
  grep -q '^(Epoch 2/2) Current best val acc' "$WORK/c.log" || { cat "$WORK/c.log"; fail "bf16 run did not finish"; }
  "$RD_BIN" info "$WORK/c/last.h5" >"$WORK/cinfo" || fail "bf16 checkpoint unreadable"
else
  grep -q "bf16 needs a CPU with AVX512-BF16 or AMX" "$WORK/c.log" || { cat "$WORK/c.log"; fail "bf16 refused without a reason"; }
  note "bf16 not supported by this CPU: refusal checked"
fi
note "ok"
