#!/usr/bin/env bash
# Packs everything a GPU host without package access needs to run resnet_ddp's CUDA build,
# into one folder well under 60 MiB (default bundle/gpu):
#
#   tools/gpu_bundle.sh [--out DIR] [--build-dir DIR] [--jobs N] [--no-build] [--max-mib N]
#
#  1. configures (if needed) and builds, for sm_75, sm_80 and sm_90, only what the GPU host
#     runs: resnet_ddp, message_passing, test_gpu_cuda_backend, gpu_train_bench,
#     nccl_collective_test, collective_test (default build dir: build-gpu-bundle;
#     -DRESNET_DDP_NATIVE=OFF, since the host's CPU is not this one)
#  2. collects them with every shared library they need (ldd closure) except glibc and the
#     CUDA libraries (cudart, cuBLAS, cuDNN, NCCL: the host has them, e.g. in PyTorch's
#     nvidia-* wheels), plus Open MPI's mpirun/orted, its plugins (those for shared memory
#     and TCP; fabric plugins for UCX/libfabric/PSM/verbs are left out), PMIx's plugins and
#     the help texts, into payload.tar.xz (xz: one copy of oneDNN alone is 38 MiB, and the
#     six programs share their CUDA kernels, which a solid archive stores about once)
#  3. writes the launcher `run` next to it (unpacks the payload once into a cache folder,
#     finds the host's CUDA libraries, relocates Open MPI, runs a command), a copy of
#     tools/gpu_check.sh, bench/torch_gpu_bench.py (+ tools/torch_reference.py), PyTorch's GPU DDP
#     recipe (bench/pytorch_gpu_ddp_recipe.py, where present), and MANIFEST.txt
#  4. checks the result: size limit, and every program starting under `env -i` through
#     `run` with only the bundle's libraries, glibc and the CUDA libraries.
#
# On the GPU host:  bundle/gpu/tools/gpu_check.sh     (or: bundle/gpu/run resnet_ddp --help)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/bundle/gpu
BUILD=$ROOT/build-gpu-bundle
JOBS=$(nproc 2>/dev/null || echo 2)
BUILD_IT=1
MAX_MIB=60
die() { echo "gpu_bundle.sh: error: $*" >&2; exit 1; }
say() { printf '== %s\n' "$*"; }
while (($#)); do
  case $1 in
    --out) OUT=${2:?--out needs a folder}; shift ;;
    --build-dir) BUILD=${2:?--build-dir needs a folder}; shift ;;
    --jobs) JOBS=${2:?--jobs needs a number}; shift ;;
    --max-mib) MAX_MIB=${2:?--max-mib needs a number}; shift ;;
    --no-build) BUILD_IT=0 ;;
    -h | --help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift
done
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || die "--jobs '$JOBS': expected a positive integer"
[[ $MAX_MIB =~ ^[1-9][0-9]*$ ]] || die "--max-mib '$MAX_MIB': expected a positive integer"
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
[[ $OUT != "$ROOT" && $OUT != / ]] || die "--out $OUT would overwrite the repository"
for tool in ldd objdump strip xz tar cmake; do
  command -v "$tool" >/dev/null || die "'$tool' is needed (Debian: binutils, xz-utils, tar, cmake)"
done

PROGRAMS=(resnet_ddp message_passing)
TESTS=(tests/gpu/test_gpu_cuda_backend bench/gpu_train_bench
       tests/collective/nccl_collective_test tests/collective/collective_test)
TARGETS=(resnet_ddp message_passing test_gpu_cuda_backend gpu_train_bench nccl_collective_test collective_test)

# ---- 1. build ------------------------------------------------------------------------------
if ((BUILD_IT)); then
  if [[ ! -f $BUILD/CMakeCache.txt ]]; then
    say "configure $BUILD (CUDA ON, sm_75;80;90, no -march=native)"
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DRESNET_DDP_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="75;80;90" -DRESNET_DDP_NATIVE=OFF >/dev/null ||
      die "cmake configure failed (is the CUDA toolkit with cuDNN and NCCL installed?)"
  fi
  say "build ${TARGETS[*]} (-j$JOBS; nvcc for three architectures takes a while)"
  cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" || die "build failed in $BUILD"
