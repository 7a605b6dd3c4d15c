#!/bin/bash
# timm for the args.yaml test (tests/e2e/timm_args_real.sh): timm from PyPI in its own
# virtual environment (over Debian's torch 1.13 and torchvision, --system-site-packages),
# and timm's train.py, which the timm package does not ship (it is in the GitHub
# repository huggingface/pytorch-image-models): give it as the argument, from the same
# tag as the package (v1.0.28). Prints the folder the test reads.
#
#   tools/timm_venv.sh ~/src/pytorch-image-models/train.py
#   RD_TIMM_DIR=DIR tools/timm_venv.sh TRAIN_PY
#
# Exit status 2 when it cannot be made (no python3-venv, no network, no train.py).
set -euo pipefail

TIMM_VERSION=1.0.28
dir=${RD_TIMM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/resnet_ddp/timm}
train_py=${1:-}
[ -n "$train_py" ] && [ -f "$train_py" ] ||
  { echo "timm_venv.sh: give timm's train.py (pytorch-image-models, tag v$TIMM_VERSION) as the argument" >&2; exit 2; }
grep -q "args.yaml" "$train_py" || { echo "timm_venv.sh: $train_py does not look like timm's train.py" >&2; exit 2; }
mkdir -p "$dir"
py=$dir/venv/bin/python3
[ -x "$py" ] || /usr/bin/python3 -m venv --system-site-packages "$dir/venv" ||
  { echo "timm_venv.sh: cannot create a venv in $dir/venv (Debian: apt-get install python3-venv)" >&2; exit 2; }
# Without its dependencies: torch, torchvision and PyYAML are Debian's, and the Hugging
# Face hub (downloads) is not used.
"$py" -c "import timm, sys; sys.exit(timm.__version__ != '$TIMM_VERSION')" 2>/dev/null ||
  "$py" -m pip install -q --disable-pip-version-check --no-deps "timm==$TIMM_VERSION" >&2 ||
  { echo "timm_venv.sh: pip install timm==$TIMM_VERSION failed (see above)" >&2; exit 2; }
cp "$train_py" "$dir/train.py"
echo "$dir"
