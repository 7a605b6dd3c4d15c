#!/usr/bin/env bash
# The launcher of a GPU bundle made by tools/gpu_bundle.sh (copied there as `run`):
#
#   ./run PROGRAM [ARGS...]   run a bundled program or any command in the bundle's
#                             environment, e.g.  ./run resnet_ddp --help
#                                                ./run mpirun -np 2 nccl_collective_test
#   ./run --env               show what was found (CUDA libraries, glibc, folders)
#   ./run --root              print the folder the payload is unpacked to
#
# The first call unpacks payload.tar.xz (about 100 MiB) into
# ${RD_BUNDLE_CACHE:-${TMPDIR:-/tmp}}/resnet_ddp_bundle.<payload id>; later calls reuse it,
# and a rebuilt bundle (another id) gets a folder of its own.
# The environment it sets up, for the command only:
#   LD_LIBRARY_PATH  bundle lib/ first, then the folders holding the host's CUDA libraries
#                    (cudart, cuBLAS, cuDNN, NCCL): $RD_CUDA_LIB_DIRS (colon-separated) if
#                    set, else the nvidia/*/lib folders of Python's site-packages (PyTorch's
#                    CUDA wheels), else the CUDA toolkit ($CUDA_HOME, /usr/local/cuda);
#                    then the driver's folder and whatever LD_LIBRARY_PATH held before
#   OPAL_* / PMIX_*  Open MPI and PMIx relocated into the bundle (plugins, help texts)
#   OMPI_MCA_*       shared memory + TCP only; defaults that are already set are kept
#   PATH             bundle bin/ first (mpirun, orted, the programs and tests)
set -euo pipefail
BUNDLE=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
die() { echo "run: error: $*" >&2; exit 1; }
[[ -f $BUNDLE/payload.tar.xz && -f $BUNDLE/payload.id ]] ||
  die "$BUNDLE has no payload.tar.xz/payload.id: not a bundle made by tools/gpu_bundle.sh"

# ---- unpack once --------------------------------------------------------------------------
ID=$(cat "$BUNDLE/payload.id")
R=${RD_BUNDLE_CACHE:-${TMPDIR:-/tmp}}/resnet_ddp_bundle.$ID
if [[ ! -f $R/.complete ]]; then
  mkdir -p "$(dirname "$R")"
  tmp=$(mktemp -d "$R.partial.XXXXXX") || die "cannot create a folder next to $R (set RD_BUNDLE_CACHE)"
  echo "run: unpacking the bundle into $R (once)" >&2
  if command -v xz >/dev/null; then
    xz -dc "$BUNDLE/payload.tar.xz" | tar -C "$tmp" -xf - || { rm -rf "$tmp"; die "unpacking $BUNDLE/payload.tar.xz failed"; }
  else # Python's tarfile reads xz without the xz program.
    py=$(command -v python3 || command -v python) || { rm -rf "$tmp"; die "neither xz nor python3 is available to unpack the bundle"; }
    "$py" -c 'import sys, tarfile
t = tarfile.open(sys.argv[1])
t.extractall(sys.argv[2], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))' \
      "$BUNDLE/payload.tar.xz" "$tmp" || { rm -rf "$tmp"; die "unpacking $BUNDLE/payload.tar.xz failed"; }
  fi
  touch "$tmp/.complete"
  # Another process may have finished first: keep its copy.
  mv -T "$tmp" "$R" 2>/dev/null || rm -rf "$tmp"
  [[ -f $R/.complete ]] || die "unpacking into $R did not complete"
fi
if [[ ${1:-} == --root ]]; then echo "$R"; exit 0; fi

# ---- glibc --------------------------------------------------------------------------------
NEED_GLIBC=$(cat "$R/GLIBC_NEEDED")
HAVE_GLIBC=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
if [[ -n $HAVE_GLIBC && -n $NEED_GLIBC ]] &&
  [[ $(printf '%s\n%s\n' "$NEED_GLIBC" "$HAVE_GLIBC" | sort -t. -k1,1n -k2,2n | head -1) != "$NEED_GLIBC" ]]; then
  die "this host has glibc $HAVE_GLIBC; the bundle was built against $NEED_GLIBC (build it on an older Debian/Ubuntu)"
fi

# ---- the host's CUDA libraries --------------------------------------------------------------
read -r -a NEEDED <<<"$(tr '\n' ' ' <"$R/CUDA_LIBS")"
CANDIDATES=()
if [[ -n ${RD_CUDA_LIB_DIRS:-} ]]; then
  IFS=: read -r -a CANDIDATES <<<"$RD_CUDA_LIB_DIRS"
