#!/usr/bin/env bash
# The learning rate and the global batch: --lr-base derives the lr
# from the global batch as timm does (an --lr given wins); a recipe's lr at a global
# batch more than 2x from the recipe's own warns once with the linearly scaled value; a
# training loss that becomes NaN or Inf stops every rank with a message and exit 1.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 8 4
R18=(--data "$WORK/data" --arch resnet18 --image-size 32 --threads 1 --workers 1 --log-every 0 --epochs 1)

# expect_rc WANT LOG CMD...
expect_rc() {
  local want=$1 log=$2 rc=0
  shift 2
  "$@" >"$log" 2>&1 || rc=$?
  [ "$rc" != 124 ] || { cat "$log"; fail "$(basename "$log"): still running after 120 s (a rank hangs?)"; }
  [ "$rc" = "$want" ] || { cat "$log"; fail "$(basename "$log"): exit $rc, expected $want"; }
}
# mpi2 ARGS...: resnet_ddp on 2 ranks, killed after 120 s (exit 124) if it hangs.
mpi2() { timeout 120 "$RD_MPIEXEC" --oversubscribe --bind-to none -np 2 "$RD_BIN" "$@"; }

note "--lr-base 0.1 on 2 ranks x batch 4: lr 0.1 x 8 / 256, printed and used"
expect_rc 0 "$WORK/base" mpi2 "${R18[@]}" -b 4 --optimizer sgd --lr-base 0.1 --output-dir "$WORK/o1"
grep -q -F "Learning rate 0.003125 = --lr-base 0.1 x (8 / --lr-base-size 256) (linear scaling; global batch 8 (2 rank(s) x batch 4 x accum 1))" \
  "$WORK/base" || { cat "$WORK/base"; fail "no derivation line"; }
grep -q -E "global batch 8, sgd lr 0.003125," "$WORK/base" || { cat "$WORK/base"; fail "the run's lr is not the derived one"; }
"$RD_BIN" info "$WORK/o1/last.h5" | grep -q "(initial 0.003125)" || fail "the optimizer did not start at the derived lr"

note "--check: sqrt scaling (adam's default under auto), --accum-steps counts, --lr wins"
expect_rc 0 "$WORK/sqrt" "$RD_BIN" "${R18[@]}" -b 4 --accum-steps 4 --lr-base 0.1 --output-dir "$WORK/o2" --check
grep -q -F "check: lr:        Learning rate 0.025 = --lr-base 0.1 x sqrt(16 / --lr-base-size 256) (sqrt scaling; global batch 16 (1 rank(s) x batch 4 x accum 4))" \
  "$WORK/sqrt" || { cat "$WORK/sqrt"; fail "adam: no sqrt derivation"; }
expect_rc 0 "$WORK/lin" "$RD_BIN" "${R18[@]}" -b 8 --lr-base 0.5 --lr-base-size 4 --lr-base-scale linear \
  --output-dir "$WORK/o2" --check
grep -q -F "Learning rate 1.0 = --lr-base 0.5 x (8 / --lr-base-size 4) (linear scaling" "$WORK/lin" ||
  { cat "$WORK/lin"; fail "--lr-base-scale linear"; }
expect_rc 0 "$WORK/wins" "$RD_BIN" "${R18[@]}" -b 4 --lr 0.01 --lr-base 0.1 --output-dir "$WORK/o2" --check
grep -q -F "Notice: --lr 0.01 given: it wins over --lr-base (as in timm)" "$WORK/wins" || { cat "$WORK/wins"; fail "--lr does not win"; }
expect_rc 2 "$WORK/alone" "$RD_BIN" "${R18[@]}" --lr-base-size 512 --output-dir "$WORK/o2" --check
grep -q -F -- "--lr-base-size: only with --lr-base" "$WORK/alone" || { cat "$WORK/alone"; fail "--lr-base-size alone accepted"; }

note "--recipe torchvision-resnet-v1 -b 4 on 2 ranks: one warning with the scaled lr"
V1=(--recipe torchvision-resnet-v1 --train-crop-size 32 --val-resize-size 32 --val-crop-size 32 --max-steps 1)
expect_rc 0 "$WORK/recipe" mpi2 "${R18[@]}" "${V1[@]}" -b 4 --output-dir "$WORK/o3"
warning="resnet_ddp: warning: --recipe torchvision-resnet-v1: its lr 0.1 is for a global batch of 256 (8 GPUs x batch 32); this run's is 8 (2 rank(s) x batch 4 x accum 1). Scaled linearly the lr is 0.003125: pass --lr 0.003125, or --lr-base 0.1 --lr-base-size 256 to derive it from any global batch"
[ "$(grep -c -F -- "$warning" "$WORK/recipe")" = 1 ] || { cat "$WORK/recipe"; fail "not one warning with the scaled lr"; }
note "within 2x of the recipe's global batch, or with --lr or --lr-base given: no warning"
expect_rc 0 "$WORK/near" "$RD_BIN" "${R18[@]}" "${V1[@]}" -b 128 --output-dir "$WORK/o4" --check
expect_rc 0 "$WORK/own" "$RD_BIN" "${R18[@]}" "${V1[@]}" -b 4 --lr 0.001 --output-dir "$WORK/o4" --check
expect_rc 0 "$WORK/derived" "$RD_BIN" "${R18[@]}" "${V1[@]}" -b 4 --lr-base 0.1 --output-dir "$WORK/o4" --check
for log in near own derived; do
  ! grep -q "warning: --recipe" "$WORK/$log" || { cat "$WORK/$log"; fail "$log: warned"; }
done
grep -q -F "Learning rate 0.0015625 = --lr-base 0.1 x (4 / --lr-base-size 256)" "$WORK/derived" ||
  { cat "$WORK/derived"; fail "--lr-base does not win over the recipe's lr"; }

note "--lr 1e6 (sgd) on 2 ranks: the weights diverge, both ranks stop, exit 1, no checkpoint"
# Two steps per epoch: the second step's loss is still finite (1e17), the weights after its
# update are not; validation is where it shows (a step's non-finite loss: cli_errors).
expect_rc 1 "$WORK/huge" mpi2 "${R18[@]}" -b 2 --optimizer sgd --lr 1e6 --output-dir "$WORK/o5"
grep -q -E "^resnet_ddp: error: the validation loss became NaN or Inf in epoch 1 \(train loss [0-9.e+]+, val loss nan\): the weights diverged; stopping without saving" \
  "$WORK/huge" || { cat "$WORK/huge"; fail "no non-finite message"; }
! grep -q "Best model" "$WORK/huge" || fail "a diverged run claims a best model"
if [ -e "$WORK/o5/last.h5" ] || [ -e "$WORK/o5/best_model.h5" ]; then fail "a diverged run wrote a checkpoint"; fi
note "ok"
