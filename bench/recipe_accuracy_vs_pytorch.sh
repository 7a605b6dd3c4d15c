#!/bin/bash
# torchvision's modern recipe, small: does resnet_ddp reach PyTorch's accuracy, and faster?
# Fashion-MNIST (Debian's dataset-fashion-mnist, as `make run` converts it), ResNet-18,
# 2 ranks x 1 thread, SGD + linear warmup + cosine, RandomResizedCrop + flip +
# TrivialAugmentWide + RandomErasing, MixUp/CutMix, label smoothing, EMA, repeated
# augmentation; the same flags on both sides, 3 seeds each (alternating), then the final
# top-1 (model and EMA) per run, mean and spread per side, and the wall times.
#
#   bench/recipe_accuracy_vs_pytorch.sh [--build-dir DIR] [--epochs E] [--seeds K]
#       [--train-per-class N] [--val-per-class N] [--run-timeout S]
#
# PyTorch is $RD_TORCH_PYTHON (default: bench/torch_pypi_venv.sh's torch 2.15, whose
# torchvision has MixUp/CutMix): bench/pytorch_imagenet_recipe.py. Every run's log (and
# resnet_ddp's metrics.csv) stays in bench/results.recipe_accuracy/; a run that outlives
# --run-timeout seconds (default: ~6x this machine's time for it) is killed and named.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build_dir=$root/build
epochs=10 seeds=3 train_pc=400 val_pc=100 run_timeout=

die() { echo "recipe_accuracy_vs_pytorch.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir | --epochs | --seeds | --train-per-class | --val-per-class | --run-timeout)
      [ $# -ge 2 ] || die "$1 needs a value" ;;&
    --build-dir) build_dir=$2 ;;
    --epochs) epochs=$2 ;;
    --seeds) seeds=$2 ;;
    --train-per-class) train_pc=$2 ;;
    --val-per-class) val_pc=$2 ;;
    --run-timeout) run_timeout=$2 ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift 2
done
positive() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 '$2': expected a positive integer"; }
positive --epochs "$epochs"; positive --seeds "$seeds"
positive --train-per-class "$train_pc"; positive --val-per-class "$val_pc"
# About 2 ms per image and epoch is what either side takes here; the default allows 6x that.
run_timeout=${run_timeout:-$((300 + epochs * (train_pc + val_pc) * 10 * 12 / 1000))}
positive --run-timeout "$run_timeout"
rd=$build_dir/resnet_ddp
[ -x "$rd" ] || die "$rd not found (build first: make)"
python=${RD_TORCH_PYTHON:-}
if [ -z "$python" ]; then python=$("$here/torch_pypi_venv.sh") || die "no PyTorch (bench/torch_pypi_venv.sh)"; fi
"$python" -c 'from torchvision.transforms import v2; v2.MixUp' 2>/dev/null ||
  die "$python: needs torch and torchvision >= 0.16 (MixUp/CutMix in transforms.v2)"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
data=$root/data/fashion_mnist_${train_pc}_${val_pc}
if [ ! -d "$data/Train" ]; then
  /usr/bin/python3 "$root/data/fashion_mnist_to_imagefolder.py" --out "$data.partial" \
    --train-per-class "$train_pc" --val-per-class "$val_pc" >/dev/null || die "fashion_mnist_to_imagefolder.py failed"
  mv "$data.partial" "$data"
fi
work=$root/bench/results.recipe_accuracy
rm -rf "$work" && mkdir -p "$work"

# Runs "$@" in its own process group (mpirun and its ranks; the PyTorch launcher and its
# ranks and loader workers) and kills the whole group after $run_timeout seconds.
limited() {
  setsid "$@" &
  local pid=$! rc=0
  (sleep "$run_timeout" && kill -TERM -- -"$pid" 2>/dev/null && sleep 10 && kill -KILL -- -"$pid" 2>/dev/null) &
  local watchdog=$!
  wait "$pid" || rc=$?
  pkill -P "$watchdog" sleep 2>/dev/null || true
  kill "$watchdog" 2>/dev/null || true
  return "$rc"
}
failed() { cat "$1" >&2; die "$2 failed or ran past --run-timeout ${run_timeout}s (log: $1)"; }

# The recipe, spelled the same on both sides (torchvision's flag names).
recipe=(--arch resnet18 --epochs "$epochs" --batch-size 32 --lr 0.05 --momentum 0.9 --weight-decay 5e-5
  --norm-weight-decay 0 --label-smoothing 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0
  --lr-warmup-epochs 2 --lr-warmup-decay 0.01 --train-crop-size 32 --val-resize-size 32 --val-crop-size 32
  --auto-augment ta_wide --random-erase 0.1 --model-ema --model-ema-steps 8 --model-ema-decay 0.999
  --ra-sampler --ra-reps 2 --workers 1 --threads 1)
ours=(--head fc --normalize imagenet --optimizer sgd --lr-scheduler cosineannealinglr --no-sync-bn)

for s in $(seq 1 "$seeds"); do
  t0=$(date +%s.%N)
  limited mpirun -np 2 --bind-to none "$rd" --data "$data" "${recipe[@]}" "${ours[@]}" --seed "$s" \
    --output-dir "$work/rd_$s" --resume none >"$work/rd_$s.log" 2>&1 || failed "$work/rd_$s.log" "resnet_ddp (seed $s)"
  t1=$(date +%s.%N)
  limited "$python" "$here/pytorch_imagenet_recipe.py" --launch 2 --data "$data" "${recipe[@]}" --seed "$s" \
    >"$work/pt_$s.log" 2>&1 || failed "$work/pt_$s.log" "pytorch_imagenet_recipe.py (seed $s)"
  t2=$(date +%s.%N)
  echo "$s $(echo "$t1 - $t0" | bc) $(echo "$t2 - $t1" | bc)" >>"$work/times"
done

python3 - "$work" "$seeds" <<'PY'
import csv, json, statistics, sys
work, seeds = sys.argv[1], int(sys.argv[2])
times = {int(l.split()[0]): (float(l.split()[1]), float(l.split()[2])) for l in open(f"{work}/times")}
rows = {"resnet_ddp": [], "pytorch": []}
for s in range(1, seeds + 1):
    last = list(csv.DictReader(open(f"{work}/rd_{s}/metrics.csv")))[-1]
    rows["resnet_ddp"].append((100 * float(last["val_acc"]), 100 * float(last["ema_val_acc"]), times[s][0]))
    for line in open(f"{work}/pt_{s}.log"):
        if line.startswith("RESULT_JSON "):
            e = json.loads(line[12:])["epochs"][-1]
            rows["pytorch"].append((e["acc1"], e["ema_acc1"], times[s][1]))
print("| side | top-1 per seed (%) | mean ± sd | EMA top-1 mean ± sd | wall s per run (mean) |")
print("|---|---|---|---|---|")
for side, r in rows.items():
    a, e, t = zip(*r)
    sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0
    print(f"| {side} | {', '.join(f'{x:.2f}' for x in a)} | {statistics.mean(a):.2f} ± {sd(a):.2f} | "
          f"{statistics.mean(e):.2f} ± {sd(e):.2f} | {statistics.mean(t):.1f} |")
print(f"speed: resnet_ddp {statistics.mean(t for *_, t in rows['pytorch']) / statistics.mean(t for *_, t in rows['resnet_ddp']):.2f}x PyTorch (wall time)")
PY
