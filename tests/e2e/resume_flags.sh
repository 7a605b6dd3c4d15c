#!/usr/bin/env bash
# Resume never drops a flag silently: a flag that differs from the checkpoint's run is
# honoured with one line each (lr, epochs, batch size with the position in the epoch
# re-sharded, workers, logging), or refused with exit 2 naming the flag and the
# checkpoint's value and how to start fresh (arch, head, image size, normalisation,
# optimizer). Model-defining flags left out come from the checkpoint.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 64 8
OUT="$WORK/out"
base=(--data "$WORK/data" --arch resnet_tiny --image-size 32 --threads 1 --conv-algo direct --output-dir "$OUT")

note "run 1: one epoch at lr 1e-4, batch 4"
"$RD_BIN" "${base[@]}" --epochs 1 --lr 1e-4 --batch-size 4 --workers 1 --log-every 0 >"$WORK/run1.log" 2>&1 ||
  { cat "$WORK/run1.log"; fail "run 1"; }

# refused FLAG VALUE CHECKPOINT_VALUE ARGS...: exit 2 naming both values and the way out.
refused() {
  local flag=$1 value=$2 theirs=$3 rc=0
  shift 3
  "$RD_BIN" "$@" >"$WORK/refused.log" 2>&1 || rc=$?
  cat "$WORK/refused.log"
  [ "$rc" = 2 ] || fail "$flag $value: exit $rc, expected 2"
  grep -q -F -- "resnet_ddp: error: $flag $value: checkpoint '$OUT/last.h5' does not match this run: it " \
    "$WORK/refused.log" || fail "$flag $value: the refusal does not name the flag"
  grep -q -F -- "$flag $theirs" "$WORK/refused.log" || fail "$flag: the checkpoint's value $theirs is not named"
  grep -q -F -- "to start fresh instead use --resume none or another --output-dir" "$WORK/refused.log" ||
    fail "$flag: no way to start fresh"
}
note "refused: model-defining flags and the optimizer"
refused --image-size 64 32 "${base[@]}" --epochs 2 --image-size 64
refused --arch resnet18 resnet_tiny "${base[@]}" --epochs 2 --arch resnet18
refused --head fc mlp "${base[@]}" --epochs 2 --head fc
refused --normalize imagenet none "${base[@]}" --epochs 2 --normalize imagenet
refused --optimizer sgd adam "${base[@]}" --epochs 2 --optimizer sgd

note "run 2: --epochs 2 --lr 1e-2 --batch-size 8 --workers 2 --log-every 1 are honoured, each named"
"$RD_BIN" "${base[@]}" --resume auto --epochs 2 --lr 1e-2 --batch-size 8 --workers 2 --log-every 1 --progress lines \
  >"$WORK/run2.log" 2>&1 || { cat "$WORK/run2.log"; fail "run 2"; }
cat "$WORK/run2.log"
for line in "Resume: --epochs 2 instead of the checkpoint's 1" \
  "Resume: --lr 0.01 instead of the checkpoint's 0.0001 (the learning rate restarts from it)" \
  "Resume: --batch-size 8 instead of the checkpoint's 4" \
  "Resume: --workers 2 instead of the checkpoint's 1" \
  "Resume: --log-every 1 instead of the checkpoint's 0" \
  "Resume: --progress lines instead of the checkpoint's auto"; do
  grep -q -x -F -- "$line" "$WORK/run2.log" || fail "missing: $line"
done
grep -q -F "x batch 8 x accum 1 = global batch 8, adam lr 0.01, scheduler plateau" "$WORK/run2.log" ||
  fail "run 2 does not train at lr 0.01 with batch 8"
grep -q '^(Epoch 2/2) step 1/8 ' "$WORK/run2.log" || fail "run 2 has no progress line of 8 steps"
lr2=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "lr") c = i } NR == 3 { print $c }' "$OUT/metrics.csv")
[ "$lr2" = 0.01 ] || fail "metrics.csv: epoch 2 trained at lr $lr2, expected 0.01"
"$RD_BIN" info "$OUT/last.h5" >"$WORK/info" 2>&1
grep -q 'initial 0.01' "$WORK/info" || { cat "$WORK/info"; fail "last.h5 does not record initial lr 0.01"; }

note "run 3: the same command again changes nothing and says nothing"
"$RD_BIN" "${base[@]}" --resume auto --epochs 3 --lr 1e-2 --batch-size 8 --workers 2 --log-every 1 --progress lines \
  >"$WORK/run3.log" 2>&1 || { cat "$WORK/run3.log"; fail "run 3"; }
