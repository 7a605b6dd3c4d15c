#!/usr/bin/env bash
# CPU placement of GPU ranks, on the emulated CUDA device: the default --workers comes from
# the rank's affinity mask (its allowed cores less one for the launching thread), a rank
# whose loader and launching thread need more cores than it may use warns once naming both
# numbers and the fix, and `train --check` prints each rank's allowed cores and GPU.
#   $1 = resnet_ddp built on the emulated device, $2 = mpiexec, $3 = repository root.
source "$(dirname "$0")/common.sh"
command -v taskset >/dev/null 2>&1 || { echo "SKIP: no taskset (util-linux)"; exit 77; }
export RD_EMU_DEVICE_COUNT=1
synth_data "$WORK/data" 8 4
args=(--data "$WORK/data" --arch resnet_tiny --image-size 32 --threads 1 --batch-size 4 --epochs 1 --max-steps 1
  --log-every 0 --device cuda)
first=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*\([0-9]*\).*/\1/p' /proc/self/status)

# on_cores CPUS NP LOG ARGS...: NP ranks under mpirun, all limited to CPUS (no binding of mpirun's own).
on_cores() {
  local cpus=$1 np=$2 log=$3
  shift 3
  taskset -c "$cpus" "$RD_MPIEXEC" --oversubscribe --bind-to none -np "$np" "$RD_BIN" "$@" >"$log" 2>&1 ||
    { cat "$log"; fail "$(basename "$log"): exit status $?"; }
}

note "one core, --workers 15: one warning naming 16 threads, 1 core and the fix"
on_cores "$first" 1 "$WORK/one.log" "${args[@]}" --workers 15 --output-dir "$WORK/one"
want="warning: --workers 15 + the launching thread need 16 cores, but rank 0 may use 1 (its CPU affinity)"
[[ $(grep -cF -- "$want" "$WORK/one.log") == 1 ]] || { cat "$WORK/one.log"; fail "expected one warning: $want"; }
grep -qF -- "--map-by ppr:RANKS:socket:PE=CORES" "$WORK/one.log" || fail "the warning does not name the fix"
grep -qF "Data loader: 15 thread(s) per rank (--workers)" "$WORK/one.log" || { cat "$WORK/one.log"; fail "workers line"; }

allowed=$(env -u OMP_NUM_THREADS nproc)  # nproc alone honours OMP_NUM_THREADS=1
if ((allowed >= 2)); then
  cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
  note "the default --workers: the rank's $allowed allowed cores less one, no warning"
  on_cores "$cpus" 1 "$WORK/default.log" "${args[@]}" --output-dir "$WORK/default"
  grep -qF "Data loader: $((allowed - 1)) thread(s) per rank (the rank's $allowed allowed core(s) less one" \
    "$WORK/default.log" || { cat "$WORK/default.log"; fail "the default --workers is not the affinity's cores less one"; }
  ! grep -q "launching thread need" "$WORK/default.log" || { cat "$WORK/default.log"; fail "warned with cores to spare"; }
  if ((allowed == 2)); then
    note "two ranks sharing 2 cores: each has 1, the default 1 worker + the launching thread warn once"
    export RD_EMU_DEVICE_COUNT=2
    on_cores "$cpus" 2 "$WORK/shared.log" "${args[@]}" --output-dir "$WORK/shared"
    want="warning: the default of 1 loader thread(s) + the launching thread need 2 cores, but rank 0 may use 1 (its CPU affinity) (and 1 more rank(s))"
    [[ $(grep -cF -- "$want" "$WORK/shared.log") == 1 ]] || { cat "$WORK/shared.log"; fail "expected one warning: $want"; }
    export RD_EMU_DEVICE_COUNT=1
  fi
fi

note "train --check: each rank's allowed cores and GPU"
taskset -c "$first" "$RD_BIN" train --check "${args[@]}" --workers 15 --output-dir "$WORK/check" >"$WORK/check.log" 2>&1 ||
  { cat "$WORK/check.log"; fail "--check exit $?"; }
grep -qF "check: placement: rank 0: 1 allowed core(s) ($first), GPU cuda:0 of 1 visible, 15 loader thread(s)" \
  "$WORK/check.log" || { cat "$WORK/check.log"; fail "--check does not print the rank's cores and GPU"; }
grep -qF "rank 0: 15 loader thread(s) + the launching thread need 16 cores, but it may use 1" "$WORK/check.log" ||
  { cat "$WORK/check.log"; fail "--check does not warn"; }
echo "PASS: GPU ranks' loader threads follow their allowed cores"