fi
cache() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt"; }
[[ -f $BUILD/CMakeCache.txt ]] || die "$BUILD is not a CMake build folder (run without --no-build)"
[[ $(cache RESNET_DDP_CUDA) == ON ]] || die "$BUILD was configured without -DRESNET_DDP_CUDA=ON"
[[ $(cache CMAKE_CUDA_ARCHITECTURES) == "75;80;90" ]] ||
  die "$BUILD targets CUDA architectures '$(cache CMAKE_CUDA_ARCHITECTURES)', not 75;80;90"
[[ $(cache RESNET_DDP_NATIVE) == OFF ]] ||
  die "$BUILD uses -march=native (RESNET_DDP_NATIVE=ON): its code may not run on the GPU host's CPU"
for f in "${PROGRAMS[@]}" "${TESTS[@]}"; do
  [[ -x $BUILD/$f ]] || die "$BUILD/$f is missing (build it, or run without --no-build)"
done

# ---- 2. collect ----------------------------------------------------------------------------
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/gpu_bundle.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
P=$STAGE/payload
mkdir -p "$P/bin" "$P/lib/openmpi" "$P/lib/pmix" "$P/lib/hwloc" "$P/share/openmpi" \
  "$P/share/pmix" "$P/etc/openmpi"

# Provided by the host: glibc (with the loader) and the CUDA stack.
is_glibc() { [[ $1 =~ ^(ld-linux.*|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libnsl|linux-vdso)\.so ]]; }
is_cuda() { [[ $1 =~ ^lib(cuda|cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|nvrtc|nvJitLink|cufft|curand|cusparse|cusolver|nvToolsExt)\.so ]]; }
# Interconnect stacks a single GPU host does not use (and that would drag in large libraries).
is_fabric() { [[ $1 =~ ^lib(ucp|ucs|uct|ucm|fabric|psm|psm2|psm_infinipath|infinipath|ibverbs|rdmacm|efa|nl-|nl-route-|oshmem|mca_common_ucx|mca_common_ofi|mca_common_verbs) ]]; }

