#!/usr/bin/env bash
# The whole GPU check as ONE bounded command, for a short lease on a GPU host.
# From the repository root (or a bundle made by tools/gpu_bundle.sh):
#
#   tools/gpu_check.sh [--quick] [--out DIR]   run every step, print the summary table
#   tools/gpu_check.sh --dry-run               print the plan and its time budget, run nothing
#
# Every step runs under its own `timeout`; the timeouts of a plan add up to less than
# 9 minutes (checked below), so the command ends within its budget whatever hangs.
# Standalone (repository sources; the host needs nvcc, g++, and PyTorch for the
# comparison; no MPI, oneDNN, HDF5 or CMake):
#   build (this GPU's architecture only, nvcc + g++ in parallel: src/core, src/nn,
#   src/backend/cuda without NcclComm, kernels/, the op tests against a Catch2 header
#   and gpu_train_bench) -> op tests (every op vs the float64 reference, all
#   precisions) -> training-step benchmark ResNet-34 @244 batch 16 NHWC, fp32, tf32,
#   fp16, bf16 -> the same in PyTorch -> compute-sanitizer memcheck of one step of a
#   tiny model (fp16, MLP head) -> summary table.
# From a bundle nothing is built; NCCL, MPI, message_passing and short `resnet_ddp
# --device cuda` runs come before the benchmark.
# Results (logs, bench.jsonl, summary.txt) go to build-gpu-check/, and to --out DIR.
# The exit status is 0 only when every step passed (a missing Catch2 header fails).
# Environment: RD_GPU_ARCH=90 overrides the detected architecture,
#              RD_GPU_PYTHON picks the Python that has torch,
#              RD_CATCH2_INCLUDE a folder holding catch2/catch.hpp.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
OUT=$ROOT/build-gpu-check
STEPS=12 WARMUP=4
DRY=0 COPY_TO="" INTERNAL=""
while (($#)); do
  case $1 in
    --quick) STEPS=6 WARMUP=3 ;;
    --dry-run) DRY=1 ;;
    --out) COPY_TO=${2:?--out needs a folder}; shift ;;
    --internal-build) INTERNAL=build ;;  # the build step, run by this script under its timeout
    -h | --help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
BUNDLE=""
[[ -x $ROOT/run && -f $ROOT/payload.tar.xz ]] && BUNDLE=$ROOT
die() { echo "gpu_check.sh: $*" >&2; exit 2; }
JOBS=$(nproc 2>/dev/null || echo 4)

find_python() {
  PY=${RD_GPU_PYTHON:-}
  if [[ -z "$PY" ]]; then
    for p in python3 python /usr/bin/python3 /opt/torch/.venv/bin/python; do
      if command -v "$p" >/dev/null 2>&1 && "$p" -c "import torch" 2>/dev/null; then PY=$p; break; fi
    done
  fi
}

