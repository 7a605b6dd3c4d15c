#!/usr/bin/env bash
# Two ranks train a tiny ResNet on real images: loss falls, validation accuracy
# beats chance, the reference lines appear in order, both checkpoints load, and
# `predict` with best_model.h5 reproduces the final validation accuracy.
source "$(dirname "$0")/common.sh"

fashion_data "$WORK/data"
OUT="$WORK/out"
note "training (2 ranks, 3 epochs)"
mpi 2 --data "$WORK/data" "${TINY[@]}" --batch-size 16 --epochs 3 --lr 3e-3 --augment none \
  --output-dir "$OUT" >"$WORK/log" 2>"$WORK/err" || { cat "$WORK/log" "$WORK/err"; fail "training exited non-zero"; }
cat "$WORK/log"
LOG=$(cat "$WORK/log")

# The reference wording, in the reference order.
expected=(
  "Train set size: 600, Validation set size: 200"
  "(Epoch 1/3) Time: "
  "(Epoch 1/3) Average train loss: "
  "(Epoch 1/3) Val loss: "
  "(Epoch 1/3) Current best val acc: "
  "(Epoch 2/3) Time: "
  "(Epoch 3/3) Current best val acc: "
  "Best model (val loss: "
  "Cleaning up the distributed environment..."
  "Distributed environment has been properly closed"
)
last=0
for line in "${expected[@]}"; do
  n=$(grep -n -F -- "$line" "$WORK/log" | head -n 1 | cut -d: -f1)
  [ -n "$n" ] || fail "missing line: $line"
  [ "$n" -gt "$last" ] || fail "out of order: $line"
  last=$n
done
[ "$(grep -c -F 'Train set size' "$WORK/log")" = 1 ] || fail "rank 0 only must print"
grep -q -E '^\(Epoch 1/3\) Average train loss: [0-9.e-]+, Average train accuracy: [0-9.e-]+$' "$WORK/log" ||
  fail "train line format"
grep -q -E '^\(Epoch 1/3\) Val loss: [0-9.e-]+, Val accuracy: [0-9.e-]+$' "$WORK/log" || fail "val line format"
# torchvision's line after it, in percent; 5 classes, so every label is in the top 5.
val1=$(grep -F '(Epoch 1/3) Val loss:' "$WORK/log" | sed 's/.*Val accuracy: //')
acc_line=$(grep -A1 -F '(Epoch 1/3) Val loss:' "$WORK/log" | tail -n 1)
[ "$acc_line" = "$(awk -v a="$val1" 'BEGIN { printf "Test:  Acc@1 %.3f Acc@5 100.000", 100 * a }')" ] ||
  fail "Acc@1/Acc@5 line: '$acc_line' (val accuracy $val1)"
awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "val_acc5") c = i; if (!c) exit 1 }
         NR > 1 && $c != "1.0" { exit 1 }' "$OUT/metrics.csv" ||
  fail "metrics.csv's val_acc5 column: $(cat "$OUT/metrics.csv")"
grep -q -E '^\(Epoch 1/3\) Throughput: .* img/s total, .* img/s per rank' "$WORK/log" || fail "throughput line"
grep -q -E '^\(Epoch 1/3\) Step time: .*data wait .*forward .*backward .*exposed comm .*optimizer' "$WORK/log" ||
  fail "step time breakdown"
grep -q -F "has been saved to $OUT/best_model.h5" "$WORK/log" || fail "best model path"
# The run's first step (planning, first allocations) on its own line in its epoch only,
# left out of the throughput; the other epochs have none.
grep -q -E '^\(Epoch 1/3\) Warm-up: first step [0-9.]+ s \(planning, first allocations\), left out of the throughput$' \
  "$WORK/log" || fail "warm-up line"
[ "$(grep -c 'Warm-up: first step' "$WORK/log")" = 1 ] || fail "a warm-up line in a later epoch"

loss1=$(grep -F '(Epoch 1/3) Average train loss:' <<<"$LOG" | sed 's/.*loss: \([^,]*\),.*/\1/')
loss3=$(grep -F '(Epoch 3/3) Average train loss:' <<<"$LOG" | sed 's/.*loss: \([^,]*\),.*/\1/')
float_lt "$loss3" "$loss1" || fail "train loss did not fall ($loss1 -> $loss3)"
best_line=$(grep -F 'Best model (val loss:' <<<"$LOG")
best_acc=$(sed 's/.*val accuracy: \([^)]*\)).*/\1/' <<<"$best_line")
float_lt 0.45 "$best_acc" || fail "best validation accuracy $best_acc is not well above chance (0.2)"
note "loss $loss1 -> $loss3, best val accuracy $best_acc"

# Both checkpoints load; metadata is what the run was.
for f in last.h5 best_model.h5; do
  "$RD_BIN" info "$OUT/$f" >"$WORK/info" || fail "info $f"
  grep -q "model:           resnet_tiny, mlp head" "$WORK/info" || fail "info arch for $f"
done
"$RD_BIN" info "$OUT/last.h5" >"$WORK/info" && grep -q "epoch:           3 completed" "$WORK/info" || fail "last.h5 epoch"
"$RD_BIN" info --json --tensors "$OUT/best_model.h5" >"$WORK/info.json" || fail "info --json"
grep -q '"layer1.0.bn1.num_batches_tracked": \[\]' "$WORK/info.json" || fail "info --json --tensors"
if command -v h5dump >/dev/null; then
  h5dump -A "$OUT/best_model.h5" >"$WORK/dump" || fail "h5dump cannot read best_model.h5"
  grep -q '"resnet_ddp"' "$WORK/dump" || fail "h5dump shows no format attribute"
fi
[ "$(wc -l <"$OUT/metrics.csv")" = 4 ] || fail "metrics.csv should have a header and 3 rows"

# predict over the labelled validation split reproduces the final evaluation.
"$RD_BIN" predict --checkpoint "$OUT/best_model.h5" "$WORK/data" >"$WORK/pred" || fail "predict"
pred_acc=$(grep '^Accuracy: ' "$WORK/pred" | awk '{print $2}')
[ "$pred_acc" = "$best_acc" ] || fail "predict accuracy $pred_acc != best model val accuracy $best_acc"
grep -q 'Confusion matrix' "$WORK/pred" || fail "confusion matrix"
"$RD_BIN" predict --checkpoint "$OUT/last.h5" --json "$WORK/data/Validation" >"$WORK/pred.json" || fail "predict --json"
grep -q '"accuracy"' "$WORK/pred.json" || fail "json accuracy"
one=$(find "$WORK/data/Validation/Coat" -name '*.png' | head -n 1)
"$RD_BIN" predict --checkpoint "$OUT/best_model.h5" "$one" >"$WORK/one" && grep -q 'p(Coat)' "$WORK/one" ||
  fail "single-image table"

if command -v gnuplot >/dev/null; then
  "$RD_ROOT/tools/plot_metrics.sh" "$OUT/metrics.csv" "$WORK/curves.png" >/dev/null || fail "plot_metrics.sh"
  [ -s "$WORK/curves.png" ] || fail "no PNG written"
fi
note "ok"
