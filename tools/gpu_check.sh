#!/usr/bin/env bash
# The whole GPU check as ONE bounded command on a GPU host.
# From the repository root (or a bundle made by tools/gpu_bundle.sh):
#
#   tools/gpu_check.sh [--quick] [--out DIR]   run every step, print the summary table
#   tools/gpu_check.sh --dry-run               print the plan, its time budget and the device call
#   tools/gpu_check.sh --e2e [--out DIR]       the trainer end to end (a bundle, or
#                                              RD_GPU_CHECK_BUILD_DIR): within 8 minutes
#
# --e2e: each rank's allowed CPUs under mpirun's default binding and under the corrected
# one, `nvidia-smi topo -m`, whether nsys exists; resnet_ddp --device cuda 120 steps of
# ResNet-34 @244 b16 (--log-every 1) in fp32 and fp16 under the corrected binding (the
# default --workers, from the rank's allowed cores), fp32 also under the default one
# (--workers 15, as a bare `mpirun -np 1` runs), fp16 also with --cuda-graphs off (every
# kernel launched by the host), step 1 reported apart from the median of
# steps 20-120 (TensorBoard step/time_ms); 30 steps under `nsys profile --stats=true`
# if nsys exists; gpu_train_bench fp32 NHWC vs NCHW with RD_CONV_REPORT=1; PyTorch's
# DDP recipe (bench/pytorch_gpu_ddp_recipe.py --device cuda) on the same data.
#
# Every step runs under its own `timeout`, capped so that the whole run ends within a
# hard deadline (540 s after the start, kill-after and archiving included): the
# device call's limit (570 s) is never reached, whatever hangs.
# Standalone (repository sources; the host needs nvcc, g++, and PyTorch for the
# comparison; no MPI, oneDNN, HDF5 or CMake):
#   build (this GPU's architecture only, nvcc + g++ in parallel: src/core, src/nn,
#   src/backend (contract), src/backend/cuda without NcclComm, the top-level kernels/, the op tests against a Catch2 header
#   and gpu_train_bench) -> op tests (every op vs the float64 reference, all
#   precisions) -> training-step benchmark ResNet-34 @244 batch 16 NHWC, fp32, tf32,
#   fp16, bf16 -> the same in PyTorch -> compute-sanitizer memcheck of one step of a
#   tiny model (fp16, MLP head, cuDNN heuristics instead of Find) -> summary table.
# From a bundle nothing is built; NCCL, MPI, message_passing and short `resnet_ddp
# --device cuda` runs come before the benchmark.
# Results (step logs, bench.jsonl, summary.txt) go to build-gpu-check/; with --out DIR
# they are also packed into ONE file, DIR/gpu_check.tar.gz, rewritten as each step
# ends (a device call returns at most 8 files; a timeout still returns every step so far).
# Without a GPU the steps that need one report "no device" and are not run.
# Exit status: 0 every step passed; 77 every step passed or had no device; else 1.
# Environment: RD_GPU_ARCH=90 overrides the detected architecture,
#              RD_GPU_PYTHON picks the Python that has torch,
#              RD_CATCH2_INCLUDE a folder holding catch2/catch.hpp,
#              RD_GPU_CHECK_DIR the work folder (default build-gpu-check/),
#              RD_GPU_CHECK_LAUNCHER a compiler launcher for the build (e.g. ccache),
#              RD_GPU_CHECK_SLOWDOWN N multiplies every timeout and the deadline (slow CI),
#              RD_GPU_CHECK_DEADLINE_S the hard deadline in seconds (default 540 x slowdown),
#              RD_GPU_CHECK_BUILD_DIR a CMake build folder whose programs stand in for a
#                bundle's (tests/gpu/gpu_check_run_test.sh runs the bundle plan so).
set -uo pipefail
SELF_DIR=$(cd "$(dirname "$0")" && pwd)
cd "$SELF_DIR/.." || exit 2
ROOT=$PWD
SELF=$SELF_DIR/$(basename "$0")  # absolute: the steps re-run it from any folder
OUT=${RD_GPU_CHECK_DIR:-$ROOT/build-gpu-check}
STEPS=12 WARMUP=4
DRY=0 E2E=0 COPY_TO="" INTERNAL=""
while (($#)); do
  case $1 in
    --quick) STEPS=6 WARMUP=3 ;;
    --dry-run) DRY=1 ;;
    --e2e) E2E=1 ;;
    --internal-placement) INTERNAL=placement ;;  # the placement step (runs mpirun itself)
    --out) COPY_TO=${2:?--out needs a folder}; shift ;;
    --internal-build) INTERNAL=build ;;  # the build step, run by this script under its timeout
    --internal-host) INTERNAL=host ;;    # the host step (a function cannot run under `timeout`)
    -h | --help) sed -n '2,45p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
BUNDLE="" BUNDLE_RUN=""
if [[ -x $ROOT/run && -f $ROOT/payload.tar.xz ]]; then
  BUNDLE=$ROOT BUNDLE_RUN=$ROOT/run
elif [[ -n ${RD_GPU_CHECK_BUILD_DIR:-} ]]; then
  BUNDLE=$(cd "$RD_GPU_CHECK_BUILD_DIR" && pwd) || { echo "gpu_check.sh: RD_GPU_CHECK_BUILD_DIR: no such folder" >&2; exit 2; }
