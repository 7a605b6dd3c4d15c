#!/bin/bash
# Training parity on real images: the same recipe in resnet_ddp and in PyTorch DDP
# on a fixed Fashion-MNIST subset (Debian's dataset-fashion-mnist), side by side.
#
#   tools/parity/fashion_mnist_compare.sh [--build-dir DIR] [--epochs N] [--ranks R]
#                                         [--train-per-class N] [--val-per-class M]
#
# Defaults: build/, 10 classes x 600 train / 100 validation images (6000 / 1000),
# 32 px, ResNet-18 with the reference head, batch 32 per rank, Adam lr 3e-4, flip
# augmentation, 5 epochs, 2 ranks x 1 thread each (about 5 minutes on 2 cores).
# Prints per-epoch validation accuracy of both and the wall times. The data tree is
# made once under ${TMPDIR:-/tmp}.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build_dir=${BUILD_DIR:-$root/build}
python=${RD_TORCH_PYTHON:-/usr/bin/python3}
epochs=5
ranks=2
train_per_class=600
val_per_class=100

die() { echo "fashion_mnist_compare.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) [ $# -ge 2 ] || die "--build-dir needs a value"; build_dir=$2; shift 2 ;;
    --epochs) [ $# -ge 2 ] || die "--epochs needs a value"; epochs=$2; shift 2 ;;
    --ranks) [ $# -ge 2 ] || die "--ranks needs a value"; ranks=$2; shift 2 ;;
    --train-per-class) [ $# -ge 2 ] || die "--train-per-class needs a value"; train_per_class=$2; shift 2 ;;
    --val-per-class) [ $# -ge 2 ] || die "--val-per-class needs a value"; val_per_class=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
for n in "$epochs" "$ranks" "$train_per_class" "$val_per_class"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "--epochs/--ranks/--train-per-class/--val-per-class must be positive integers (got '$n')"
done
bin=$build_dir/resnet_ddp
[ -x "$bin" ] || die "$bin not found: build first (make)"
command -v mpirun >/dev/null || die "mpirun not found (make deps)"
"$python" -c "import torch, torchvision" 2>/dev/null ||
  die "$python cannot import torch/torchvision (Debian's python3-torch python3-torchvision; make deps)"

data=${TMPDIR:-/tmp}/rd_fashion_mnist_${train_per_class}_${val_per_class}
if [ ! -d "$data/Train" ]; then
  echo "== converting Fashion-MNIST into $data" >&2
  rm -rf "$data.partial"
  "$python" "$root/data/fashion_mnist_to_imagefolder.py" --out "$data.partial" \
    --train-per-class "$train_per_class" --val-per-class "$val_per_class" >&2
  mv "$data.partial" "$data"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=1

echo "== resnet_ddp: $ranks ranks x 1 thread, $epochs epochs" >&2
t0=$(date +%s.%N)
mpirun --oversubscribe --bind-to none -np "$ranks" "$bin" --data "$data" --arch resnet18 --head mlp \
  --image-size 32 --batch-size 32 --epochs "$epochs" --lr 3e-4 --augment flip --threads 1 --workers 1 \
  --scheduler plateau --label-smoothing 0.1 --seed 0 --output-dir "$work/rd" --resume none \
  --progress none --log-every 0 --device cpu >&2
t1=$(date +%s.%N)

echo "== PyTorch DDP (gloo): $ranks ranks x 1 thread, $epochs epochs" >&2
"$python" "$here/fashion_mnist_pytorch.py" --data "$data" --ranks "$ranks" --threads 1 --epochs "$epochs" \
  --batch-size 32 --lr 3e-4 --image-size 32 --augment flip --seed 0 --json "$work/pt.json" >&2

t2=$(date +%s.%N)

"$python" - "$work/rd/metrics.csv" "$work/pt.json" "$t0" "$t1" "$t2" "$data" <<'EOF'
import csv, json, sys
metrics, pt_json, data = sys.argv[1], sys.argv[2], sys.argv[6]
t0, t1, t2 = (float(t) for t in sys.argv[3:6])
rd = list(csv.DictReader(open(metrics)))
pt = json.load(open(pt_json))
acc_key = next(k for k in rd[0] if k.strip().lower() in ("val_acc", "val_accuracy"))
print(f"Fashion-MNIST subset {data}: ResNet-18 (reference head), 32 px, batch 32/rank, Adam 3e-4, "
      f"{pt['ranks']} ranks x 1 thread")
print(f"{'epoch':>5} {'resnet_ddp val acc':>19} {'PyTorch val acc':>16}")
for r, p in zip(rd, pt["epochs"]):
    print(f"{p['epoch']:>5} {float(r[acc_key]):>19.4f} {p['val_acc']:>16.4f}")
rd_best = max(float(r[acc_key]) for r in rd)
print(f"{'best':>5} {rd_best:>19.4f} {pt['best_val_acc']:>16.4f}   difference {100 * (rd_best - pt['best_val_acc']):+.2f} points")
rd_epochs = sum(float(r["time_s"]) for r in rd)
pt_epochs = sum(p["epoch_seconds"] for p in pt["epochs"])
print(f"epochs (training + validation): resnet_ddp {rd_epochs:.0f} s, PyTorch {pt_epochs:.0f} s "
      f"({pt_epochs / rd_epochs:.2f}x); whole command incl. start-up: {t1 - t0:.0f} s vs {t2 - t1:.0f} s")
EOF
