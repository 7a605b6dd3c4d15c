#!/usr/bin/env bash
# One-call GPU check for a bare GPU host (CUDA toolkit + PyTorch + Python, no
# MPI/oneDNN/HDF5/Catch2/CMake needed, no package access). From the repository
# root:   tools/gpu_check.sh [--quick]
#
#  1. finds nvcc, cuDNN and cuBLAS (the toolkit's, else PyTorch's nvidia-* wheels)
#  2. builds, for this GPU's architecture only, with nvcc + g++ in parallel:
#     src/core, src/nn, src/backend/cuda (not NcclComm: it needs MPI), kernels/,
#     tests/gpu/test_cuda_backend.cpp (against Debian's Catch2 header, when found) and
#     tests/gpu/gpu_train_bench.cpp            -> build-gpu-check/
#  3. runs the GPU op tests (every op vs the float64 reference, all precisions)
#  4. benchmarks the training step (ResNet-34 @244 batch 16, fp32/tf32/fp16/bf16,
#     NHWC) against PyTorch on the same GPU, and prints a table.
# Everything is printed; the exit status is the op tests'. --quick: fewer steps.
#
# Run from a bundle made by tools/gpu_bundle.sh (BUNDLE/tools/gpu_check.sh), nothing is
# built: step 2 becomes `BUNDLE/run --env` (finds the host's CUDA libraries), step 3 runs
# the bundled Catch2 op tests, and before the benchmark it also runs the NCCL collective
# tests (mpirun -np 1, and -np 2 when there are 2+ GPUs: NCCL does not support two ranks
# of one communicator on the same GPU), the MPI collective tests, message_passing over
# NCCL, and a short `resnet_ddp --device cuda` training run on `resnet_ddp synth` data
# (fp32 recipe, then fp16 and bf16). The exit status is then the first failure's.
# Environment: RD_GPU_ARCH=90 overrides the detected architecture,
#              RD_GPU_PYTHON picks the Python that has torch.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
OUT=$ROOT/build-gpu-check
STEPS=20 WARMUP=5
[[ "${1:-}" == "--quick" ]] && STEPS=8 WARMUP=3
JOBS=$(nproc 2>/dev/null || echo 4)
T0=$(date +%s)
BUNDLE=""
[[ -x $ROOT/run && -f $ROOT/payload.tar.xz ]] && BUNDLE=$ROOT
say() { printf '\n== %s (t=%ss)\n' "$*" "$(( $(date +%s) - T0 ))"; }
die() { echo "gpu_check.sh: $*" >&2; exit 2; }

say "host"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 | head -3
PY=${RD_GPU_PYTHON:-}
if [[ -z "$PY" ]]; then
  for p in python3 python /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c "import torch" 2>/dev/null; then PY=$p; break; fi
  done
fi
[[ -n "$PY" ]] && echo "python with torch: $PY ($("$PY" -c 'import torch;print(torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())'))"

if [[ -n $BUNDLE ]]; then
  say "bundle $BUNDLE"
  head -3 "$BUNDLE/MANIFEST.txt"
  "$BUNDLE/run" --env || die "the bundle cannot run here (see above)"
  TEST_CMD=("$BUNDLE/run" test_gpu_cuda_backend --durations yes)
  BENCH_CMD=("$BUNDLE/run" gpu_train_bench)
  TORCH_BENCH=$BUNDLE/tools/torch_gpu_bench.py
  mkdir -p "$OUT"
else  # standalone: build from the repository's sources (this block is unchanged)
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
  for sub in cudnn cublas cuda_runtime nccl; do
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
export LD_LIBRARY_PATH="$OUT/lib:${LD_DIRS}${LD_LIBRARY_PATH:-}"

