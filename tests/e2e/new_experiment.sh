#!/usr/bin/env bash
# A new experiment never silently continues an old one. A command whose
# settings differ from the run in its --output-dir is refused (exit 2) with the
# differences listed, unless --resume was given; the same command again continues (or,
# all epochs done, trains nothing and claims no "Best model ... saved"); flags that
# change only how a run executes (workers, logging) do not count. Inside a Slurm job
# (SLURM_JOB_ID) the same holds, except for a requeue (SLURM_RESTART_COUNT grown) of the
# job and step that wrote last.h5, which resumes unasked.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 24 9
OUT="$WORK/out"
base=(--data "$WORK/data" "${TINY[@]}" --batch-size 4 --output-dir "$OUT")

# expect_rc WANT LOG CMD...
expect_rc() {
  local want=$1 log=$2 rc=0
  shift 2
  "$@" >"$log" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || { cat "$log"; fail "$(basename "$log"): exit $rc, expected $want"; }
}

note "run 1: one epoch at lr 1e-4"
expect_rc 0 "$WORK/r1" "$RD_BIN" "${base[@]}" --epochs 1 --lr 1e-4
grep -q '^Best model (val loss: ' "$WORK/r1" || fail "run 1 has no Best model line"
rows=$(wc -l <"$OUT/metrics.csv")

note "another --lr, --epochs and --data in the same folder: refused, differences listed"
mkdir -p "$WORK/other"
cp -r "$WORK/data/." "$WORK/other/"
expect_rc 2 "$WORK/r2" "$RD_BIN" "${base[@]/$WORK\/data/$WORK/other}" --epochs 2 --lr 1e-2
cat "$WORK/r2"
grep -q -F "resnet_ddp: error: --output-dir $OUT holds another run ($OUT/last.h5, 1 epoch(s) done) whose settings differ" \
  "$WORK/r2" || fail "the refusal does not name the folder"
for d in "  --lr 0.01 (that run: 0.0001)" "  --epochs 2 (that run: 1)" "  --data $WORK/other (that run: $WORK/data)"; do
  grep -q -x -F -- "$d" "$WORK/r2" || fail "difference not listed: $d"
done
grep -q -F -- "add --resume auto" "$WORK/r2" && grep -q -F -- "use another --output-dir" "$WORK/r2" ||
  fail "the refusal does not say how to continue or start fresh"
[ "$(wc -l <"$OUT/metrics.csv")" = "$rows" ] || fail "the refused run wrote metrics"

note "a default that differs counts too (--epochs left out: 5, the run had 1)"
expect_rc 2 "$WORK/r3" "$RD_BIN" --data "$WORK/data" "${TINY[@]}" --batch-size 4 --output-dir "$OUT" --lr 1e-4
grep -q -x -F -- "  --epochs 5 (default) (that run: 1)" "$WORK/r3" || { cat "$WORK/r3"; fail "default --epochs not listed"; }

note "the same command again: nothing to train, no Best model claim"
expect_rc 0 "$WORK/r4" "$RD_BIN" "${base[@]}" --epochs 1 --lr 1e-4 --workers 2 --log-every 5
cat "$WORK/r4"
grep -q 'nothing to train' "$WORK/r4" || fail "no 'nothing to train' notice"
! grep -q 'Best model' "$WORK/r4" || fail "a run that trained nothing claims a Best model"

note "--resume auto asked for: continues with the changes named"
expect_rc 0 "$WORK/r5" "$RD_BIN" "${base[@]}" --epochs 2 --lr 1e-2 --resume auto
grep -q -x -F "Resume: --lr 0.01 instead of the checkpoint's 0.0001 (the learning rate restarts from it)" "$WORK/r5" ||
  { cat "$WORK/r5"; fail "--resume auto: the change is not named"; }
grep -q '^(Epoch 2/2) Val loss' "$WORK/r5" || fail "--resume auto did not train epoch 2"

