#!/bin/bash
# The end-to-end comparison users care about: `mpirun -np R resnet_ddp` next to PyTorch's DDP
# recipe as users run it on GPUs (bench/pytorch_gpu_ddp_recipe.py: DataLoader workers,
# pin_memory, non_blocking copies, SyncBatchNorm, channels-last, AMP), on the same synthetic
# JPEG set with the same ranks, model, image size, batch, steps, workers and threads, one
# epoch each; prints epoch time, steady-state img/s, step 1 and the step split side by side
# (bench/e2e_side_by_side.py).
#
#   bench/e2e_vs_pytorch.sh [--device cpu|cuda] [--precision fp32|tf32|fp16|bf16]
#       [--arch A] [--image-size S] [--batch-size B] [--ranks R] [--steps N] [--workers W]
#       [--threads T] [--data DIR | --train N --val N --synth-size WxH --synth-dir DIR]
#       [--build-dir DIR] [--python PY] [--keep DIR]
#
# Defaults: --device cpu, fp32, resnet34 @244, batch 16 per rank, 1 rank, 50 steps, 4 workers,
# threads = cores / ranks. The set: resnet_ddp synth, JPEG, with enough training images for
# the steps (ranks x batch x steps) and 64 validation images, kept in --synth-dir (default
# data/synth_bench/) for the next run. tf32 and fp16 need --device cuda. PyTorch is --python
# (default $RD_TORCH_PYTHON, else /usr/bin/python3); without torch and torchvision there the
# comparison is skipped (exit 77). --keep DIR keeps both runs' logs and outputs. On the CPU
# both sides use plain BatchNorm (PyTorch's SyncBatchNorm refuses CPU modules); on CUDA both
# synchronise it.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build_dir=$root/build
device=cpu precision=fp32 arch=resnet34 size=244 batch=16 ranks=1 steps=50 workers=4 threads=0
train=0 val=64 synth_size=256x256 synth_dir=$root/data/synth_bench data="" keep="" python=${RD_TORCH_PYTHON:-/usr/bin/python3}

die() { echo "e2e_vs_pytorch.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --*) [ $# -ge 2 ] || die "$1 needs a value (see --help)" ;;&
    --device) device=$2 ;;
    --precision) precision=$2 ;;
    --arch) arch=$2 ;;
    --image-size) size=$2 ;;
    --batch-size) batch=$2 ;;
    --ranks) ranks=$2 ;;
    --steps) steps=$2 ;;
    --workers) workers=$2 ;;
    --threads) threads=$2 ;;
    --train) train=$2 ;;
    --val) val=$2 ;;
    --synth-size) synth_size=$2 ;;
    --synth-dir) synth_dir=$2 ;;
    --data) data=$2 ;;
    --build-dir) build_dir=$2 ;;
    --python) python=$2 ;;
    --keep) keep=$2 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift 2
done
# positive FLAG VALUE / count FLAG VALUE: VALUE is an integer > 0 / >= 0, else a usage error.
positive() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 '$2': expected a positive integer"; }
count() { [[ $2 =~ ^[0-9]+$ ]] || die "$1 '$2': expected an integer >= 0"; }
positive --image-size "$size"
positive --batch-size "$batch"
positive --ranks "$ranks"
positive --steps "$steps"
positive --val "$val"
count --workers "$workers"
count --threads "$threads"
count --train "$train"
[ "$size" -ge 32 ] || die "--image-size $size: expected at least 32"
[[ $synth_size =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || die "--synth-size '$synth_size': expected WxH, e.g. 256x256"
case "$device" in cpu | cuda) ;; *) die "--device '$device': expected cpu or cuda" ;; esac
case "$precision" in fp32 | tf32 | fp16 | bf16) ;; *) die "--precision '$precision': expected fp32, tf32, fp16 or bf16" ;; esac
[ "$device" = cuda ] || [ "$precision" = fp32 ] || [ "$precision" = bf16 ] ||
  die "--precision $precision needs --device cuda (on the CPU: fp32 or bf16)"
[ -z "$data" ] || [ -d "$data/Train" ] || die "--data $data: no Train/ folder (ImageFolder layout)"
rd=$build_dir/resnet_ddp
[ -x "$rd" ] || die "$rd not found (build first: make, or give --build-dir)"
launcher=(mpirun --oversubscribe --bind-to none -np "$ranks")
if ! command -v mpirun >/dev/null; then
  [ "$ranks" = 1 ] || die "--ranks $ranks: mpirun not found (Open MPI's openmpi-bin)"
  launcher=()  # one rank runs without a launcher
fi
if ! "$python" -c 'import torch, torchvision' 2>/dev/null; then
  echo "SKIP: $python cannot import torch and torchvision (Debian: python3-torch python3-torchvision; or --python PY)"
  exit 77
fi
[ "$threads" -gt 0 ] || threads=$(( $(nproc) / ranks > 0 ? $(nproc) / ranks : 1 ))
[ "$train" -gt 0 ] || train=$((ranks * batch * steps))

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ -z "$data" ]; then
  data=$synth_dir/e2e_${train}_${val}_${synth_size}
  if [ ! -d "$data/Train" ]; then
    rm -rf "$data"
    mkdir -p "$synth_dir" || die "--synth-dir $synth_dir: cannot create it"
    "$rd" synth --out "$data" --train "$train" --val "$val" --size "$synth_size" >/dev/null ||
      die "resnet_ddp synth --out $data failed"
  fi
fi
if [ -n "$keep" ]; then
  mkdir -p "$keep" || die "--keep $keep: cannot create it"
  work=$(cd "$keep" && pwd)
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
rm -rf "$work/resnet_ddp_out"

sync_bn=--no-sync-bn  # PyTorch's SyncBatchNorm refuses CPU modules: the same work on both sides
[ "$device" = cpu ] || sync_bn=--sync-bn
echo "e2e: $arch @$size, batch $batch/rank, $ranks rank(s) x $threads thread(s), $workers worker(s), $steps steps," \
  "--device $device --precision $precision $sync_bn, data $data"
echo "torch: $("$python" -c 'import torch; print(torch.__version__)'); resnet_ddp: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"

# run NAME CMD...: runs CMD, its output in WORK/NAME.log; on failure shows the log's end.
run() {
  local name=$1 rc=0
  shift
  "$@" >"$work/$name.log" 2>&1 || rc=$?
  if [ "$rc" = 77 ] && [ "$name" = pytorch ]; then
    grep -m 1 SKIP "$work/$name.log"
    exit 77
  fi
  [ "$rc" = 0 ] || { tail -n 20 "$work/$name.log" >&2; die "$name failed (exit $rc): $*"; }
}
run resnet_ddp "${launcher[@]}" "$rd" --data "$data" --arch "$arch" \
  --image-size "$size" --batch-size "$batch" --epochs 1 --max-steps "$steps" --workers "$workers" \
  --threads "$threads" --device "$device" --precision "$precision" "$sync_bn" --log-every 1 --progress lines \
  --output-dir "$work/resnet_ddp_out" --resume none
pt_bn=()
[ "$device" = cuda ] || pt_bn=(--no-sync-bn)
run pytorch "$python" "$here/pytorch_gpu_ddp_recipe.py" --launch "$ranks" --port $((29500 + RANDOM % 400)) \
  --data "$data" --arch "$arch" --image-size "$size" --batch-size "$batch" --epochs 1 --max-steps "$steps" \
  --workers "$workers" --threads "$threads" --device "$device" --precision "$precision" "${pt_bn[@]}"
"$python" "$here/e2e_side_by_side.py" "$work/resnet_ddp_out" "$work/pytorch.log" $((ranks * batch))
