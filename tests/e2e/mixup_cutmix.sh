#!/usr/bin/env bash
# MixUp / CutMix and RASampler in a real 2-rank run:
#  - --mixup-alpha 0.2 --cutmix-alpha 1.0 trains: finite losses, the mixing is on
#    (announced, and the training loss differs from the same seeded run without it);
#  - its draws come from (seed, epoch, step, rank): 1 epoch + resume, and a run killed
#    mid-epoch and resumed from its --checkpoint-every save, end exactly as the
#    uninterrupted runs (--deterministic, CPU);
#  - --ra-sampler trains on a set large enough for it and refuses a too-small one
#    with a clear error naming the flag; bad alphas are refused.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 120 40
common=(--data "$WORK/data" "${TINY[@]}" --batch-size 8 --lr 2e-3 --seed 5 --deterministic --max-steps 4)
mix=(--mixup-alpha 0.2 --cutmix-alpha 1.0)

note "2 epochs with MixUp + CutMix, and the same without"
mpi 2 "${common[@]}" "${mix[@]}" --epochs 2 --output-dir "$WORK/a" >"$WORK/a.log" 2>&1 || { cat "$WORK/a.log"; fail "run a"; }
mpi 2 "${common[@]}" --epochs 1 --output-dir "$WORK/plain" >"$WORK/plain.log" 2>&1 || { cat "$WORK/plain.log"; fail "plain run"; }
cat "$WORK/a.log"
grep -q "Batch mixing: MixUp or CutMix (one per batch)" "$WORK/a.log" || fail "mixing not announced"
train_loss() { grep -E "^\(Epoch $2/[0-9]+\) Average train loss" "$1" | head -n 1; }
line_a=$(train_loss "$WORK/a.log" 1)
line_plain=$(train_loss "$WORK/plain.log" 1)
[ -n "$line_a" ] && [ -n "$line_plain" ] || fail "no training loss line"
loss_a=$(value_after "$line_a" "loss: ")
loss_plain=$(value_after "$line_plain" "loss: ")
awk -v l="$loss_a" 'BEGIN { exit !(l == l + 0 && l > 0 && l < 100) }' || fail "mixed training loss '$loss_a' not finite"
[ "$loss_a" != "$loss_plain" ] || fail "the training loss is the same with and without mixing ($loss_a)"

note "1 epoch, then resume: the same draws"
mpi 2 "${common[@]}" "${mix[@]}" --epochs 1 --output-dir "$WORK/b" >"$WORK/b1.log" 2>&1 || { cat "$WORK/b1.log"; fail "run b1"; }
mpi 2 "${common[@]}" "${mix[@]}" --epochs 2 --output-dir "$WORK/b" --resume auto >"$WORK/b2.log" 2>&1 ||
  { cat "$WORK/b2.log"; fail "run b2"; }
metrics() { grep -E '^\(Epoch [0-9]+/[0-9]+\) (Average train|Val loss)' "$1" | sed 's/^(Epoch \([0-9]*\)\/[0-9]*)/\1/'; }
diff <(metrics "$WORK/a.log" | grep '^2 ') <(metrics "$WORK/b2.log") || fail "epoch 2 metrics differ after resume"
# Parameters, BN buffers and Adam state: bit-identical (the run history lines differ).
if command -v h5diff >/dev/null; then
  for group in /state_dict /optimizer/exp_avg /optimizer/exp_avg_sq; do
    h5diff "$WORK/a/last.h5" "$WORK/b/last.h5" "$group" "$group" >"$WORK/diff" ||
      { head -n 20 "$WORK/diff"; fail "$group differs after resume"; }
  done
else
  tensors() { "$RD_BIN" info --tensors "$1" | grep -vE '^(file|command line|first run|resume [0-9]+): '; }
  cmp <(tensors "$WORK/a/last.h5") <(tensors "$WORK/b/last.h5") || fail "parameters differ after resume"
fi

note "killed mid-epoch (after a step-3 checkpoint), resumed: the same draws from that step on"
mid=(--data "$WORK/data" "${TINY[@]}" --batch-size 2 --epochs 1 --deterministic --checkpoint-every 3 --log-every 1
  --progress lines "${mix[@]}")