fi
die() { echo "gpu_check.sh: $*" >&2; exit 2; }
JOBS=$(nproc 2>/dev/null || echo 4)
SLOW=${RD_GPU_CHECK_SLOWDOWN:-1}
[[ $SLOW =~ ^[1-9][0-9]*$ ]] || die "RD_GPU_CHECK_SLOWDOWN='$SLOW': expected a positive integer"

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
  # CUDA 13 wheels keep cuBLAS and cudart in nvidia/cu13, CUDA 12 ones in
  # nvidia/cublas and nvidia/cuda_runtime: search both layouts.
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

LAUNCH=${RD_GPU_CHECK_LAUNCHER:-}
[[ -n $LAUNCH ]] && ! command -v "$LAUNCH" >/dev/null && LAUNCH=""
# RESNET_DDP_NO_YAML: bare GPU hosts have no yaml-cpp, and the check reads no config.
COMMON=(-O2 -DNDEBUG -DRESNET_DDP_HAVE_CUDA=1 -DRESNET_DDP_NO_YAML -I"$ROOT/include" -I"$ROOT/src" -I"$ROOT/tests" -I"$ROOT" "${INC[@]}")
CMDS=$OUT/compile_cmds.txt
: > "$CMDS"
OBJS=()
for f in kernels/*.cu; do
  o=$OUT/obj/$(echo "$f" | tr / _).o; OBJS+=("$o")
  echo "$LAUNCH $NVCC -std=c++17 -gencode arch=compute_$ARCH,code=sm_$ARCH --expt-relaxed-constexpr ${COMMON[*]} -c $ROOT/$f -o $o" >> "$CMDS"
done
# The trainer's step and optimizer: gpu_train_bench times the step that trains.
for f in src/core/*.cpp src/backend/contract.cpp src/nn/*.cpp src/backend/cuda/*.cpp src/train/train_step.cpp src/train/optimizer.cpp; do
  [[ "$f" == *nccl_comm* ]] && continue  # needs MPI, which bare GPU hosts lack
  o=$OUT/obj/$(echo "$f" | tr / _).o; OBJS+=("$o")
  echo "$LAUNCH $CXX -std=c++20 -fPIC ${COMMON[*]} -c $ROOT/$f -o $o" >> "$CMDS"
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
  echo "$LAUNCH $CXX -std=c++20 ${COMMON[*]} $CATCH_FLAG -c $ROOT/tests/gpu/test_cuda_backend.cpp -o $OUT/obj/test.o" >> "$CMDS"
  echo "$LAUNCH $CXX -std=c++20 $CATCH_FLAG -c $ROOT/tests/common/catch_main.cpp -o $OUT/obj/catch_main.o" >> "$CMDS"
else
  # A failure, not a skip: without the op tests the run proves little.
  die "Catch2 header not found (RD_CATCH2_INCLUDE, .gpu_deps/include, /usr/include): carry .gpu_deps (docs/cuda.md)"
fi
echo "$LAUNCH $CXX -std=c++20 ${COMMON[*]} -c $ROOT/bench/gpu_train_bench.cpp -o $OUT/obj/bench.o" >> "$CMDS"
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

# ---- the host step (its own process, under its timeout): what the results ran on ----
# Never fails: a missing tool is reported as such (no GPU here is an answer too).
if [[ $INTERNAL == host ]]; then
  find_python
  echo "date:     $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host:     $(hostname 2>/dev/null) $(uname -srm)"
  echo "cpus:     $(nproc 2>/dev/null), memory $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo 2>/dev/null)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap --format=csv 2>&1 | head -9
    nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -1 | sed 's/^/driver supports /'
  else
    echo "nvidia-smi: not found (no NVIDIA driver: no device)"
  fi
  NVCC=$(command -v nvcc || true)
  [[ -z $NVCC && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
  if [[ -n $NVCC ]]; then
    echo "nvcc:     $NVCC, $("$NVCC" --version | grep -o 'release [0-9.]*, V[0-9.]*')"
  else
    echo "nvcc:     not found"
  fi
  # Header versions of cuDNN and NCCL: the toolkit's, then PyTorch's wheels.
  DIRS=()
  [[ -n $NVCC ]] && DIRS+=("$(cd "$(dirname "$NVCC")/.." && pwd)/include")
  DIRS+=(/usr/local/cuda/include /usr/include)
  if [[ -n "$PY" ]]; then
    NV=$("$PY" -c 'import nvidia,os;print(os.path.dirname(list(nvidia.__path__)[0]+"/x"))' 2>/dev/null || true)
    if [[ -n $NV ]]; then for d in "$NV"/*/include; do DIRS+=("$d"); done; fi
  fi
  hdr_version() {  # hdr_version FILE PREFIX -> "9.19.0 (DIR/FILE)"
    local d f
    for d in "${DIRS[@]}"; do
      f=$d/$1
      [[ -f $f ]] || continue
      awk -v p="$2" '$1 == "#define" && ($2 == p "MAJOR" || $2 == p "MINOR" || $2 == p "PATCHLEVEL" || $2 == p "PATCH") { v[$2] = $3 }
        END { printf "%s.%s.%s", v[p "MAJOR"], v[p "MINOR"], (p "PATCHLEVEL" in v) ? v[p "PATCHLEVEL"] : v[p "PATCH"] }' "$f"
      echo " ($f)"
      return 0
    done
    echo "not found"
  }
  echo "cuDNN:    $(hdr_version cudnn_version.h CUDNN_)"
  echo "NCCL:     $(hdr_version nccl.h NCCL_)"
  SAN=$(command -v compute-sanitizer || true)
  [[ -z $SAN && -x /usr/local/cuda/bin/compute-sanitizer ]] && SAN=/usr/local/cuda/bin/compute-sanitizer
  if [[ -n $SAN ]]; then
    echo "compute-sanitizer: $SAN, $("$SAN" --version 2>/dev/null | grep -io 'version [0-9.]*' | head -1)"
  else
    echo "compute-sanitizer: not found"
  fi
  if [[ -n "$PY" ]]; then
    echo "python with torch: $PY"
    "$PY" - <<'PYEOF' 2>&1 || true