declare -A LIBS=()    # soname -> resolved path
declare -A CUDA_NEEDED=()
add_deps() { # add_deps ELF: records its shared libraries (recursively, as ldd resolves them)
  local elf=$1 line name path
  while read -r line; do
    name=${line%% *}
    [[ $line == *"=> not found"* ]] && die "$elf needs $name, which ldd cannot find here"
    path=$(sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p' <<<"$line")
    [[ -n $path ]] || continue
    if is_glibc "$name"; then continue; fi
    if is_cuda "$name"; then CUDA_NEEDED[$name]=1; continue; fi
    LIBS[$name]=$path
  done < <(ldd "$elf")
}
# Whether a plugin's libraries are all available (no fabric stack, nothing missing).
plugin_ok() {
  local deps
  deps=$(ldd "$1" 2>/dev/null) || return 1
  [[ $deps != *"not found"* ]] || return 1
  while read -r name _; do
    is_fabric "$name" && return 1
  done <<<"$deps"
  return 0
}

say "programs and tests"
for f in "${PROGRAMS[@]}" "${TESTS[@]}"; do
  strip -o "$P/bin/$(basename "$f")" "$BUILD/$f"
  add_deps "$BUILD/$f"
done

say "Open MPI ($(mpirun --version 2>/dev/null | head -1))"
ORTERUN=$(readlink -f "$(command -v mpirun)") || die "mpirun not found (Debian: openmpi-bin)"
MPI_BIN=$(dirname "$ORTERUN")
ompi_path() { ompi_info --path "$1" 2>/dev/null | sed -n 's/^ *[A-Za-z]*: //p' | head -1; }
MPI_PLUGINS=$(ompi_path pkglibdir)
MPI_DATA=$(ompi_path pkgdatadir)
MPI_ETC=$(ompi_path sysconfdir)
[[ -d $MPI_PLUGINS && -d $MPI_DATA ]] || die "cannot locate Open MPI's plugin/help folders via ompi_info"
cp "$ORTERUN" "$P/bin/orterun"
ln -s orterun "$P/bin/mpirun"
ln -s orterun "$P/bin/mpiexec"
for extra in orted ompi_info; do
  [[ -x $MPI_BIN/$extra ]] && cp "$MPI_BIN/$extra" "$P/bin/$extra"
done
for f in "$P"/bin/orterun "$P"/bin/orted "$P"/bin/ompi_info; do [[ -f $f ]] && add_deps "$f"; done
kept=0 skipped=()
for so in "$MPI_PLUGINS"/mca_*.so; do
  if plugin_ok "$so"; then
    cp "$so" "$P/lib/openmpi/"
    add_deps "$so"
    kept=$((kept + 1))
  else
    skipped+=("$(basename "$so" .so)")
  fi
done
echo "Open MPI plugins: $kept kept, ${#skipped[@]} left out (fabric stacks): ${skipped[*]}"
cp -r "$MPI_DATA"/. "$P/share/openmpi/"
[[ -f $MPI_ETC/openmpi-mca-params.conf ]] && cp "$MPI_ETC/openmpi-mca-params.conf" "$P/etc/openmpi/"

PMIX_LIB=${LIBS[libpmix.so.2]:-}
if [[ -n $PMIX_LIB ]]; then
  PMIX_HOME=$(dirname "$(readlink -f "$PMIX_LIB")")
  for so in "$PMIX_HOME"/pmix/*.so; do
    [[ -e $so ]] || continue
    if plugin_ok "$so"; then cp "$so" "$P/lib/pmix/"; add_deps "$so"; fi
  done
  [[ -d $PMIX_HOME/../share/pmix ]] && cp -r "$PMIX_HOME/../share/pmix"/. "$P/share/pmix/"
  echo "PMIx plugins: $(find "$P/lib/pmix" -name '*.so' | wc -l) from $PMIX_HOME/pmix"
fi

say "shared libraries"
# Every library's own dependencies are already in ldd's answer for the program that loads it.
for name in $(printf '%s\n' "${!LIBS[@]}" | sort); do
  cp -L "${LIBS[$name]}" "$P/lib/$name"
done
# Oldest glibc the host may have: the newest symbol version any bundled file uses.
GLIBC_NEEDED=$(find "$P/bin" "$P/lib" -type f -exec objdump -T {} \; 2>/dev/null |
  grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2 -n -u | tail -1 | sed 's/GLIBC_//')
mapfile -t CUDA_SONAMES < <(printf '%s\n' "${!CUDA_NEEDED[@]}" | sort)
CUDA_LIST=${CUDA_SONAMES[*]}
echo "${#LIBS[@]} libraries; host must provide glibc >= $GLIBC_NEEDED and: $CUDA_LIST"

# ---- 3. write the bundle -------------------------------------------------------------------
say "payload.tar.xz"
# Only ever empty a folder that holds a previous bundle (or nothing).
if [[ -n $(ls -A "$OUT") && ! -f $OUT/payload.id ]]; then
  die "--out $OUT is not empty and holds no previous bundle: refusing to overwrite it"
fi
rm -rf "${OUT:?}"/* "$OUT"/.[!.]* 2>/dev/null || true
mkdir -p "$OUT/tools"
printf '%s\n' "$GLIBC_NEEDED" >"$P/GLIBC_NEEDED"
printf '%s\n' "${CUDA_SONAMES[@]}" >"$P/CUDA_LIBS"
# -9e with a 64 MiB window: the six programs' identical CUDA kernels compress to one copy.
tar -C "$P" --owner=0 --group=0 --sort=name -cf - . | xz -T1 -9e >"$OUT/payload.tar.xz"
sha256sum "$OUT/payload.tar.xz" | cut -c1-16 >"$OUT/payload.id"
cp "$ROOT/tools/gpu_bundle_run.sh" "$OUT/run"
chmod +x "$OUT/run"
cp "$ROOT/tools/gpu_check.sh" "$OUT/tools/gpu_check.sh"
cp "$ROOT/bench/torch_gpu_bench.py" "$OUT/tools/torch_gpu_bench.py"
cp "$ROOT/tools/torch_reference.py" "$OUT/tools/torch_reference.py"  # torch_gpu_bench.py imports it
# PyTorch's DDP recipe on the GPU, for gpu_check.sh --e2e (it and the recipe module it
# imports find torch_reference.py in ../tools, as in the repository), and the event-file
# reader that --e2e's summary imports.
for f in pytorch_gpu_ddp_recipe.py pytorch_reference_recipe.py e2e_side_by_side.py; do
  if [[ -f $ROOT/bench/$f ]]; then
    mkdir -p "$OUT/bench"
    cp "$ROOT/bench/$f" "$OUT/bench/$f"
  fi
done
{
  echo "resnet_ddp GPU bundle"
  echo "built: $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname) from commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
  echo "CUDA architectures: sm_75 sm_80 sm_90 ($(nvcc --version 2>/dev/null | tail -1))"
  echo "host must provide: glibc >= $GLIBC_NEEDED; $CUDA_LIST; the NVIDIA driver (libcuda.so.1)"
  echo "use: ./run PROGRAM [ARGS]   ./run --env   tools/gpu_check.sh"
  echo
  echo "programs (bin/):"
  find "$P/bin" -mindepth 1 -printf '  %-24f %10s %l\n' | sort
  echo "libraries (lib/), with their Debian packages:"
  for f in "$P"/lib/*.so*; do
    src=$(readlink -f "${LIBS[$(basename "$f")]}")
    # usrmerge: dpkg may know the file under /lib rather than /usr/lib.
    pkg=$({ dpkg -S "$src" || dpkg -S "${src#/usr}"; } 2>/dev/null | cut -d: -f1 | head -1) || pkg=""
    printf '  %-32s %10s %s\n' "$(basename "$f")" "$(stat -c %s "$f")" "${pkg:-?}"
  done
  echo "Open MPI plugins: $(find "$P/lib/openmpi" -name '*.so' | wc -l) (left out: ${skipped[*]})"
  echo "PMIx plugins: $(find "$P/lib/pmix" -name '*.so' -printf '%f ')"
  echo "unpacked size: $(du -sm "$P" | cut -f1) MiB"
} >"$OUT/MANIFEST.txt"

# ---- 4. check ------------------------------------------------------------------------------
say "check"
SIZE_KIB=$(du -sk "$OUT" | cut -f1)
SIZE_MIB=$(awk -v k="$SIZE_KIB" 'BEGIN { printf "%.1f", k / 1024 }')
echo "bundle: $OUT, $SIZE_MIB MiB (payload unpacks to $(du -sm "$P" | cut -f1) MiB)"
((SIZE_KIB < MAX_MIB * 1024)) || die "the bundle is $SIZE_MIB MiB, over the $MAX_MIB MiB limit"
# A clean environment: only what `run` sets up (bundle libraries + CUDA libraries + glibc).
CHECK_CACHE=$STAGE/cache
clean_run() { env -i HOME="$STAGE" PATH=/usr/bin:/bin RD_BUNDLE_CACHE="$CHECK_CACHE" "$OUT/run" "$@"; }
clean_run --env
fails=0
check() { # check EXPECTED_STATUSES CMD...: runs it and reports
  local want=$1 rc=0 out
  shift
  out=$(clean_run "$@" 2>&1) || rc=$?
  if [[ " $want " == *" $rc "* ]]; then
    echo "ok   (exit $rc) run $*"
  else
    echo "FAIL (exit $rc) run $*"; echo "$out" | tail -5 | sed 's/^/     /'; fails=$((fails + 1))
  fi
}
check 0 resnet_ddp --help
check 0 message_passing --help
check 0 test_gpu_cuda_backend --help
check "0 77" gpu_train_bench          # 77: no GPU here
check "0 77" nccl_collective_test     # 77: no GPU here
check 0 mpirun -np 2 --oversubscribe collective_test
check 0 mpirun -np 2 --oversubscribe message_passing --device cpu
check 0 ompi_info --version
# Every library the loader initialises must come from the bundle, glibc or the CUDA folders.
CUDA_DIRS=$(clean_run --env | sed -n 's/^CUDA library: *[^:]*: \(\/.*\)/\1/p' | sort -u)
# (`env` sets LD_DEBUG after run's own shell tools, so only mpirun and the ranks are traced.)
traced() { clean_run env LD_DEBUG=libs "$@" 2>&1 >/dev/null | sed -n 's/.*calling init: //p'; }
foreign=$({ traced resnet_ddp --help; traced mpirun -np 2 --oversubscribe collective_test; } | sort -u |
  while read -r obj; do
    case $obj in
      "$CHECK_CACHE"/*) ;;
      */libc.so.* | */libm.so.* | */libdl.so.* | */libpthread.so.* | */librt.so.* | */libresolv.so.* | */ld-linux*) ;;
      *) grep -qxF "$(dirname "$obj")" <<<"$CUDA_DIRS" || echo "$obj" ;;
    esac
  done)
if [[ -n $foreign ]]; then
  mapfile -t foreign_list <<<"$foreign"
  echo "FAIL libraries loaded from outside the bundle:"; printf '     %s\n' "${foreign_list[@]}"
  fails=$((fails + 1))
else
  echo "ok   every library that resnet_ddp, mpirun and 2 collective_test ranks load is the bundle's, glibc or CUDA's"
fi
((fails == 0)) || die "$fails check(s) failed"
echo "gpu_bundle.sh: done: $OUT ($SIZE_MIB MiB). Copy the folder to the GPU host and run tools/gpu_check.sh in it."