"$RD_BIN" "${mid[@]}" --output-dir "$WORK/c" >"$WORK/c.log" 2>&1 || { cat "$WORK/c.log"; fail "uninterrupted run"; }
"$RD_BIN" "${mid[@]}" --output-dir "$WORK/d" >"$WORK/d1.log" 2>&1 &
pid=$!
deadline=$((SECONDS + 60))
until grep -q '^(Epoch 1/1) step 8/' "$WORK/d1.log" 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || { cat "$WORK/d1.log"; fail "run d did not start"; }
  sleep 0.02
done
kill -KILL "$pid"
wait "$pid" 2>/dev/null || true
"$RD_BIN" "${mid[@]}" --output-dir "$WORK/d" >"$WORK/d2.log" 2>&1 || { cat "$WORK/d2.log"; fail "resumed run d"; }
grep -qE "^Resuming from $WORK/d/last.h5 at epoch 1 step [1-9]" "$WORK/d2.log" || { cat "$WORK/d2.log"; fail "no mid-epoch resume"; }
[ "$(grep '^(Epoch 1/1) Val loss' "$WORK/c.log")" = "$(grep '^(Epoch 1/1) Val loss' "$WORK/d2.log")" ] ||
  fail "validation after a mid-epoch resume differs from the uninterrupted run"
if command -v h5diff >/dev/null; then
  h5diff "$WORK/c/last.h5" "$WORK/d/last.h5" /state_dict /state_dict >"$WORK/diff" ||
    { head "$WORK/diff"; fail "parameters differ after a mid-epoch resume"; }
fi

note "RASampler"
synth_data "$WORK/big" 520 20
mpi 2 --data "$WORK/big" "${TINY[@]}" --batch-size 16 --epochs 1 --ra-sampler --ra-reps 3 --output-dir "$WORK/ra" \
  >"$WORK/ra.log" 2>&1 || { cat "$WORK/ra.log"; fail "RASampler run"; }
# floor(520 // 256 * 256 / 2) = 256 samples per rank: 16 steps of 16.
grep -qE "^\(Epoch 1/1\) Average train loss" "$WORK/ra.log" || { cat "$WORK/ra.log"; fail "no epoch under --ra-sampler"; }
set +e
mpi 2 "${common[@]}" --epochs 1 --ra-sampler --output-dir "$WORK/ra_small" >"$WORK/ra_small.log" 2>&1
code=$?
mpi 2 "${common[@]}" --epochs 1 --ra-sampler --check --output-dir "$WORK/ra_small" >"$WORK/ra_check.log" 2>&1
code_check=$?
mpi 2 --data "$WORK/big" "${TINY[@]}" --ra-sampler --ra-reps 3 --check --output-dir "$WORK/ra_check" \
  >"$WORK/ra_check_big.log" 2>&1
code_check_big=$?
"$RD_BIN" train --data "$WORK/data" --mixup-alpha -1 >"$WORK/alpha.log" 2>&1
code_alpha=$?
set -e
[ "$code" -eq 2 ] || { cat "$WORK/ra_small.log"; fail "--ra-sampler on 120 images exited $code, not 2"; }
grep -q -- "--ra-sampler: RASampler visits" "$WORK/ra_small.log" || { cat "$WORK/ra_small.log"; fail "no clear error"; }
# --check builds the sampler on the launcher's world: the same refusal before any training.
[ "$code_check" -eq 2 ] && grep -q -- "--ra-sampler: RASampler visits" "$WORK/ra_check.log" ||
  { cat "$WORK/ra_check.log"; fail "--check --ra-sampler on 120 images: exit $code_check, or no clear error"; }
[ "$code_check_big" -eq 0 ] && grep -q "RASampler x3: 256 samples per rank and epoch on 2 rank(s)" "$WORK/ra_check_big.log" ||
  { cat "$WORK/ra_check_big.log"; fail "--check --ra-sampler on 520 images"; }
[ "$code_alpha" -eq 2 ] && grep -q -- "--mixup-alpha" "$WORK/alpha.log" || { cat "$WORK/alpha.log"; fail "bad alpha accepted"; }
note "ok"