note "inside a Slurm job the same holds: a checkpoint from outside any job is refused"
slurm_job=(env SLURM_JOB_ID=4242 SLURM_STEP_ID=0)
expect_rc 2 "$WORK/r6" "${slurm_job[@]}" "$RD_BIN" "${base[@]}" --epochs 3 --lr 1e-2
grep -q -x -F -- "  --epochs 3 (that run: 2)" "$WORK/r6" || { cat "$WORK/r6"; fail "Slurm: difference not listed"; }
grep -q -x -F "(Slurm job 4242: only a requeue of the job that wrote the checkpoint (none recorded) continues it unasked)" \
  "$WORK/r6" || { cat "$WORK/r6"; fail "Slurm: the refusal does not say why"; }
expect_rc 2 "$WORK/r6c" "${slurm_job[@]}" "$RD_BIN" "${base[@]}" --epochs 3 --lr 1e-2 --check
grep -q -x -F -- "  --epochs 3 (that run: 2)" "$WORK/r6c" || { cat "$WORK/r6c"; fail "Slurm --check: not refused"; }
expect_rc 0 "$WORK/r7" "${slurm_job[@]}" "$RD_BIN" "${base[@]}" --epochs 3 --lr 1e-2 --resume auto
grep -q '^(Epoch 3/3) Val loss' "$WORK/r7" || { cat "$WORK/r7"; fail "Slurm --resume auto: epoch 3 not trained"; }

note "the job's next experiment (another step, or the same one: no requeue) is refused"
expect_rc 2 "$WORK/r8" env SLURM_JOB_ID=4242 SLURM_STEP_ID=1 "$RD_BIN" "${base[@]}" --epochs 4 --lr 1e-2
grep -q -x -F "(Slurm job 4242: only a requeue of the job that wrote the checkpoint (job 4242 step 0, restart 0) continues it unasked)" \
  "$WORK/r8" || { cat "$WORK/r8"; fail "Slurm: another step of the job continued the run"; }
expect_rc 2 "$WORK/r9" "${slurm_job[@]}" "$RD_BIN" "${base[@]}" --epochs 4 --lr 1e-3
grep -q -x -F -- "  --lr 0.001 (that run: 0.01)" "$WORK/r9" || { cat "$WORK/r9"; fail "Slurm: a second run in the job continued"; }
note "another job, even a requeued one, is refused"
expect_rc 2 "$WORK/r10" env SLURM_JOB_ID=5000 SLURM_STEP_ID=0 SLURM_RESTART_COUNT=1 "$RD_BIN" "${base[@]}" --epochs 4 --lr 1e-2

note "a requeue of the job that wrote last.h5 (SLURM_RESTART_COUNT 1) continues unasked"
expect_rc 0 "$WORK/r11" "${slurm_job[@]}" SLURM_RESTART_COUNT=1 "$RD_BIN" "${base[@]}" --epochs 4 --lr 1e-2
grep -q -x -F "Resume: --epochs 4 instead of the checkpoint's 3" "$WORK/r11" || { cat "$WORK/r11"; fail "Slurm requeue: no resume"; }
grep -q '^(Epoch 4/4) Val loss' "$WORK/r11" || fail "Slurm requeue: epoch 4 not trained"

note "info: the first run's command line and each resume's"
"$RD_BIN" info "$OUT/last.h5" >"$WORK/info" || fail "info"
cat "$WORK/info"
grep -q -E "^first run: +.*resnet_ddp .*--epochs 1 --lr 1e-4\$" "$WORK/info" || fail "info: no first run"
grep -q -E "^resume 1: +.*resnet_ddp .*--epochs 2 --lr 1e-2 --resume auto\$" "$WORK/info" || fail "info: no resume 1"
grep -q -E "^resume 2: +.*resnet_ddp .*--epochs 3 --lr 1e-2 --resume auto\$" "$WORK/info" || fail "info: no resume 2"
grep -q -E "^resume 3: +.*resnet_ddp .*--epochs 4 --lr 1e-2\$" "$WORK/info" || fail "info: no resume 3"
grep -q -x -F "slurm job:       4242 step 0 restart 1" "$WORK/info" || fail "info: the writing Slurm job is not named"
[ "$(grep -c '^resume [0-9]*:' "$WORK/info")" = 3 ] || fail "info: the refused and untrained runs are not resumes"
"$RD_BIN" info --json "$OUT/last.h5" | grep -q '"args_history": \[.*--epochs 1 --lr 1e-4.*, .*, .*, .*--epochs 4' ||
  fail "info --json: no args_history"
note "ok"
