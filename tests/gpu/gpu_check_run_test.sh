#!/usr/bin/env bash
# The GPU check's GPU-less parts, run as CI runs them, so the check cannot rot between
# runs on a GPU host:
#  1. the standalone plan: the host step, the build (tools/gpu_check.sh --internal-build:
#     nvcc + g++ without MPI or CMake, sm_90 only), then every step that needs a GPU
#     reports "no device" (never a tooling error); overall exit 77;
#  2. the bundle plan, with this CMake build folder standing in for the bundle's programs:
#     host, bundle_env, mpi_coll (mpirun -np 2 collective_test) and synth run and pass,
#     the device steps report "no device";
#  2b. the same with --e2e: host, bundle_env, synth and placement (each rank's allowed CPUs
#     under mpirun's default and the corrected binding, train --check's placement line) pass;
#  3. the bundle plan with programs that hang: the run still ends by its deadline
#     (RD_GPU_CHECK_DEADLINE_S), the hung step is TIMEOUT, later ones "no time".
# Each run leaves ONE archive under --out holding every step's log.
#   gpu_check_run_test.sh BUILD_DIR
# Part 1 needs the CUDA toolkit (nvcc, cuDNN, cuBLAS) and a Catch2 header; without nvcc
# it is skipped (exit 77 when nothing could run).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: gpu_check_run_test.sh BUILD_DIR}" && pwd)
work=$build/tests/gpu/gpu_check_run
rm -rf "$work"
mkdir -p "$work"
export RD_GPU_CHECK_DEVICE=0       # GPU-less parts only, also on a machine with a GPU
export RD_GPU_CHECK_SLOWDOWN=3     # a loaded 2-core CI machine
export RD_GPU_ARCH=90              # one architecture: the fastest build that proves it
command -v ccache >/dev/null && export RD_GPU_CHECK_LAUNCHER=ccache
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# check_run NAME EXPECTED_OK_STEPS...: the run's exit status, its progress table and archive.
check_run() {
  local name=$1 rc=$2 out=$3 dir=$4 step status
  shift 4
  set -- "$@" summary
  [[ $rc == 77 ]] || fail "$name: exit $rc, expected 77 (every step passed or had no device)"
  local progress=$dir/progress.txt
  [[ -f $progress ]] || { fail "$name: no progress.txt"; return; }
  for step in "$@"; do
    status=$(awk -v s="$step" '$1 == s { $1 = $2 = $3 = ""; sub(/^ +/, ""); print }' "$progress")
    [[ $status == ok ]] || fail "$name: step $step is '${status:-missing}', expected ok"
  done
  # Everything else needs a device: "no device", never FAILED, TIMEOUT or "no time".
  while read -r step _ _ status; do
    case " $* " in *" $step "*) continue ;; esac
    [[ $status == "no device" ]] || fail "$name: step $step is '$status', expected 'no device'"
  done < "$progress"
  local tarball=$out/gpu_check.tar.gz listing
  [[ -f $tarball ]] || { fail "$name: no $tarball"; return; }
  [[ $(find "$out" -type f | wc -l) == 1 ]] || fail "$name: --out holds more than the one archive"
  listing=$(tar -tzf "$tarball") || { fail "$name: $tarball is not a readable archive"; return; }
  for f in summary.txt progress.txt steps/host.log; do
    grep -qx "$f" <<<"$listing" || fail "$name: the archive lacks $f"
  done
  grep -q '^cuDNN: \|^nvcc: ' "$dir/steps/host.log" 2>/dev/null || fail "$name: the host step recorded no versions"
}

ran=0
if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "== 1. standalone plan (build for sm_90, no device)"
  t=$(date +%s)
  RD_GPU_CHECK_DIR=$work/standalone "$repo/tools/gpu_check.sh" --out "$work/standalone_out"
  rc=$?
  echo "-- standalone plan: exit $rc in $(( $(date +%s) - t ))s"
  check_run standalone "$rc" "$work/standalone_out" "$work/standalone" host build
  for f in test_cuda_backend gpu_train_bench; do
    [[ -x $work/standalone/$f ]] || fail "standalone: the build made no $f"
  done
  grep -q "steps/build.log" <(tar -tzf "$work/standalone_out/gpu_check.tar.gz") ||
    fail "standalone: the archive lacks the build step's log"
  ran=1