import torch
def get(f):
    try:
        return f()
    except Exception as e:
        return f"? ({type(e).__name__})"
avail = get(torch.cuda.is_available)
print("torch", torch.__version__, "| cuda", torch.version.cuda, "| cudnn", get(torch.backends.cudnn.version),
      "| nccl", get(torch.cuda.nccl.version), "| device", get(torch.cuda.get_device_name) if avail is True else "none")
PYEOF
  else
    echo "python with torch: none (the PyTorch comparison is skipped)"
  fi
  if [[ -n $BUNDLE_RUN && -f $ROOT/MANIFEST.txt ]]; then sed -n '1,4p' "$ROOT/MANIFEST.txt"; fi
  exit 0
fi

# ---- GPU ranks' CPU placement ------------------------------------------------------------------
# The binding that gives each rank its own cores near its GPU, as the job scripts choose it
# (jobs/common.sh rd_mpirun_gpu_binding): R ranks per socket with K cores each where the
# ranks split evenly over the sockets and get >= 2 cores each; else no binding at all.
corrected_binding() {  # corrected_binding NP
  local np=$1 sockets cores
  sockets=$(lscpu -p=SOCKET 2>/dev/null | grep -v '^#' | sort -u | wc -l)
  cores=$(lscpu -p=CORE,SOCKET 2>/dev/null | grep -v '^#' | sort -u | wc -l)
  ((sockets >= 1)) || sockets=1
  ((cores >= 1)) || cores=$(nproc)
  if ((np % sockets == 0 && cores / np >= 2)); then
    echo "--map-by ppr:$((np / sockets)):socket:PE=$((cores / np)) --bind-to core"
  else
    echo "--bind-to none"
  fi
}
find_nsys() {
  local c
  for c in "$(command -v nsys || true)" /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys; do
    [[ -n $c && -x $c ]] && { echo "$c"; return 0; }
  done
  return 0
}
# The placement step (its own process, under its timeout): what each rank may use.
if [[ $INTERNAL == placement ]]; then
  RUNW=${RD_GPU_CHECK_RUN:?the run wrapper} NP=${RD_GPU_CHECK_NP:-1}
  echo "nproc: $(nproc)"
  lscpu 2>/dev/null | grep -E '^(Model name|Socket\(s\)|Core\(s\) per socket|Thread\(s\) per core|NUMA node)' || true
  echo "== nvidia-smi topo -m"
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi topo -m 2>&1; else echo "nvidia-smi: not found"; fi
  echo "== nsys: $(find_nsys | grep . || echo 'not found')"
  for binding in "" "$(corrected_binding "$NP")"; do
    read -r -a B <<<"$binding"
    label=${binding:-"(the default binding)"}
    echo "== mpirun -np $NP $label: each rank's allowed CPUs"
    "$RUNW" mpirun -np "$NP" ${B[@]+"${B[@]}"} sh -c 'echo "rank ${OMPI_COMM_WORLD_RANK:-?}: $(grep Cpus_allowed_list /proc/self/status)"' 2>&1
  done
  echo "== resnet_ddp train --check under the corrected binding (each rank's cores and GPU)"
  read -r -a B <<<"$(corrected_binding "$NP")"
  "$RUNW" mpirun -np "$NP" "${B[@]}" resnet_ddp train --check --device cuda --data "${RD_GPU_CHECK_DATA:-.}" 2>&1 |
    grep -E '^check: (placement|device)|warning' || true
  exit 0
fi