# ---- the standalone build (runs as its own process, under the build step's timeout) ----
if [[ $INTERNAL == build ]]; then
find_python
NVCC=$(command -v nvcc || true)
[[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
[[ -z "$NVCC" ]] && die "nvcc not found (PATH, /usr/local/cuda/bin): the CUDA toolkit is needed to build"
CUDA_HOME=$(cd "$(dirname "$NVCC")/.." && pwd)
"$NVCC" --version | tail -1
CXX=${CXX:-g++}
command -v "$CXX" >/dev/null || die "no host C++ compiler ($CXX)"

ARCH=${RD_GPU_ARCH:-}
if [[ -z "$ARCH" ]]; then
  ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
fi
[[ -z "$ARCH" && -n "$PY" ]] && ARCH=$("$PY" -c 'import torch;a,b=torch.cuda.get_device_capability();print(f"{a}{b}")' 2>/dev/null)
[[ -z "$ARCH" ]] && ARCH=90
echo "building for sm_$ARCH"

# Header + library directories: the toolkit first, then PyTorch's nvidia wheels.
INC=(-I"$CUDA_HOME/include") LIBDIRS=("$CUDA_HOME/lib64" "$CUDA_HOME/lib")
if [[ -n "$PY" ]]; then
  NV=$("$PY" -c 'import nvidia,os;print(os.path.dirname(list(nvidia.__path__)[0]+"/x"))' 2>/dev/null || true)
  # CUDA 13 wheels keep cuBLAS and cudart in nvidia/cu13 (review #13), CUDA 12 ones
  # in nvidia/cublas and nvidia/cuda_runtime.
  for sub in cudnn cu13 cublas cuda_runtime nccl; do
    [[ -d "$NV/$sub/include" ]] && INC+=(-I"$NV/$sub/include")
    [[ -d "$NV/$sub/lib" ]] && LIBDIRS+=("$NV/$sub/lib")
  done
fi
mkdir -p "$OUT/obj" "$OUT/lib"
find_lib() {  # find_lib cudnn -> links $OUT/lib/libcudnn.so to the first match
  for d in "${LIBDIRS[@]}"; do
    for f in "$d/lib$1.so" "$d"/lib$1.so.[0-9]*; do
      if [[ -e "$f" ]]; then ln -sf "$f" "$OUT/lib/lib$1.so"; echo "lib$1: $f"; return 0; fi
    done
  done
  die "lib$1 not found in ${LIBDIRS[*]}"
}
find_lib cudnn; find_lib cublas; find_lib cublasLt
HDR=""
for i in "${INC[@]}"; do [[ -f "${i#-I}/cudnn.h" ]] && HDR=${i#-I}; done
[[ -z "$HDR" ]] && die "cudnn.h not found in ${INC[*]#-I}"
echo "cudnn.h: $HDR"
LD_DIRS=$(printf '%s:' "${LIBDIRS[@]}")
printf '%s' "$LD_DIRS" > "$OUT/ld_dirs"  # for the steps that run what is built here
export LD_LIBRARY_PATH="$OUT/lib:${LD_DIRS}${LD_LIBRARY_PATH:-}"

COMMON=(-O2 -DNDEBUG -DRESNET_DDP_HAVE_CUDA=1 -I"$ROOT/include" -I"$ROOT/src" -I"$ROOT/kernels" -I"$ROOT/tests" "${INC[@]}")
CMDS=$OUT/compile_cmds.txt
: > "$CMDS"
OBJS=()
for f in kernels/*.cu; do
  o=$OUT/obj/$(echo "$f" | tr / _).o; OBJS+=("$o")
  echo "$NVCC -std=c++17 -gencode arch=compute_$ARCH,code=sm_$ARCH --expt-relaxed-constexpr ${COMMON[*]} -c $ROOT/$f -o $o" >> "$CMDS"
done
# The trainer's step and optimizer: gpu_train_bench times the step that trains.
for f in src/core/*.cpp src/nn/*.cpp src/backend/cuda/*.cpp src/train/train_step.cpp src/train/optimizer.cpp; do
  [[ "$f" == *nccl_comm* ]] && continue  # needs MPI, which bare GPU hosts lack
  o=$OUT/obj/$(echo "$f" | tr / _).o; OBJS+=("$o")
  echo "$CXX -std=c++20 -fPIC ${COMMON[*]} -c $ROOT/$f -o $o" >> "$CMDS"
done
# The op tests use Catch2 (Debian's header-only catch2 package). A bare GPU host has
# none: point RD_CATCH2_INCLUDE at a copy, or carry one in the ignored .gpu_deps/
# (`mkdir -p .gpu_deps/include && cp -r /usr/include/catch2 .gpu_deps/include/`);
# without it only the benchmark is built (the bundle ships the op tests prebuilt).
CATCH_INC=""
for d in "${RD_CATCH2_INCLUDE:-}" "$ROOT/.gpu_deps/include" /usr/include /usr/local/include; do
  if [ -n "$d" ] && [ -f "$d/catch2/catch.hpp" ]; then CATCH_INC=$d; break; fi
done
if [ -n "$CATCH_INC" ]; then
  CATCH_FLAG=""  # the compiler's own include dirs must not be repeated (breaks #include_next)
  case "$CATCH_INC" in /usr/include|/usr/local/include) ;; *) CATCH_FLAG="-isystem $CATCH_INC" ;; esac
  echo "$CXX -std=c++20 ${COMMON[*]} $CATCH_FLAG -c $ROOT/tests/gpu/test_cuda_backend.cpp -o $OUT/obj/test.o" >> "$CMDS"
  echo "$CXX -std=c++20 $CATCH_FLAG -c $ROOT/tests/common/catch_main.cpp -o $OUT/obj/catch_main.o" >> "$CMDS"
else
  # A failure, not a skip (review #13): without the op tests the run proves little.
  die "Catch2 header not found (RD_CATCH2_INCLUDE, .gpu_deps/include, /usr/include): carry .gpu_deps (docs/cuda.md)"
fi
echo "$CXX -std=c++20 ${COMMON[*]} -c $ROOT/tests/gpu/gpu_train_bench.cpp -o $OUT/obj/bench.o" >> "$CMDS"
if ! xargs -P "$JOBS" -I{} sh -c '{} || exit 255' < "$CMDS" > "$OUT/build.log" 2>&1; then
  grep -E "error|Error" -A3 "$OUT/build.log" | head -60
  die "build failed (full log: $OUT/build.log)"
fi
LIBS=(-L"$OUT/lib" -L"$CUDA_HOME/lib64" -lcudnn -lcublas -lcublasLt -lcudart -lpthread -ldl -lrt)
if [ -n "$CATCH_INC" ]; then
  "$CXX" -o "$OUT/test_cuda_backend" "$OUT/obj/test.o" "$OUT/obj/catch_main.o" "${OBJS[@]}" "${LIBS[@]}" ||
    die "link of test_cuda_backend failed"
fi
"$CXX" -o "$OUT/gpu_train_bench" "$OUT/obj/bench.o" "${OBJS[@]}" "${LIBS[@]}" || die "link of gpu_train_bench failed"
grep -c warning "$OUT/build.log" | sed 's/^/compiler warnings: /'
echo "built: $(ls "$OUT"/test_cuda_backend "$OUT"/gpu_train_bench 2>/dev/null | tr '\n' ' ')"
exit 0
fi

# ---- the plan: name, timeout (s), what it runs ---------------------------------------------
# Timeouts are upper bounds for a hang; on an H200 the whole plan took far less.
PLAN_STANDALONE=(
  "host          10  nvidia-smi, torch/cuDNN/NCCL versions"
  "build        140  nvcc + g++ -j$JOBS for this GPU's arch (op tests, gpu_train_bench)"
  "op_tests     100  every op vs the float64 reference, fp32/tf32/fp16/bf16 x NHWC/NCHW"
  "bench_fp32    30  ours: ResNet-34 @244 b16 NHWC training step"
  "bench_tf32    30  ours, tf32"
  "bench_fp16    30  ours, fp16 (loss scaling)"
  "bench_bf16    30  ours, bf16"
  "bench_torch   75  PyTorch, same model/batch, channels-last, 4 precisions"
  "memcheck      60  compute-sanitizer memcheck: 1 step resnet_tiny @64 b4 fp16 MLP head"
  "summary        5  the table"
)
PLAN_BUNDLE=(
  "host          10  nvidia-smi, torch/cuDNN/NCCL versions"
  "bundle_env    15  run --env: the host's CUDA libraries"
  "op_tests      90  every op vs the float64 reference, all precisions"
  "nccl_np1      40  mpirun -np 1 nccl_collective_test (-np 2 needs 2 GPUs)"
  "mpi_coll      25  mpirun -np 2 collective_test (host memory)"
  "msg_passing   30  mpirun message_passing --device cuda"
  "synth         20  resnet_ddp synth: a tiny image folder"
  "train_fp32    50  resnet_ddp --device cuda, 20 steps, default MLP head"
  "train_fp16    35  the same in fp16"
  "bench_fp32    25  ours: ResNet-34 @244 b16 NHWC training step"
  "bench_tf32    25  ours, tf32"
  "bench_fp16    25  ours, fp16"
  "bench_bf16    25  ours, bf16"
  "bench_torch   70  PyTorch, 4 precisions"
  "memcheck      45  compute-sanitizer memcheck: 1 step resnet_tiny @64 b4 fp16"
  "summary        5  the table"
)
BUDGET_LIMIT=540  # the timeouts of a plan must add up to less than 9 minutes
plan_sum() { local sum=0 line; for line in "$@"; do read -r _ t _ <<<"$line"; sum=$((sum + t)); done; echo "$sum"; }
timeout_of() { local line; for line in "${PLAN[@]}"; do read -r n t _ <<<"$line"; [[ $n == "$1" ]] && { echo "$t"; return; }; done; echo 30; }
print_plan() {
  local title=$1; shift
  local line n t what sum=0
  printf '%s
' "$title"
  for line in "$@"; do
    read -r n t what <<<"$line"
    sum=$((sum + t))
    printf '  %-12s %4ss  (by %4ss)  %s
' "$n" "$t" "$sum" "$what"
  done
  printf '  %-12s %4ss = %d min %02d s of timeouts (limit %ss)
' "total" "$sum" $((sum / 60)) $((sum % 60)) "$BUDGET_LIMIT"
}
for plan in standalone bundle; do
  declare -n P="PLAN_${plan^^}"
  (($(plan_sum "${P[@]}") < BUDGET_LIMIT)) || die "the $plan plan's timeouts exceed ${BUDGET_LIMIT}s: fix the plan"
done
if [[ -n $BUNDLE ]]; then PLAN=("${PLAN_BUNDLE[@]}"); MODE=bundle; else PLAN=("${PLAN_STANDALONE[@]}"); MODE=standalone; fi

if ((DRY)); then
  echo "gpu_check.sh --dry-run: nothing is run. This copy would use the $MODE plan."
  print_plan "standalone plan (repository sources built on the GPU host):" "${PLAN_STANDALONE[@]}"
  print_plan "bundle plan (bundle/gpu made by tools/gpu_bundle.sh, nothing built):" "${PLAN_BUNDLE[@]}"
  CATCH=""
  for d in "${RD_CATCH2_INCLUDE:-}" "$ROOT/.gpu_deps/include"; do
    [[ -n $d && -f $d/catch2/catch.hpp ]] && CATCH=$d
  done
  if [[ -n $CATCH ]]; then
    echo "Catch2 for the op tests: $CATCH (carry .gpu_deps)"
  elif [[ $MODE == standalone ]]; then
    echo "Catch2 for the op tests: NOT in .gpu_deps: the GPU host has none, and the op tests step would fail."
    echo "  prepare: mkdir -p .gpu_deps/include && cp -r /usr/include/catch2 .gpu_deps/include/"
  fi
  echo "device call (docs/cuda.md): run(command=\"tools/gpu_check.sh --out \$OUT\", carry=[\".gpu_deps\"], timeout_s=570)"
  exit 0
fi

# ---- the run --------------------------------------------------------------------------------
mkdir -p "$OUT"
LOG=$OUT/steps
rm -rf "$LOG"; mkdir -p "$LOG"
T0=$(date +%s)
declare -A RC SECS
ORDER=()
# step NAME CMD...: runs CMD under NAME's timeout from the plan, output to the terminal and
# $LOG/NAME.log; records its exit status (124: timed out) and duration.
step() {
  local name=$1 limit rc t
  shift
  limit=$(timeout_of "$name")
  printf '
== %s (timeout %ss, t=%ss)
' "$name" "$limit" "$(( $(date +%s) - T0 ))"
  t=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$LOG/$name.log"
  rc=${PIPESTATUS[0]}
  RC[$name]=$rc SECS[$name]=$(( $(date +%s) - t ))
  ORDER+=("$name")
  echo "-- $name: exit $rc in ${SECS[$name]}s"
  return 0
}

find_python
host_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 | head -3
  if [[ -n "$PY" ]]; then
    echo "python with torch: $PY"
    "$PY" -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")'
  else
    echo "no Python with torch: the PyTorch comparison is skipped"
  fi
}
step host host_info

if [[ -n $BUNDLE ]]; then
  step bundle_env "$BUNDLE/run" --env
  TEST_CMD=("$BUNDLE/run" test_gpu_cuda_backend)
  BENCH_CMD=("$BUNDLE/run" gpu_train_bench)
  TORCH_BENCH=$BUNDLE/tools/torch_gpu_bench.py
else
  step build "$0" --internal-build
  TEST_CMD=("$OUT/test_cuda_backend")
  BENCH_CMD=("$OUT/gpu_train_bench")
  TORCH_BENCH=$ROOT/tests/gpu/torch_gpu_bench.py
  BUILT_LD_DIRS=$(cat "$OUT/ld_dirs" 2>/dev/null)
  export LD_LIBRARY_PATH="$OUT/lib:${BUILT_LD_DIRS}${LD_LIBRARY_PATH:-}"
fi

# Catch2's console summary: "All tests passed (A assertions in N test cases)" or
# "test cases: N | P passed | F failed".
step op_tests "${TEST_CMD[@]}"

if [[ -n $BUNDLE ]]; then
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/rd_gpu_check.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  ((GPUS > 0)) || GPUS=1
  NP=$((GPUS < 4 ? GPUS : 4))
  step nccl_np1 "$BUNDLE/run" mpirun -np 1 nccl_collective_test
  step mpi_coll "$BUNDLE/run" mpirun -np 2 --oversubscribe collective_test
  step msg_passing "$BUNDLE/run" mpirun -np "$NP" message_passing --device cuda --verbose
  step synth "$BUNDLE/run" resnet_ddp synth --out "$WORK/synth"
  WORKERS=$(( JOBS / NP - 1 )); ((WORKERS >= 1)) || WORKERS=1
  step train_fp32 "$BUNDLE/run" mpirun -np "$NP" resnet_ddp --device cuda --data "$WORK/synth" --epochs 1     --max-steps 20 --workers "$WORKERS" --progress lines --log-every 5 --resume none --output-dir "$WORK/out_fp32"
  step train_fp16 "$BUNDLE/run" mpirun -np "$NP" resnet_ddp --device cuda --data "$WORK/synth" --epochs 1     --max-steps 20 --precision fp16 --workers "$WORKERS" --progress lines --log-every 5 --resume none     --output-dir "$WORK/out_fp16"
fi

RES=$OUT/bench.jsonl
: > "$RES"
for prec in fp32 tf32 fp16 bf16; do
  step "bench_$prec" "${BENCH_CMD[@]}" --arch resnet34 --size 244 --batch 16 --precision "$prec"     --layout nhwc --steps "$STEPS" --warmup "$WARMUP"
  grep '^{' "$LOG/bench_$prec.log" >> "$RES"
done
if [[ -n "$PY" ]]; then
  step bench_torch "$PY" "$TORCH_BENCH" --arch resnet34 --size 244 --batch 16 --channels-last     --steps "$STEPS" --warmup "$WARMUP"
  grep '^{' "$LOG/bench_torch.log" >> "$RES"
fi

SANITIZER=$(command -v compute-sanitizer || true)
[[ -z $SANITIZER && -n ${CUDA_HOME:-} && -x $CUDA_HOME/bin/compute-sanitizer ]] && SANITIZER=$CUDA_HOME/bin/compute-sanitizer
[[ -z $SANITIZER && -x /usr/local/cuda/bin/compute-sanitizer ]] && SANITIZER=/usr/local/cuda/bin/compute-sanitizer
if [[ -n $SANITIZER ]]; then
  step memcheck "$SANITIZER" --tool memcheck --print-limit 20 --error-exitcode 3 "${BENCH_CMD[@]}"     --arch resnet_tiny --size 64 --batch 4 --steps 1 --warmup 0 --precision fp16
else
  RC[memcheck]=127 SECS[memcheck]=0; ORDER+=(memcheck)
  echo "compute-sanitizer not found: memcheck not run" | tee "$LOG/memcheck.log"
fi

summary() {
  local name status
  echo "step          exit  seconds  result"
  for name in "${ORDER[@]}"; do
    case ${RC[$name]} in 0) status=ok ;; 124 | 137) status=TIMEOUT ;; *) status=FAILED ;; esac
    printf '%-12s %5s  %7s  %s
' "$name" "${RC[$name]}" "${SECS[$name]}" "$status"
  done
  echo
  echo "op tests: $(grep -E 'test cases' "$LOG/op_tests.log" 2>/dev/null | tail -2 | tr -s ' ' | paste -sd ';' -) (exit ${RC[op_tests]:-?})"
  echo "memcheck: $(grep -E 'ERROR SUMMARY' "$LOG/memcheck.log" 2>/dev/null | tail -1 || true) (exit ${RC[memcheck]:-?})"
  echo
  "${PY:-python3}" - "$RES" <<'PYEOF'
import json, sys
rows = []
for l in open(sys.argv[1]):
    try:
        rows.append(json.loads(l))
    except ValueError:
        pass
ours = {r["precision"]: r for r in rows if r.get("framework") == "resnet_ddp"}
ref = {r["precision"]: r for r in rows if r.get("framework") == "pytorch"}
print("training step, ResNet-34 @244 batch 16, img/s (peak memory MiB)")
print(f"{'precision':9} {'resnet_ddp':>11} {'pytorch':>9} {'ratio':>6} {'ours MiB':>9} {'torch MiB':>10}")
for p in ("fp32", "tf32", "fp16", "bf16"):
    a, b = ours.get(p), ref.get(p)
    ra = f"{a['img_per_s']:.1f}" if a else "-"
    rb = f"{b['img_per_s']:.1f}" if b else "-"
    ratio = f"{a['img_per_s'] / b['img_per_s']:.2f}" if a and b else "-"
    ma = f"{a.get('memory_used_mib', 0):.0f}" if a else "-"
    mb = f"{b.get('peak_memory_mib', '-')}" if b else "-"
    print(f"{p:9} {ra:>11} {rb:>9} {ratio:>6} {ma:>9} {mb:>10}")
PYEOF
}
printf '
== summary (t=%ss, %s plan)
' "$(( $(date +%s) - T0 ))" "$MODE"
summary | tee "$OUT/summary.txt"
if [[ -n $COPY_TO ]]; then
  mkdir -p "$COPY_TO" && cp -r "$OUT/summary.txt" "$RES" "$LOG" "$COPY_TO"/ 2>/dev/null
  [[ -f $OUT/build.log ]] && cp "$OUT/build.log" "$COPY_TO"/
fi
FIRST_BAD=0
for name in "${ORDER[@]}"; do
  if [[ ${RC[$name]} != 0 ]]; then FIRST_BAD=${RC[$name]}; echo "first failing step: $name (exit $FIRST_BAD)"; break; fi
done
exit $((FIRST_BAD == 0 ? 0 : 1))
