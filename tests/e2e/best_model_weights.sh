#!/usr/bin/env bash
# best_model.h5 holds the weights only (with Adam the optimizer state would make it 3x
# the model); last.h5 keeps the optimizer and scheduler state to resume from. The best
# model evaluates, predicts and starts another run with --init; resuming from it is
# refused with the way out.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 16 6
OUT="$WORK/out"
args=(--data "$WORK/data" "${TINY[@]}" --batch-size 4)
"$RD_BIN" "${args[@]}" --epochs 1 --output-dir "$OUT" >"$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; fail "training"; }

best=$(stat -c %s "$OUT/best_model.h5")
last=$(stat -c %s "$OUT/last.h5")
note "best_model.h5 $best bytes, last.h5 $last bytes"
[ $((best * 2)) -lt "$last" ] || fail "best_model.h5 ($best bytes) is not much smaller than last.h5 ($last bytes)"
"$RD_BIN" info "$OUT/best_model.h5" >"$WORK/best.info" || fail "info best_model.h5"
"$RD_BIN" info "$OUT/last.h5" >"$WORK/last.info" || fail "info last.h5"
! grep -q '^optimizer:' "$WORK/best.info" || { cat "$WORK/best.info"; fail "best_model.h5 holds optimizer state"; }
grep -q '^optimizer:       adam' "$WORK/last.info" || { cat "$WORK/last.info"; fail "last.h5 lost its optimizer state"; }

note "the best model evaluates, predicts and initialises another run"
"$RD_BIN" --data "$WORK/data" --threads 1 --workers 1 --eval-only --resume "$OUT/best_model.h5" >"$WORK/eval.log" 2>&1 ||
  { cat "$WORK/eval.log"; fail "--eval-only --resume best_model.h5"; }
"$RD_BIN" predict --checkpoint "$OUT/best_model.h5" --threads 1 "$WORK/data" >"$WORK/pred.log" 2>&1 ||
  { cat "$WORK/pred.log"; fail "predict with best_model.h5"; }
"$RD_BIN" "${args[@]}" --epochs 1 --init "$OUT/best_model.h5" --output-dir "$WORK/o2" >"$WORK/init.log" 2>&1 ||
  { cat "$WORK/init.log"; fail "--init best_model.h5"; }

note "resuming training from it is refused, naming last.h5 and --init"
rc=0
"$RD_BIN" "${args[@]}" --epochs 2 --resume "$OUT/best_model.h5" --output-dir "$WORK/o3" >"$WORK/res.log" 2>&1 || rc=$?
cat "$WORK/res.log"
[ "$rc" = 2 ] || fail "--resume best_model.h5: exit $rc, expected 2"
grep -q -F "resume from last.h5, or train from these weights with --init $OUT/best_model.h5" "$WORK/res.log" ||
  fail "the refusal does not give the way out"
note "ok"