# ---- the plan: name, timeout (s), device or not, what it runs ---------------------------------
# Timeouts are upper bounds for a hang; a step that needs a GPU is marked "device".
PLAN_STANDALONE=(
  "host          10  -       driver, nvcc, cuDNN, NCCL, torch versions"
  "build        140  -       nvcc + g++ -j$JOBS for this GPU's arch (op tests, gpu_train_bench)"
  "op_tests     100  device  every op vs the float64 reference, fp32/tf32/fp16/bf16 x NHWC/NCHW"
  "bench_fp32    30  device  ours: ResNet-34 @244 b16 NHWC training step"
  "bench_tf32    30  device  ours, tf32"
  "bench_fp16    30  device  ours, fp16 (loss scaling)"
  "bench_bf16    30  device  ours, bf16"
  "bench_torch   75  device  PyTorch, same model/batch, channels-last, 4 precisions"
  "memcheck      60  device  compute-sanitizer memcheck: 1 step resnet_tiny @64 b4 fp16 MLP head"
  "summary        5  -       the table"
)
PLAN_BUNDLE=(
  "host          10  -       driver, nvcc, cuDNN, NCCL, torch versions"
  "bundle_env    15  -       run --env: the host's CUDA libraries"
  "op_tests      90  device  every op vs the float64 reference, all precisions"
  "nccl_np1      40  device  mpirun -np 1 nccl_collective_test (-np 2 needs 2 GPUs)"
  "mpi_coll      25  -       mpirun -np 2 collective_test (host memory)"
  "msg_passing   30  device  mpirun message_passing --device cuda"
  "synth         20  -       resnet_ddp synth: a tiny image folder"
  "train_fp32    50  device  resnet_ddp --device cuda, 20 steps, default MLP head"
  "train_fp16    35  device  the same in fp16"
  "bench_fp32    25  device  ours: ResNet-34 @244 b16 NHWC training step"
  "bench_tf32    25  device  ours, tf32"
  "bench_fp16    25  device  ours, fp16"
  "bench_bf16    25  device  ours, bf16"
  "bench_torch   70  device  PyTorch, 4 precisions"
  "memcheck      45  device  compute-sanitizer memcheck: 1 step resnet_tiny @64 b4 fp16"
  "summary        5  -       the table"
)
# --e2e: the trainer end to end, within 8 minutes (a bundle's programs, nothing built).
PLAN_E2E=(
  "host          10  -       driver, nvcc, cuDNN, NCCL, torch versions"
  "bundle_env    15  -       run --env: the host's CUDA libraries"
  "synth         30  -       resnet_ddp synth: 2,000 JPEGs 256x256 per rank, 64 for validation"
  "placement     20  -       each rank's allowed CPUs (default and corrected binding), nvidia-smi topo -m, nsys"
  "fp32_default  45  device  resnet_ddp 120 steps R34 @244 b16 fp32, mpirun's default binding, --workers 15"
  "fp32_placed   40  device  the same, each rank on its own cores, default --workers"
  "fp16_eager    40  device  fp16, each rank on its own cores, --cuda-graphs off (every kernel launched by the host)"
  "fp16_placed   35  device  fp16, each rank on its own cores"
  "nsys          50  device  30 steps fp16 (placed) under nsys profile --stats=true, if nsys exists"
  "conv_nhwc     25  device  gpu_train_bench R34 fp32 NHWC, RD_CONV_REPORT=1"
  "conv_nchw     25  device  the same, NCHW"
  "torch_fp32    50  device  PyTorch DDP recipe, 120 steps fp32, same data"
  "torch_fp16    45  device  the same, AMP fp16"
  "summary        5  -       step 1 and the median of steps 20-120 per run"
)
E2E_LIMIT=470  # 8 minutes, less the kill-after and the archive

# The device call's limit (timeout_s). The run's hard deadline leaves 30 s of it for
# the shell to exit; kill-after (5 s per step) and the archive rewrites come out of
# the deadline, not on top of it.
CALL_LIMIT=570
DEADLINE_S=${RD_GPU_CHECK_DEADLINE_S:-$((540 * SLOW))}
[[ $DEADLINE_S =~ ^[1-9][0-9]*$ ]] || die "RD_GPU_CHECK_DEADLINE_S='$DEADLINE_S': expected a positive integer"
BUDGET_LIMIT=540  # the timeouts of a plan must add up to less than the deadline
plan_sum() { local sum=0 line; for line in "$@"; do read -r _ t _ <<<"$line"; sum=$((sum + t)); done; echo "$sum"; }
timeout_of() { local line n t; for line in "${PLAN[@]}"; do read -r n t _ <<<"$line"; [[ $n == "$1" ]] && { echo $((t * SLOW)); return; }; done; echo $((30 * SLOW)); }
needs_device() { local line n d; for line in "${PLAN[@]}"; do read -r n _ d _ <<<"$line"; [[ $n == "$1" ]] && { [[ $d == device ]]; return; }; done; return 1; }
print_plan() {
  local title=$1; shift
  local line n t d what sum=0
  printf '%s\n' "$title"
  for line in "$@"; do
    read -r n t d what <<<"$line"
    sum=$((sum + t))
    [[ $d == - ]] && d=""
    printf '  %-12s %4ss  (by %4ss)  %-6s  %s\n' "$n" "$t" "$sum" "$d" "$what"
  done
  printf '  %-12s %4ss = %d min %02d s of timeouts (limit %ss)\n' "total" "$sum" $((sum / 60)) $((sum % 60)) "$BUDGET_LIMIT"
}
for plan in standalone bundle; do
  declare -n P="PLAN_${plan^^}"
  (($(plan_sum "${P[@]}") < BUDGET_LIMIT)) || die "the $plan plan's timeouts exceed ${BUDGET_LIMIT}s: fix the plan"
done
(($(plan_sum "${PLAN_E2E[@]}") < E2E_LIMIT)) || die "the e2e plan's timeouts exceed ${E2E_LIMIT}s: fix the plan"
if ((E2E)); then
  PLAN=("${PLAN_E2E[@]}") MODE=e2e
  [[ -n ${RD_GPU_CHECK_DEADLINE_S:-} ]] || DEADLINE_S=$((E2E_LIMIT * SLOW))
  ((DRY)) || [[ -n $BUNDLE ]] ||
    die "--e2e runs resnet_ddp under mpirun: use a bundle (tools/gpu_bundle.sh) or RD_GPU_CHECK_BUILD_DIR=BUILD"