else
  # Python's site-packages: PyTorch's nvidia-* wheels (nvidia/cudnn/lib, nvidia/cu13/lib, ...).
  for py in ${RD_GPU_PYTHON:-} python3 python /usr/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    while read -r site; do
      [[ -d $site/nvidia ]] || continue
      while read -r d; do CANDIDATES+=("$d"); done < <(find "$site/nvidia" -maxdepth 4 -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u)
    done < <(LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} "$py" -c 'import site, sys; print("\n".join(sys.path + site.getsitepackages()))' 2>/dev/null)
  done
  for d in ${CUDA_HOME:+"$CUDA_HOME/lib64" "$CUDA_HOME/lib"} /usr/local/cuda/lib64 /usr/local/cuda/lib \
    /usr/local/cuda/targets/x86_64-linux/lib; do
    CANDIDATES+=("$d")
  done
fi
CUDA_DIRS=() REPORT=() MISSING=()
for lib in "${NEEDED[@]}"; do
  found=""
  for d in "${CANDIDATES[@]}"; do
    if [[ -e $d/$lib ]]; then found=$d; break; fi
  done
  if [[ -n $found ]]; then
    [[ " ${CUDA_DIRS[*]} " == *" $found "* ]] || CUDA_DIRS+=("$found")
    REPORT+=("$lib: $found")
  elif /sbin/ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$lib "; then
    REPORT+=("$lib: system (ldconfig)")
  else
    MISSING+=("$lib")
    REPORT+=("$lib: NOT FOUND")
  fi
done
DRIVER_DIRS=()
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/wsl/lib; do
  [[ -e $d/libcuda.so.1 ]] && DRIVER_DIRS+=("$d")
done

# ---- environment --------------------------------------------------------------------------
join() { local IFS=:; echo "$*"; }
LD_LIBRARY_PATH=$(join "$R/lib" ${CUDA_DIRS[@]+"${CUDA_DIRS[@]}"} ${DRIVER_DIRS[@]+"${DRIVER_DIRS[@]}"} ${LD_LIBRARY_PATH:+"$LD_LIBRARY_PATH"})
export LD_LIBRARY_PATH
export PATH=$R/bin:$PATH
# Open MPI looks for its plugins, help texts and defaults under its configure-time prefix
# unless these say otherwise.
export OPAL_PREFIX=$R OPAL_EXEC_PREFIX=$R OPAL_BINDIR=$R/bin OPAL_SBINDIR=$R/bin \
  OPAL_LIBEXECDIR=$R/bin OPAL_LIBDIR=$R/lib OPAL_PKGLIBDIR=$R/lib/openmpi \
  OPAL_DATAROOTDIR=$R/share OPAL_DATADIR=$R/share OPAL_PKGDATADIR=$R/share/openmpi \
  OPAL_SYSCONFDIR=$R/etc/openmpi
export OMPI_MCA_mca_base_component_path=$R/lib/openmpi
export PMIX_PREFIX=$R PMIX_EXEC_PREFIX=$R PMIX_BINDIR=$R/bin PMIX_LIBDIR=$R/lib \
  PMIX_PKGLIBDIR=$R/lib/pmix PMIX_DATAROOTDIR=$R/share PMIX_DATADIR=$R/share \
  PMIX_PKGDATADIR=$R/share/pmix PMIX_SYSCONFDIR=$R/etc
export PMIX_MCA_mca_base_component_path=$R/lib/pmix
# hwloc must not load the host's plugins (another hwloc version); it needs none.
export HWLOC_PLUGINS_PATH=$R/lib/hwloc
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader,tcp}
# Containers often forbid the cross-process memory access vader's single copy uses.
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
# mpirun's default launcher needs ssh/rsh even for local ranks; without either, use the
# single-host one (the bundle is for one host: its TCP/shared-memory transports only).
if [[ -z ${OMPI_MCA_plm:-} ]] && ! command -v ssh >/dev/null && ! command -v rsh >/dev/null; then
  export OMPI_MCA_plm=isolated
fi
if [[ $(id -u) == 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
  export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
fi

if [[ ${1:-} == --env || $# == 0 ]]; then
  echo "bundle:        $BUNDLE (payload $ID)"
  echo "unpacked in:   $R"
  echo "glibc:         host ${HAVE_GLIBC:-?}, needs >= $NEED_GLIBC"
  printf 'CUDA library:  %s\n' "${REPORT[@]}"
  echo "driver:        ${DRIVER_DIRS[*]:-libcuda.so.1 from the default loader path}"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  if ((${#MISSING[@]})); then
    echo "missing: ${MISSING[*]}: install PyTorch with CUDA (its nvidia-* wheels) or the CUDA toolkit with cuDNN and NCCL, or set RD_CUDA_LIB_DIRS" >&2
    exit 1
  fi
  (($# == 0)) && echo "usage: $0 PROGRAM [ARGS...]   (programs: $(find "$R/bin" -mindepth 1 -printf '%f ' | sort))"
  exit 0
fi
if ((${#MISSING[@]})); then
  echo "run: warning: not found on this host: ${MISSING[*]} (CUDA programs will not start; see ./run --env)" >&2
fi
exec "$@"
