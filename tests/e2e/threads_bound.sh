#!/usr/bin/env bash
# --threads beyond the cores a rank may use (its CPU affinity) is clamped with a warning
# (--threads 999 once made 1005 threads that never finished a step), and ranks x threads
# over the cores they share warns once for the whole job. The CPU sets come from
# taskset, so the test means the same on any machine with at least 2 cores.
source "$(dirname "$0")/common.sh"
command -v taskset >/dev/null || { echo "SKIP: taskset (util-linux) is not installed" >&2; exit 77; }
[ "$(nproc --all)" -ge 2 ] || { echo "SKIP: needs 2 cores" >&2; exit 77; }

synth_data "$WORK/data" 16 6
args=(--data "$WORK/data" --arch resnet_tiny --image-size 32 --workers 1 --batch-size 4 --epochs 1 --log-every 0)
warnings() { grep -c 'resnet_ddp: warning: ' "$1" || true; }

note "--threads 64 on a 1-core rank: clamped to 1, said once"
taskset -c 0 "$RD_BIN" "${args[@]}" --threads 64 --output-dir "$WORK/o1" >"$WORK/l1" 2>&1 ||
  { cat "$WORK/l1"; fail "clamped run failed"; }
cat "$WORK/l1"
grep -q -x -F "resnet_ddp: warning: --threads 64: more threads than the 1 core(s) rank 0 may use (its CPU affinity); clamped to 1" \
  "$WORK/l1" || fail "no clamp warning"
grep -q -E '^rank 0/1: .* 1 threads,' "$WORK/l1" || fail "the start-up line does not show 1 thread"
[ "$(warnings "$WORK/l1")" = 1 ] || fail "expected one warning"

note "OMP_NUM_THREADS=64 (the default's source) is clamped and named the same way"
OMP_NUM_THREADS=64 taskset -c 0 "$RD_BIN" "${args[@]}" --output-dir "$WORK/o2" >"$WORK/l2" 2>&1 ||
  { cat "$WORK/l2"; fail "OMP_NUM_THREADS run failed"; }
grep -q -F "resnet_ddp: warning: OMP_NUM_THREADS=64: more threads than the 1 core(s)" "$WORK/l2" ||
  { cat "$WORK/l2"; fail "OMP_NUM_THREADS not named"; }

note "2 ranks x 2 threads sharing 2 cores: one oversubscription warning for the job"
taskset -c 0,1 "$RD_MPIEXEC" --oversubscribe --bind-to none -np 2 "$RD_BIN" "${args[@]}" --threads 2 \
  --output-dir "$WORK/o3" >"$WORK/l3" 2>&1 || { cat "$WORK/l3"; fail "oversubscribed run failed"; }
cat "$WORK/l3"
grep -q -x -F "resnet_ddp: warning: 2 rank(s) x 2 thread(s) share the 2 core(s) of rank 0's node: oversubscribed, every rank will wait for the slowest (use --threads 1, or fewer ranks per node)" \
  "$WORK/l3" || fail "no oversubscription warning"
[ "$(warnings "$WORK/l3")" = 1 ] || fail "expected exactly one warning for the job"

note "2 ranks x 1 thread on 2 cores, and the default: no warning"
taskset -c 0,1 "$RD_MPIEXEC" --oversubscribe --bind-to none -np 2 "$RD_BIN" "${args[@]}" --threads 1 \
  --output-dir "$WORK/o4" >"$WORK/l4" 2>&1 || { cat "$WORK/l4"; fail "2 x 1 run failed"; }
[ "$(warnings "$WORK/l4")" = 0 ] || { cat "$WORK/l4"; fail "a warning for a run that fits"; }
(unset OMP_NUM_THREADS; taskset -c 0,1 "$RD_MPIEXEC" --oversubscribe --bind-to none -np 2 "$RD_BIN" "${args[@]}" \
  --output-dir "$WORK/o5" >"$WORK/l5" 2>&1) || { cat "$WORK/l5"; fail "default-threads run failed"; }
[ "$(warnings "$WORK/l5")" = 0 ] || { cat "$WORK/l5"; fail "a warning for the default threads"; }

note "predict --threads 64 on 1 core: clamped with a warning"
one=$(find "$WORK/data/Validation" -name '*.png' | head -n 1)
taskset -c 0 "$RD_BIN" predict --checkpoint "$WORK/o1/best_model.h5" --threads 64 "$one" >"$WORK/l6" 2>&1 ||
  { cat "$WORK/l6"; fail "predict failed"; }
grep -q -F "resnet_ddp: warning: --threads 64: more threads than the 1 core(s) this process may use" "$WORK/l6" ||
  { cat "$WORK/l6"; fail "predict: no clamp warning"; }
note "ok"