elif [[ -n $BUNDLE ]]; then PLAN=("${PLAN_BUNDLE[@]}"); MODE=bundle; else PLAN=("${PLAN_STANDALONE[@]}"); MODE=standalone; fi

# The one command to run on the GPU host (docs/cuda.md), from the checkout's root, and
# the git-ignored folder that must be there with the tree. MODE_FLAG: "" or " --e2e".
device_call() {
  local flag=${1:-}
  if [[ -n $flag && -z $BUNDLE_RUN ]]; then  # --e2e runs a bundle's programs
    echo "bundle/gpu/tools/gpu_check.sh$flag --out OUT_DIR   (needs: bundle/gpu from tools/gpu_bundle.sh; allow ${CALL_LIMIT} s)"
  elif [[ -n $BUNDLE_RUN ]]; then
    local top rel
    top=$(git -C "$ROOT" rev-parse --show-toplevel 2>/dev/null || true)
    rel=${ROOT#"$top"/}
    [[ -n $top && $rel != "$ROOT" ]] || rel=bundle/gpu
    echo "$rel/tools/gpu_check.sh$flag --out OUT_DIR   (needs: $rel; allow ${CALL_LIMIT} s)"
  else
    echo "tools/gpu_check.sh$flag --out OUT_DIR   (needs: .gpu_deps; allow ${CALL_LIMIT} s)"
  fi
}

if ((DRY)); then
  echo "gpu_check.sh --dry-run: nothing is run. This copy would use the $MODE plan."
  print_plan "standalone plan (repository sources built on the GPU host):" "${PLAN_STANDALONE[@]}"
  print_plan "bundle plan (bundle/gpu made by tools/gpu_bundle.sh, nothing built):" "${PLAN_BUNDLE[@]}"
  BUDGET_LIMIT=$E2E_LIMIT print_plan "e2e plan (--e2e, a bundle's programs: the trainer end to end):" "${PLAN_E2E[@]}"
  echo "hard deadline: each step's timeout is capped so that the run ends ${DEADLINE_S}s after it starts"
  echo "  (kill-after and the archive included); the call's limit is ${CALL_LIMIT}s"
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
  echo "on the GPU host (docs/cuda.md), one command: $(device_call)"
  echo "the trainer end to end (ends ${E2E_LIMIT}s after it starts, within 8 min): $(device_call " --e2e")"
  echo "  it writes OUT_DIR/gpu_check.tar.gz (summary.txt, progress.txt, every step's log): keep that file"
  exit 0
fi

# ---- the run --------------------------------------------------------------------------------
mkdir -p "$OUT"
LOG=$OUT/steps
rm -rf "$LOG" "$OUT/summary.txt" "$OUT/progress.txt" "$OUT/bench.jsonl"
mkdir -p "$LOG"
T0=$(date +%s)
DEADLINE=$((T0 + DEADLINE_S))
RESERVE=$((15 * SLOW))  # after a step's timeout: kill-after (5 s), the archive, the summary
declare -A RC SECS STATUS
ORDER=()
TARBALL=""
if [[ -n $COPY_TO ]]; then
  mkdir -p "$COPY_TO" || die "--out $COPY_TO: cannot create it"
  TARBALL=$(cd "$COPY_TO" && pwd)/gpu_check.tar.gz
fi
# One archive of everything so far, replaced whole (a reader never sees half of one).
archive() {
  [[ -n $TARBALL ]] || return 0
  local items=() f
  for f in summary.txt progress.txt bench.jsonl build.log compile_cmds.txt steps; do
    [[ -e $OUT/$f ]] && items+=("$f")
  done
  tar -czf "$TARBALL.partial" -C "$OUT" "${items[@]}" 2>/dev/null && mv -f "$TARBALL.partial" "$TARBALL"
}
status_of() {
  case $1 in 0) echo ok ;; 77) echo "no device" ;; 78) echo "not present" ;; 124 | 137) echo TIMEOUT ;; 125) echo "no time" ;; *) echo FAILED ;; esac
}
record() {  # record NAME EXIT SECONDS
  RC[$1]=$2 SECS[$1]=$3 STATUS[$1]=$(status_of "$2")
  ORDER+=("$1")
  printf '%-12s %5s %7s  %s\n' "$1" "$2" "$3" "${STATUS[$1]}" >> "$OUT/progress.txt"
  echo "-- $1: ${STATUS[$1]} (exit $2 in $3s)"
  archive
}
# step NAME CMD...: runs CMD under NAME's timeout from the plan (capped by the deadline),
# output to the terminal and $LOG/NAME.log; records its exit status (124: timed out) and
# duration. A step that needs a device is not run without one (exit 77, "no device").
step() {
  local name=$1 limit rc t left
  shift
  limit=$(timeout_of "$name")
  left=$((DEADLINE - $(date +%s) - RESERVE))
  ((limit > left)) && limit=$left
  printf '\n== %s (timeout %ss, t=%ss)\n' "$name" "$limit" "$(( $(date +%s) - T0 ))"
  if needs_device "$name" && ((!HAVE_DEVICE)); then
    echo "no device: not run" | tee "$LOG/$name.log"
    record "$name" 77 0
    return 0
  fi
  if ((limit < 3)); then
    echo "no time left before the deadline: not run" | tee "$LOG/$name.log"
    record "$name" 125 0
    return 0
  fi
  t=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$LOG/$name.log"
  rc=${PIPESTATUS[0]}
  record "$name" "$rc" $(( $(date +%s) - t ))
  return 0
}

