#!/bin/bash
# One epoch of the tutorial's recipe as whole processes: `mpirun -np R resnet_ddp` next to
# bench/pytorch_reference_recipe.py --launch R (gloo), same model, size, batch, threads
# per rank, workers and data; prints each run's wall time (start-up, scan, training,
# validation, exit) and the epoch's own "Time:" line, then the medians and the ratio.
#
#   bench/recipe_epoch_vs_pytorch.sh [--build-dir DIR] [--arch A] [--image-size S]
#       [--train N] [--val N] [--ranks R] [--threads T] [--runs K]
#
# Defaults: the seed recipe's small epoch: resnet18 @244, batch 16, 2 ranks x 1 thread,
# AutoAugment, 192 train / 96 validation JPEGs (resnet_ddp synth), 3 runs each,
# alternating resnet_ddp and PyTorch so both see the same load. Both save the best model and
# evaluate it again at the end, as the tutorial does. PyTorch is
# $RD_TORCH_PYTHON (default: bench/torch_pypi_venv.sh's torch 2.15). An ISA cap applies
# to both when set in the environment (DNNL_MAX_CPU_ISA, ONEDNN_MAX_CPU_ISA,
# ATEN_CPU_CAPABILITY), e.g. AVX2 for Lonestar6's Milan nodes.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build_dir=$root/build
arch=resnet18 size=244 train=192 val=96 ranks=2 threads=1 runs=3

die() { echo "recipe_epoch_vs_pytorch.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir | --arch | --image-size | --train | --val | --ranks | --threads | --runs)
      [ $# -ge 2 ] || die "$1 needs a value" ;;&
    --build-dir) build_dir=$2 ;;
    --arch) arch=$2 ;;
    --image-size) size=$2 ;;
    --train) train=$2 ;;
    --val) val=$2 ;;
    --ranks) ranks=$2 ;;
    --threads) threads=$2 ;;
    --runs) runs=$2 ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift 2
done
for v in size train val ranks threads runs; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v//_/-} '${!v}': expected a positive integer"
done
rd=$build_dir/resnet_ddp
[ -x "$rd" ] || die "$rd not found (build first: make)"
python=${RD_TORCH_PYTHON:-}
if [ -z "$python" ]; then python=$("$here/torch_pypi_venv.sh") || die "no PyTorch (bench/torch_pypi_venv.sh)"; fi
"$python" -c 'import torch, torchvision' 2>/dev/null || die "$python cannot import torch and torchvision"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
data=$root/data/synth_bench/epoch_${train}_${val}
if [ ! -d "$data/Train" ]; then
  "$rd" synth --out "$data" --train "$train" --val "$val" >/dev/null || die "resnet_ddp synth failed"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--arch "$arch" --image-size "$size" --batch-size 16 --epochs 1 --workers 1 --threads "$threads")

# Runs a command; prints "WALL EPOCH": its wall seconds and the epoch's own seconds
# (resnet_ddp: metrics.csv's time_s; PyTorch: its RESULT_JSON's epoch_s).
timed() {
  local log=$1 metrics=$2; shift 2
  local t0 t1 epoch
  t0=$(date +%s.%N)
  "$@" >"$log" 2>&1 || { cat "$log" >&2; die "failed: $*"; }
  t1=$(date +%s.%N)
  epoch=$(python3 - "$log" "$metrics" <<'PY'
import csv, json, sys
log, metrics = sys.argv[1], sys.argv[2]
if metrics != "-":
    print(next(csv.DictReader(open(metrics)))["time_s"])
else:
    for line in open(log):
        if line.startswith("RESULT_JSON "):
            print(json.loads(line[12:])["epochs"][0]["epoch_s"])
            break
    else:
        print("nan")
PY
)
  echo "$(echo "$t1 - $t0" | bc -l) $epoch"
}

echo "recipe epoch: $arch @$size, batch 16/rank, $ranks ranks x $threads thread(s), $train/$val images," \
  "caps: DNNL_MAX_CPU_ISA=${DNNL_MAX_CPU_ISA:-none} ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-none}"
echo "torch: $("$python" -c 'import torch; print(torch.__version__)'); resnet_ddp: $(git -C "$root" rev-parse --short HEAD 2>/dev/null)"
printf '%-4s %-10s %8s %8s\n' run framework wall_s epoch_s
rd_wall=() pt_wall=() rd_epoch=() pt_epoch=()
for i in $(seq 1 "$runs"); do
  read -r w e < <(timed "$work/rd_$i.log" "$work/rd_out_$i/metrics.csv" mpirun --oversubscribe --bind-to none -np "$ranks" "$rd" --data "$data" \
    "${common[@]}" --output-dir "$work/rd_out_$i" --resume none --progress none --log-every 0)
  rd_wall+=("$w") rd_epoch+=("$e")
  printf '%-4s %-10s %8.1f %8.1f\n' "$i" resnet_ddp "$w" "$e"
  read -r w e < <(timed "$work/pt_$i.log" - "$python" "$here/pytorch_reference_recipe.py" --launch "$ranks" \
    --data "$data" "${common[@]}" --port $((29500 + RANDOM % 400)) --output-dir "$work/pt_out_$i")
  pt_wall+=("$w") pt_epoch+=("$e")
  printf '%-4s %-10s %8.1f %8.1f\n' "$i" pytorch "$w" "$e"
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
rw=$(median "${rd_wall[@]}") pw=$(median "${pt_wall[@]}") re=$(median "${rd_epoch[@]}") pe=$(median "${pt_epoch[@]}")
printf 'median whole process: resnet_ddp %.1f s, pytorch %.1f s: %.2fx\n' "$rw" "$pw" "$(echo "$pw / $rw" | bc -l)"
printf 'median epoch (its own timer): resnet_ddp %.1f s, pytorch %.1f s: %.2fx\n' "$re" "$pe" "$(echo "$pe / $re" | bc -l)"
