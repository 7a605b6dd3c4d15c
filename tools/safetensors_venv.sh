#!/bin/bash
# A small virtual environment with PyPI's `safetensors` package (Debian bookworm has
# none) on top of Debian's python3-torch / torchvision / h5py (--system-site-packages),
# for loading `resnet_ddp export` files the way a PyTorch user would. Outside the build
# tree so `make clean` keeps it. Creates it on first use; prints the interpreter's path.
#
#   tools/safetensors_venv.sh            # ensure it exists, print .../bin/python3
#   RD_SAFETENSORS_VENV=DIR tools/safetensors_venv.sh
#
# Exit status 2 (and a reason on stderr) when it cannot be created (no python3-venv,
# no network to PyPI).
set -euo pipefail

venv=${RD_SAFETENSORS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/resnet_ddp/safetensors}
py=$venv/bin/python3
# Debian's interpreter: python3-torch and friends are installed for it.
base=/usr/bin/python3
[ -x "$base" ] || base=$(command -v python3 || true)

check() {
  "$py" -c "import safetensors.torch, torch, torchvision" 2>/dev/null
}
if ! check; then
  [ -n "$base" ] || { echo "safetensors_venv.sh: python3 not found" >&2; exit 2; }
  echo "safetensors_venv.sh: installing safetensors from PyPI into $venv" >&2
  if [ ! -x "$py" ]; then
    mkdir -p "$(dirname "$venv")"
    "$base" -m venv --system-site-packages "$venv" >&2 || {
      echo "safetensors_venv.sh: cannot create a venv in $venv (Debian: apt-get install python3-venv)" >&2
      exit 2
    }
  fi
  "$py" -m pip install -q --disable-pip-version-check safetensors >&2 ||
    { echo "safetensors_venv.sh: pip install safetensors failed (see above; PyPI unreachable?)" >&2; exit 2; }
  check || {
    echo "safetensors_venv.sh: $py cannot import safetensors.torch, torch and torchvision" \
         "(torch and torchvision come from Debian: apt-get install python3-torch python3-torchvision)" >&2
    exit 2
  }
fi
echo "$py"