find_python
# A device: nvidia-smi lists one, or PyTorch sees one (a host without nvidia-smi).
# RD_GPU_CHECK_DEVICE=0 forces "none" (tests).
HAVE_DEVICE=0
if [[ ${RD_GPU_CHECK_DEVICE:-} == 0 ]]; then
  HAVE_DEVICE=0
elif nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  HAVE_DEVICE=1
elif [[ -n "$PY" ]] && timeout 60 "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.device_count() > 0 else 1)' 2>/dev/null; then
  HAVE_DEVICE=1
fi
((HAVE_DEVICE)) || echo "gpu_check.sh: no CUDA device visible: the steps that need one report \"no device\""
step host "$SELF" --internal-host

if [[ -n $BUNDLE_RUN ]]; then
  RUN=("$BUNDLE_RUN")
elif [[ -n $BUNDLE ]]; then
  # A CMake build folder standing in for a bundle (the plan's test): its programs on
  # PATH, the system's Open MPI.
  FAKE_RUN=$OUT/run_from_build
  {
    echo '#!/usr/bin/env bash'
    echo "export PATH=\"$BUNDLE:$BUNDLE/tests/gpu:$BUNDLE/bench:$BUNDLE/tests/collective:\$PATH\""
    echo 'export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1'
    echo 'if [[ ${1:-} == --env ]]; then'
    echo "  echo \"build folder standing in for a bundle: $BUNDLE\""
    echo "  ldd \"$BUNDLE/resnet_ddp\" | grep -E 'cudart|cudnn|cublas|nccl' || echo 'resnet_ddp links no CUDA library'"
    echo '  exit 0'
    echo 'fi'
    echo 'exec "$@"'
  } > "$FAKE_RUN"
  chmod +x "$FAKE_RUN"
  RUN=("$FAKE_RUN")
fi
if [[ -n $BUNDLE ]]; then
  step bundle_env "${RUN[@]}" --env
  TEST_CMD=("${RUN[@]}" test_gpu_cuda_backend)
  BENCH_CMD=("${RUN[@]}" gpu_train_bench)
  TORCH_BENCH=$ROOT/tools/torch_gpu_bench.py
  [[ -f $TORCH_BENCH ]] || TORCH_BENCH=$ROOT/bench/torch_gpu_bench.py
else
  step build "$SELF" --internal-build
  TEST_CMD=("$OUT/test_cuda_backend")
  BENCH_CMD=("$OUT/gpu_train_bench")
  TORCH_BENCH=$ROOT/bench/torch_gpu_bench.py
  BUILT_LD_DIRS=$(cat "$OUT/ld_dirs" 2>/dev/null)
  export LD_LIBRARY_PATH="$OUT/lib:${BUILT_LD_DIRS}${LD_LIBRARY_PATH:-}"
fi

if ((E2E)); then
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/rd_gpu_check.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  ((GPUS > 0)) || GPUS=1
  NP=$((GPUS < 4 ? GPUS : 4))
  DATA=$WORK/data
  step synth "${RUN[@]}" resnet_ddp synth --out "$DATA" --train $((2000 * NP)) --val 64 --size 256x256 --format jpg
  export RD_GPU_CHECK_RUN=${RUN[0]} RD_GPU_CHECK_NP=$NP RD_GPU_CHECK_DATA=$DATA
  step placement "$SELF" --internal-placement
  read -r -a PLACED <<<"$(corrected_binding "$NP")"
  TRAIN=(resnet_ddp --device cuda --data "$DATA" --arch resnet34 --image-size 244 --batch-size 16 --epochs 1
    --log-every 1 --progress lines --resume none)
  # keep_run NAME: the run's metrics.csv and TensorBoard file go into the archive (not its checkpoints).
  keep_run() {
    mkdir -p "$LOG/$1"
    cp "$WORK/$1"/metrics.csv "$WORK/$1"/events.out.tfevents.* "$LOG/$1/" 2>/dev/null || true
    archive
  }
  # mpirun's default binding (one core for <= 2 ranks) with 15 loader threads: a bare `mpirun -np 1`.
  step fp32_default "${RUN[@]}" mpirun -np "$NP" "${TRAIN[@]}" --max-steps 120 --precision fp32 --workers 15 \
    --output-dir "$WORK/fp32_default"
  keep_run fp32_default
  # fp16, where launches weigh most: the step with and without CUDA graphs.
  step fp16_eager "${RUN[@]}" mpirun -np "$NP" "${PLACED[@]}" "${TRAIN[@]}" --max-steps 120 --precision fp16 \
    --cuda-graphs off --output-dir "$WORK/fp16_eager"
  keep_run fp16_eager
  for prec in fp32 fp16; do
    step "${prec}_placed" "${RUN[@]}" mpirun -np "$NP" "${PLACED[@]}" "${TRAIN[@]}" --max-steps 120 --precision "$prec" \
      --output-dir "$WORK/${prec}_placed"
    keep_run "${prec}_placed"
  done
  NSYS=$(find_nsys)
  if [[ -n $NSYS ]] || ((!HAVE_DEVICE)); then
    step nsys "${RUN[@]}" mpirun -np "$NP" "${PLACED[@]}" "${NSYS:-nsys}" profile --stats=true --force-overwrite=true \
      -o "$WORK/nsys_rank%q{OMPI_COMM_WORLD_RANK}" "${TRAIN[@]}" --max-steps 30 --precision fp16 \
      --tensorboard off --output-dir "$WORK/nsys"
  else
    echo "nsys: not found: not run" | tee "$LOG/nsys.log"
    record nsys 78 0
  fi
  RES=$OUT/bench.jsonl
  : > "$RES"
  for layout in nhwc nchw; do
    step "conv_$layout" env RD_CONV_REPORT=1 "${BENCH_CMD[@]}" --arch resnet34 --size 244 --batch 16 \
      --precision fp32 --layout "$layout" --steps "$STEPS" --warmup "$WARMUP"
    grep '^{' "$LOG/conv_$layout.log" >> "$RES"
  done
  RECIPE=""
  for f in "$ROOT/bench/pytorch_gpu_ddp_recipe.py" "$ROOT/tools/pytorch_gpu_ddp_recipe.py"; do
    [[ -f $f ]] && RECIPE=$f && break
  done
  for prec in fp32 fp16; do
    if ((HAVE_DEVICE)) && [[ -z $RECIPE || -z $PY ]]; then
      echo "PyTorch DDP recipe: ${RECIPE:-bench/pytorch_gpu_ddp_recipe.py not in this copy}; python with torch: ${PY:-none}: not run" |
        tee "$LOG/torch_$prec.log"
      record "torch_$prec" 78 0
      continue
    fi
    step "torch_$prec" "${PY:-python3}" "$RECIPE" --device cuda --data "$DATA" --arch resnet34 --image-size 244 --batch-size 16 \
      --epochs 1 --max-steps 120 --precision "$prec" --launch "$NP"
  done