[ "$(grep -c '^Resume: ' "$WORK/run3.log")" = 1 ] || { cat "$WORK/run3.log"; fail "run 3: expected only the --epochs line"; }
grep -q -x -F "Resume: --epochs 3 instead of the checkpoint's 2" "$WORK/run3.log" || fail "run 3: no --epochs line"

note "run 4: left-out --arch/--image-size come from the checkpoint"
"$RD_BIN" --data "$WORK/data" --threads 1 --conv-algo direct --output-dir "$OUT" --resume auto --epochs 4 --lr 1e-2 --batch-size 8 \
  --workers 2 --log-every 1 --progress lines >"$WORK/run4.log" 2>&1 || { cat "$WORK/run4.log"; fail "run 4"; }
grep -q -x -F "Model settings from $OUT/last.h5: --arch resnet_tiny --image-size 32" "$WORK/run4.log" ||
  { cat "$WORK/run4.log"; fail "run 4 did not take the model settings from the checkpoint"; }
grep -q '^(Epoch 4/4) Val loss' "$WORK/run4.log" || fail "run 4 did not train"

note "a batch-size change mid-epoch continues from the same samples, re-sharded"
OUTP="$WORK/outp"
slow=(--data "$WORK/data" --arch resnet18 --image-size 64 --threads 1 --conv-algo direct --workers 1 --epochs 1
  --output-dir "$OUTP" --log-every 1 --progress lines)
"$RD_BIN" "${slow[@]}" --batch-size 2 >"$WORK/p1.log" 2>&1 &
pid=$!
deadline=$((SECONDS + 60))
until grep -q '(Epoch 1/1) step 5/' "$WORK/p1.log" 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || { cat "$WORK/p1.log"; fail "preempted run did not start"; }
  sleep 0.05
done
kill -USR1 "$pid"
wait "$pid" || { cat "$WORK/p1.log"; fail "preempted run failed"; }
step=$(sed -n 's/^Preempted at epoch 1 step \([0-9]*\);.*/\1/p' "$WORK/p1.log")
[ -n "$step" ] && [ "$step" -lt 32 ] || { cat "$WORK/p1.log"; fail "not preempted mid-epoch"; }
"$RD_BIN" "${slow[@]}" --batch-size 3 --resume auto >"$WORK/p2.log" 2>&1 || { cat "$WORK/p2.log"; fail "resume with batch 3"; }
cat "$WORK/p2.log"
new=$((2 * step / 3))
again=$((2 * step - 3 * new))
msg="Notice: epoch 1 was stopped after $step steps of 2 samples; at 3 samples per step it continues after step $new"
[ "$again" = 0 ] || msg+=" and trains $again of its samples again"
grep -q -x -F "$msg" "$WORK/p2.log" || fail "expected: $msg"
grep -q -x -F "Resuming from $OUTP/last.h5 at epoch 1 step $new" "$WORK/p2.log" || fail "wrong resume position"
first=$(grep -m 1 -o -E '^\(Epoch 1/1\) step [0-9]+/[0-9]+' "$WORK/p2.log")
[ "$first" = "(Epoch 1/1) step $((new + 1))/22" ] || fail "first step after resume: $first, expected step $((new + 1))/22"

note "run 5: a run started with --amp, resumed with the precision --amp chose, says nothing of precision"
amp=(--data "$WORK/data" --arch resnet_tiny --image-size 32 --threads 1 --output-dir "$WORK/amp" --batch-size 8
  --workers 1 --log-every 0)
if "$RD_BIN" "${amp[@]}" --epochs 1 --amp >"$WORK/amp1.log" 2>&1; then
  "$RD_BIN" "${amp[@]}" --resume auto --epochs 2 --precision bf16 >"$WORK/amp2.log" 2>&1 || { cat "$WORK/amp2.log"; fail "amp run 2"; }
  ! grep -q -e '--precision\|--amp' "$WORK/amp2.log" || { cat "$WORK/amp2.log"; fail "amp run 2: a precision notice"; }
  "$RD_BIN" "${amp[@]}" --resume auto --epochs 3 --precision fp32 >"$WORK/amp3.log" 2>&1 || { cat "$WORK/amp3.log"; fail "amp run 3"; }
  grep -q -x -F "Resume: --precision fp32 instead of the checkpoint's bf16" "$WORK/amp3.log" ||
    { cat "$WORK/amp3.log"; fail "amp run 3: the precision change is not named"; }
elif grep -q 'bf16 needs a CPU with AVX512-BF16 or AMX' "$WORK/amp1.log"; then
  note "skipped: this CPU has no bf16, so --amp is refused (as it should be)"
else
  cat "$WORK/amp1.log"
  fail "amp run 1"
fi
note "ok"
