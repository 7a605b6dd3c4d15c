#!/bin/bash
# The Python packages the reference checks need that Debian bookworm does not ship
# (`tensorboard`, for reading our event files with TensorBoard's own reader;
# `safetensors`, for loading `resnet_ddp export` files as a PyTorch user would), in a
# virtual environment outside the build tree so `make clean` keeps it. It sees the
# Debian packages too (--system-site-packages: numpy, torch, h5py stay Debian's).
# Creates it on first use (`make deps` calls this); prints the interpreter's path.
#
#   tools/py_venv.sh                  # ensure it exists, print .../bin/python3
#   RD_PYREF_VENV=DIR tools/py_venv.sh
#
# Exit status 2 when it cannot be made (no python3-venv, no network): callers that
# only test with it skip.
set -euo pipefail

TENSORBOARD_VERSION=2.21.0
SAFETENSORS_VERSION=0.8.0
venv=${RD_PYREF_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/resnet_ddp/pyref}
py=$venv/bin/python3
# Debian's interpreter, whose site-packages the venv shares (not a pyenv/conda one).
base=/usr/bin/python3
[ -x "$base" ] || base=$(command -v python3 || true)

check() {
  "$py" -c "import sys, tensorboard, safetensors, safetensors.torch, torch, torchvision
sys.exit(0 if (tensorboard.__version__, safetensors.__version__) == ('$TENSORBOARD_VERSION', '$SAFETENSORS_VERSION') else 1)" \
    2>/dev/null
}
# Tests running in parallel (ctest -j) must not pip-install into one venv at once.
{ mkdir -p "$(dirname "$venv")" && exec 9>"$venv.lock" && flock 9; } 2>/dev/null ||
  { echo "py_venv.sh: cannot create or lock $venv.lock" >&2; exit 2; }
if ! check; then
  echo "py_venv.sh: installing tensorboard==$TENSORBOARD_VERSION safetensors==$SAFETENSORS_VERSION from PyPI into $venv" >&2
  [ -n "$base" ] || { echo "py_venv.sh: python3 not found" >&2; exit 2; }
  [ -x "$py" ] || "$base" -m venv --system-site-packages "$venv" || {
    echo "py_venv.sh: cannot create a venv in $venv (Debian: apt-get install python3-venv)" >&2; exit 2; }
  "$py" -m pip install -q --disable-pip-version-check "tensorboard==$TENSORBOARD_VERSION" \
    "safetensors==$SAFETENSORS_VERSION" >&2 ||
    { echo "py_venv.sh: pip install failed (see above); nothing is used from $venv" >&2; exit 2; }
  check || { echo "py_venv.sh: $py cannot import tensorboard $TENSORBOARD_VERSION, safetensors $SAFETENSORS_VERSION," \
    "torch and torchvision (the last two are Debian's: apt-get install python3-torch python3-torchvision)" >&2; exit 2; }
fi
echo "$py"