else
# Catch2's console summary: "All tests passed (A assertions in N test cases)" or
# "test cases: N | P passed | F failed".
step op_tests "${TEST_CMD[@]}"

if [[ -n $BUNDLE ]]; then
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/rd_gpu_check.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  ((GPUS > 0)) || GPUS=1
  NP=$((GPUS < 4 ? GPUS : 4))
  step nccl_np1 "${RUN[@]}" mpirun -np 1 nccl_collective_test
  step mpi_coll "${RUN[@]}" mpirun -np 2 --oversubscribe collective_test
  # Each rank on its own cores near its GPU (mpirun's default gives <= 2 ranks one core each).
  read -r -a PLACED <<<"$(corrected_binding "$NP")"
  step msg_passing "${RUN[@]}" mpirun -np "$NP" "${PLACED[@]}" message_passing --device cuda --verbose
  step synth "${RUN[@]}" resnet_ddp synth --out "$WORK/synth"
  step train_fp32 "${RUN[@]}" mpirun -np "$NP" "${PLACED[@]}" resnet_ddp --device cuda --data "$WORK/synth" --epochs 1 \
    --max-steps 20 --progress lines --log-every 5 --resume none --output-dir "$WORK/out_fp32"
  step train_fp16 "${RUN[@]}" mpirun -np "$NP" "${PLACED[@]}" resnet_ddp --device cuda --data "$WORK/synth" --epochs 1 \
    --max-steps 20 --precision fp16 --progress lines --log-every 5 --resume none \
    --output-dir "$WORK/out_fp16"
fi

RES=$OUT/bench.jsonl
: > "$RES"
for prec in fp32 tf32 fp16 bf16; do
  step "bench_$prec" "${BENCH_CMD[@]}" --arch resnet34 --size 244 --batch 16 --precision "$prec" \
    --layout nhwc --steps "$STEPS" --warmup "$WARMUP"
  grep '^{' "$LOG/bench_$prec.log" >> "$RES"
done
if [[ -n "$PY" ]]; then
  step bench_torch "$PY" "$TORCH_BENCH" --arch resnet34 --size 244 --batch 16 --channels-last \
    --steps "$STEPS" --warmup "$WARMUP"
  grep '^{' "$LOG/bench_torch.log" >> "$RES"
fi

SANITIZER=$(command -v compute-sanitizer || true)
[[ -z $SANITIZER && -n ${CUDA_HOME:-} && -x $CUDA_HOME/bin/compute-sanitizer ]] && SANITIZER=$CUDA_HOME/bin/compute-sanitizer
[[ -z $SANITIZER && -x /usr/local/cuda/bin/compute-sanitizer ]] && SANITIZER=/usr/local/cuda/bin/compute-sanitizer
if [[ -n $SANITIZER ]] || ((!HAVE_DEVICE)); then
  # cuDNN's heuristics instead of cudnnFind, which would run every algorithm, each one
  # instrumented (minutes); cuDNN's and cuBLAS's kernels are left unchecked where the
  # sanitizer can filter them (none of our kernels' names contains these words, in
  # either case: whether the filter ignores case is not documented).
  SAN_ARGS=(--tool memcheck --print-limit 20 --error-exitcode 3)
  if [[ -n $SANITIZER ]] && "$SANITIZER" --help 2>/dev/null | grep -q -- '--kernel-name-exclude'; then
    SAN_ARGS+=(--kernel-name-exclude "kns=cudnn,kns=cublas,kns=xmma,kns=cutlass,kns=gemm,kns=fft,kns=winograd,kns=sm90,kns=sm80,kns=sm86,kns=sm75,kns=ampere,kns=turing,kns=implicit_convolve")
  fi
  step memcheck env RD_CUDNN_HEURISTICS=1 "${SANITIZER:-compute-sanitizer}" "${SAN_ARGS[@]}" "${BENCH_CMD[@]}" \
    --arch resnet_tiny --size 64 --batch 4 --steps 1 --warmup 0 --precision fp16