else
  echo "== 1. standalone plan: skipped (no nvcc: the CUDA toolkit is not installed)"
fi

echo "== 2. bundle plan (this build folder's programs, no device)"
missing=""
for f in resnet_ddp tests/collective/collective_test; do [[ -x $build/$f ]] || missing+=" $f"; done
command -v mpirun >/dev/null || missing+=" mpirun"
if [[ -n $missing ]]; then
  fail "bundle: missing$missing (build everything first)"
else
  t=$(date +%s)
  RD_GPU_CHECK_DIR=$work/bundle RD_GPU_CHECK_BUILD_DIR=$build "$repo/tools/gpu_check.sh" --out "$work/bundle_out"
  rc=$?
  echo "-- bundle plan: exit $rc in $(( $(date +%s) - t ))s"
  check_run bundle "$rc" "$work/bundle_out" "$work/bundle" host bundle_env mpi_coll synth
  ran=1
fi

echo "== 2b. --e2e (the trainer end to end), this build folder's programs, no device"
if [[ -z $missing ]]; then
  t=$(date +%s)
  RD_GPU_CHECK_DIR=$work/e2e RD_GPU_CHECK_BUILD_DIR=$build "$repo/tools/gpu_check.sh" --e2e --out "$work/e2e_out"
  rc=$?
  echo "-- e2e plan: exit $rc in $(( $(date +%s) - t ))s"
  check_run e2e "$rc" "$work/e2e_out" "$work/e2e" host bundle_env synth placement
  # Each rank's allowed CPUs under both bindings, and the trainer's own view of them.
  for want in "mpirun -np 1 (the default binding): each rank's allowed CPUs" "rank 0: Cpus_allowed_list:" \
    "== nvidia-smi topo -m" "== nsys: " "check: placement: rank 0: "; do
    grep -qF -- "$want" "$work/e2e/steps/placement.log" 2>/dev/null || fail "e2e: the placement step lacks '$want'"
  done
  grep -q "median 20-120 ms" "$work/e2e/summary.txt" 2>/dev/null || fail "e2e: the summary has no step-time table"
fi

echo "== 3. a hanging program: the deadline holds and the archive keeps what ran"
# A build folder whose programs never return: mpi_coll times out, the next steps get
# no time, and the run still ends by its deadline with every step in the archive.
fake=$work/hanging_build
mkdir -p "$fake/tests/collective"
printf '#!/bin/sh\nexec sleep 1000\n' > "$fake/resnet_ddp"
cp "$fake/resnet_ddp" "$fake/tests/collective/collective_test"
chmod +x "$fake/resnet_ddp" "$fake/tests/collective/collective_test"
deadline=45
t=$(date +%s)
RD_GPU_CHECK_DIR=$work/hang RD_GPU_CHECK_BUILD_DIR=$fake RD_GPU_CHECK_SLOWDOWN=1 RD_GPU_CHECK_DEADLINE_S=$deadline \
  "$repo/tools/gpu_check.sh" --out "$work/hang_out"
rc=$?
took=$(( $(date +%s) - t ))
echo "-- hanging programs: exit $rc in ${took}s (deadline ${deadline}s)"
[[ $rc == 1 ]] || fail "hang: exit $rc, expected 1"
((took <= deadline + 10)) || fail "hang: took ${took}s, past the ${deadline}s deadline"
grep -q '^mpi_coll .*TIMEOUT' "$work/hang/progress.txt" 2>/dev/null || fail "hang: mpi_coll is not TIMEOUT"
grep -q '^synth .*no time' "$work/hang/progress.txt" 2>/dev/null || fail "hang: synth is not 'no time'"
tar -tzf "$work/hang_out/gpu_check.tar.gz" 2>/dev/null | grep -qx 'steps/mpi_coll.log' ||
  fail "hang: the archive lacks the timed-out step's log"

if ((fails)); then
  echo "$fails check(s) failed"
  exit 1
fi
((ran)) || exit 77
echo "ok: the GPU call's GPU-less parts pass"