say "build"
COMMON=(-O2 -DNDEBUG -DRESNET_DDP_HAVE_CUDA=1 -I"$ROOT/include" -I"$ROOT/src" -I"$ROOT/kernels" -I"$ROOT/tests" "${INC[@]}")
CMDS=$OUT/compile_cmds.txt
: > "$CMDS"
OBJS=()
for f in kernels/*.cu; do
  o=$OUT/obj/$(echo "$f" | tr / _).o; OBJS+=("$o")
  echo "$NVCC -std=c++17 -gencode arch=compute_$ARCH,code=sm_$ARCH --expt-relaxed-constexpr ${COMMON[*]} -c $ROOT/$f -o $o" >> "$CMDS"
done
for f in src/core/*.cpp src/nn/*.cpp src/backend/cuda/*.cpp; do
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
  echo "gpu_check: Catch2 header not found (RD_CATCH2_INCLUDE, .gpu_deps/include, /usr/include): GPU op tests not built" >&2
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
TEST_CMD=()
[ -n "$CATCH_INC" ] && TEST_CMD=("$OUT/test_cuda_backend")
BENCH_CMD=("$OUT/gpu_train_bench")
TORCH_BENCH=$ROOT/tests/gpu/torch_gpu_bench.py
fi

say "GPU op tests (tests/gpu/test_cuda_backend.cpp)"
if [ ${#TEST_CMD[@]} -gt 0 ]; then
  timeout 300 "${TEST_CMD[@]}"
  TEST_RC=$?
else
  echo "not built: no Catch2 header on this host (see the note above)"
  TEST_RC=77
fi
echo "op tests exit status: $TEST_RC"

EXTRA_RC=0
if [[ -n $BUNDLE ]]; then
  # step SECONDS OK_STATUS... -- CMD...: runs CMD for at most SECONDS, prints its exit
  # status, and keeps the first unexpected one (a hung step cannot stall the whole run).
  step() {
    local limit=$1 ok=() rc=0
    shift
    while [[ $1 != -- ]]; do ok+=("$1"); shift; done
    shift
    timeout "$limit" "$@" || rc=$?
    echo "exit status: $rc"
    [[ " ${ok[*]} " == *" $rc "* ]] || { [[ $EXTRA_RC != 0 ]] || EXTRA_RC=$rc; }
  }
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  [[ $GPUS -gt 0 ]] || GPUS=1
  NP_MAX=$((GPUS < 4 ? GPUS : 4))
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/rd_gpu_check.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT

  say "NCCL collectives on device memory (tests/collective/nccl_collective_test), $GPUS GPU(s)"
  for np in 1 2; do
    if ((np > GPUS)); then
      echo "-np $np: not run: one GPU here, and NCCL does not support two ranks of one communicator on the same GPU"
      continue
    fi
    echo "-- mpirun -np $np"
    step 90 0 -- "$BUNDLE/run" mpirun -np "$np" nccl_collective_test
  done

  say "MPI collectives on host memory (tests/collective/collective_test), 2 ranks"
  step 60 0 -- "$BUNDLE/run" mpirun -np 2 --oversubscribe collective_test

  say "message_passing over NCCL, $NP_MAX rank(s)"
  step 60 0 -- "$BUNDLE/run" mpirun -np "$NP_MAX" message_passing --device cuda --verbose

  say "training smoke run: resnet_ddp --device cuda on synthetic Dataset_2-shaped data"
  step 60 0 -- "$BUNDLE/run" resnet_ddp synth --out "$WORK/synth"
  WORKERS=$(( $(nproc 2>/dev/null || echo 4) / NP_MAX - 1 ))
  ((WORKERS >= 1)) || WORKERS=1
  echo "-- reference recipe (ResNet-34, 244 px, batch 16, AutoAugment, Adam), fp32, 2 epochs, $NP_MAX rank(s)"
  step 150 0 -- "$BUNDLE/run" mpirun -np "$NP_MAX" resnet_ddp --device cuda --data "$WORK/synth" \
    --epochs 2 --workers "$WORKERS" --progress lines --log-every 20 --resume none --output-dir "$WORK/out_fp32"
  for prec in fp16 bf16; do
    echo "-- $prec mixed precision, 1 epoch of at most 40 steps"
    step 90 0 -- "$BUNDLE/run" mpirun -np "$NP_MAX" resnet_ddp --device cuda --data "$WORK/synth" \
      --epochs 1 --max-steps 40 --precision "$prec" --workers "$WORKERS" --progress lines --log-every 10 \
      --resume none --output-dir "$WORK/out_$prec"
  done
fi

say "training-step benchmark: ResNet-34 @244, batch 16, NHWC (resnet_ddp) vs PyTorch"
RES=$OUT/bench.jsonl
: > "$RES"
for prec in fp32 tf32 fp16 bf16; do
  timeout 120 "${BENCH_CMD[@]}" --arch resnet34 --size 244 --batch 16 --precision "$prec" \
    --layout nhwc --steps "$STEPS" --warmup "$WARMUP" | tee -a "$RES"
done
if [[ -n "$PY" ]]; then
  timeout 200 "$PY" "$TORCH_BENCH" --arch resnet34 --size 244 --batch 16 \
    --channels-last --steps "$STEPS" --warmup "$WARMUP" | tee -a "$RES"
else
  echo "no Python with torch: PyTorch comparison skipped"
fi

say "summary"
"${PY:-python3}" - "$RES" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
ours = {r["precision"]: r for r in rows if r["framework"] == "resnet_ddp"}
ref = {r["precision"]: r for r in rows if r["framework"] == "pytorch"}
print(f"{'precision':9} {'resnet_ddp img/s':>17} {'pytorch img/s':>14} {'ratio':>6} {'ours MiB':>9} {'torch MiB':>10}")
for p in ("fp32", "tf32", "fp16", "bf16"):
    a, b = ours.get(p), ref.get(p)
    ra = f"{a['img_per_s']:.1f}" if a else "-"
    rb = f"{b['img_per_s']:.1f}" if b else "-"
    ratio = f"{a['img_per_s'] / b['img_per_s']:.2f}" if a and b else "-"
    ma = f"{a['memory_used_mib']:.0f}" if a else "-"
    mb = f"{b['peak_memory_mib']}" if b else "-"
    print(f"{p:9} {ra:>17} {rb:>14} {ratio:>6} {ma:>9} {mb:>10}")
PYEOF
if [[ -n $BUNDLE ]]; then
  say "done (op tests exit $TEST_RC; other checks: first failure's status $EXTRA_RC)"
  ((TEST_RC != 0)) && exit "$TEST_RC"
  exit "$EXTRA_RC"
fi
say "done (op tests exit $TEST_RC)"
exit "$TEST_RC"