else
  echo "compute-sanitizer not found: memcheck not run" | tee "$LOG/memcheck.log"
  record memcheck 127 0
fi

fi

# --e2e: per trainer run, step 1 apart from the median of steps 20-120 (TensorBoard's
# step/time_ms and step/data_ms, rank 0, --log-every 1), and the images per second of
# that median; gpu_train_bench's NHWC vs NCHW; PyTorch's last lines.
e2e_summary() {
  local f
  "${PY:-python3}" - "$LOG" "$ROOT/bench" <<'PYEOF'
import glob, os, statistics, sys

sys.path.insert(0, sys.argv[2])
from e2e_side_by_side import event_scalars  # {step: {tag: value}}

def scalars(path):  # {tag: {step: value}}
    out = {}
    for step, values in event_scalars(path).items():
        for tag, val in values.items():
            out.setdefault(tag, {})[step] = val
    return out

log = sys.argv[1]
runs = sys.argv[3:] or ["fp32_default", "fp32_placed", "fp16_eager", "fp16_placed"]
print("resnet_ddp --device cuda, 120 steps (rank 0's step times, TensorBoard step/time_ms)")
print(f"{'run':14} {'step 1 ms':>10} {'median 20-120 ms':>17} {'img/s/rank':>11} {'data ms':>8}")
for run in runs:
    files = sorted(glob.glob(os.path.join(log, run, "events.out.tfevents.*")))
    sc = scalars(files[-1]) if files else {}
    t, d = sc.get("step/time_ms", {}), sc.get("step/data_ms", {})
    steps = sorted(t)
    if not steps:
        print(f"{run:14} {'-':>10} {'(no step times)':>17}")
        continue
    steady = steps[19:120]
    med = statistics.median(t[s] for s in steady) if steady else float("nan")
    dmed = statistics.median(d.get(s, 0.0) for s in steady) if steady else float("nan")
    batch = float(os.environ.get("RD_E2E_BATCH", "16"))
    ips = batch * 1e3 / med if steady and med > 0 else float("nan")
    print(f"{run:14} {t[steps[0]]:10.1f} {med:17.2f} {ips:11.1f} {dmed:8.2f}"
          + ("" if len(steps) >= 120 else f"  ({len(steps)} steps)"))
PYEOF
  for f in conv_nhwc conv_nchw; do
    echo "$f (${STATUS[$f]:-?}): $(grep -h '^{' "$LOG/$f.log" 2>/dev/null | grep -o '"img_per_s": [0-9.]*' | head -1)"
  done
  for f in torch_fp32 torch_fp16; do
    echo "$f (${STATUS[$f]:-?}): $(grep -v '^[[:space:]]*$' "$LOG/$f.log" 2>/dev/null | tail -2 | paste -sd '|' -)"
  done
}
summary() {
  local name
  echo "step          exit  seconds  result"
  for name in "${ORDER[@]}"; do
    printf '%-12s %5s  %7s  %s\n' "$name" "${RC[$name]}" "${SECS[$name]}" "${STATUS[$name]}"
  done
  echo
  if [[ $MODE == e2e ]]; then
    e2e_summary
    return 0
  fi
  echo "op tests: $(grep -E 'test cases' "$LOG/op_tests.log" 2>/dev/null | tail -2 | tr -s ' ' | paste -sd ';' -) (${STATUS[op_tests]:-?})"
  echo "memcheck: $(grep -E 'ERROR SUMMARY' "$LOG/memcheck.log" 2>/dev/null | tail -1 || true) (${STATUS[memcheck]:-?})"
  echo
  if [[ ! -s $RES ]]; then
    echo "no benchmark results"
    return 0
  fi
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
printf '\n== summary (t=%ss, %s plan)\n' "$(( $(date +%s) - T0 ))" "$MODE"
t=$(date +%s)
summary | tee "$OUT/summary.txt"
record summary 0 $(( $(date +%s) - t ))
VERDICT=0
for name in "${ORDER[@]}"; do
  case ${RC[$name]} in
    0 | 78) ;;
    77) VERDICT=77 ;;
    *) echo "first failing step: $name (${STATUS[$name]}, exit ${RC[$name]})"; VERDICT=1; break ;;
  esac
done
((VERDICT == 77)) && echo "every step that ran passed; the steps that need a GPU: no device"
[[ -n $TARBALL ]] && echo "results: $TARBALL ($(du -k "$TARBALL" | cut -f1) KiB)"
echo "finished at t=$(( $(date +%s) - T0 ))s (deadline ${DEADLINE_S}s)"
exit "$VERDICT"
