#!/usr/bin/env bash
# --deterministic on the CPU backend: 2 epochs straight and 1 epoch + resume +
# 1 epoch give bit-identical parameters, optimizer state and printed metrics.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 120 40
common=(--data "$WORK/data" "${TINY[@]}" --batch-size 8 --lr 2e-3 --seed 5 --deterministic)

note "2 epochs straight"
mpi 2 "${common[@]}" --epochs 2 --output-dir "$WORK/a" >"$WORK/a.log" 2>&1 || { cat "$WORK/a.log"; fail "run a"; }
note "1 epoch, then resume for the second"
mpi 2 "${common[@]}" --epochs 1 --output-dir "$WORK/b" >"$WORK/b1.log" 2>&1 || { cat "$WORK/b1.log"; fail "run b1"; }
mpi 2 "${common[@]}" --epochs 2 --output-dir "$WORK/b" --resume auto >"$WORK/b2.log" 2>&1 || { cat "$WORK/b2.log"; fail "run b2"; }
cat "$WORK/b2.log"
grep -q -F "Resuming from $WORK/b/last.h5 at epoch 2" "$WORK/b2.log" || fail "the second run did not resume"

# Metrics lines (not the timing lines) of each epoch must match exactly.
metrics() { grep -E '^\(Epoch [0-9]+/[0-9]+\) (Average train|Val loss|Current best)' "$1" | sed 's/^(Epoch \([0-9]*\)\/[0-9]*)/\1/'; }
diff <(metrics "$WORK/a.log" | grep '^1 ') <(metrics "$WORK/b1.log") || fail "epoch 1 metrics differ"
diff <(metrics "$WORK/a.log" | grep '^2 ') <(metrics "$WORK/b2.log") || fail "epoch 2 metrics differ after resume"
diff <(grep -F 'Best model' "$WORK/a.log") <(grep -F 'Best model' "$WORK/b2.log" | sed "s|$WORK/b/|$WORK/a/|") ||
  fail "final evaluation differs"

# Parameters, BN buffers and Adam state: bit-identical (h5diff without tolerance).
if command -v h5diff >/dev/null; then
  for group in /state_dict /optimizer/exp_avg /optimizer/exp_avg_sq; do
    h5diff "$WORK/a/last.h5" "$WORK/b/last.h5" "$group" "$group" >"$WORK/diff" ||
      { head -n 20 "$WORK/diff"; fail "$group differs"; }
  done
else
  cmp <("$RD_BIN" info --tensors "$WORK/a/last.h5" | tail -n +3) <("$RD_BIN" info --tensors "$WORK/b/last.h5" | tail -n +3) ||
    fail "checkpoints differ"
fi
note "ok: bit-identical"
