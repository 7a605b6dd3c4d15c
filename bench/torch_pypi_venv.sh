#!/bin/bash
# The PyTorch users install today (PyPI's torch 2.15 with oneDNN 3.13, CUDA wheels
# included: ~5.4 GB), in a virtual environment outside the build tree so `make clean`
# keeps it. Creates it on first use; prints the interpreter's path on stdout.
#
#   bench/torch_pypi_venv.sh            # ensure it exists, print .../bin/python3
#   RD_TORCH_VENV=DIR bench/torch_pypi_venv.sh
#
# Debian's python3-torch 1.13 (same oneDNN 2.6 as resnet_ddp) stays the reference for
# the numerical tests; this one is for speed comparisons (make bench TORCH=pypi).
set -euo pipefail

TORCH_VERSION=2.15.0
TORCHVISION_VERSION=0.29.2
venv=${RD_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/resnet_ddp/torch-pypi}
py=$venv/bin/python3

check() {
  "$py" -c "import torch, torchvision, sys; sys.exit(0 if torch.__version__.startswith('$TORCH_VERSION') else 1)" \
    2>/dev/null
}
if ! check; then
  echo "torch_pypi_venv.sh: installing torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION from PyPI" \
       "into $venv (~5.4 GB, a few minutes)" >&2
  command -v python3 >/dev/null || { echo "torch_pypi_venv.sh: python3 not found" >&2; exit 2; }
  [ -x "$py" ] || python3 -m venv "$venv" || {
    echo "torch_pypi_venv.sh: cannot create a venv in $venv (Debian: apt-get install python3-venv)" >&2; exit 2; }
  "$py" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION" \
    "torchvision==$TORCHVISION_VERSION" numpy >&2 ||
    { echo "torch_pypi_venv.sh: pip install failed (see above); nothing is used from $venv" >&2; exit 2; }
  check || { echo "torch_pypi_venv.sh: $py still cannot import torch $TORCH_VERSION" >&2; exit 2; }
fi
echo "$py"
