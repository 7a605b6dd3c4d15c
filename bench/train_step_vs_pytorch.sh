#!/bin/bash
# One training step (fwd + bwd + Adam, fp32) of resnet_ddp next to PyTorch with the
# same model, input size, batch and threads; prints img/s, GFLOP/s and the ratio.
#
#   bench/train_step_vs_pytorch.sh [--build-dir DIR] [--config ARCH:SIZE:BATCH]...
#                                  [--threads T] [--steps N] [--warmup N] [--json FILE]
#
# Defaults: build/, configs resnet34:244:16 and resnet18:64:32, threads = nproc,
# 3 timed steps after 1 warm-up (ResNet-34 at 244 px runs ~5 img/s on 2 cores, so
# the default run takes about a minute). Each config runs resnet_ddp, then PyTorch,
# back to back, so both see the same machine load.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build_dir=${BUILD_DIR:-$here/../build}
python=${RD_TORCH_PYTHON:-/usr/bin/python3}
threads=$(nproc 2>/dev/null || echo 2)
steps=3
warmup=1
json_out=""
configs=()

die() { echo "train_step_vs_pytorch.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) [ $# -ge 2 ] || die "--build-dir needs a value"; build_dir=$2; shift 2 ;;
    --config) [ $# -ge 2 ] || die "--config needs a value"; configs+=("$2"); shift 2 ;;
    --threads) [ $# -ge 2 ] || die "--threads needs a value"; threads=$2; shift 2 ;;
    --steps) [ $# -ge 2 ] || die "--steps needs a value"; steps=$2; shift 2 ;;
    --warmup) [ $# -ge 2 ] || die "--warmup needs a value"; warmup=$2; shift 2 ;;
    --json) [ $# -ge 2 ] || die "--json needs a value"; json_out=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ ${#configs[@]} -gt 0 ] || configs=(resnet34:244:16 resnet18:64:32)
for n in "$threads" "$steps" "$warmup"; do
  [[ "$n" =~ ^[0-9]+$ ]] || die "--threads/--steps/--warmup must be non-negative integers (got '$n')"
done
[ "$threads" -ge 1 ] && [ "$steps" -ge 1 ] || die "--threads and --steps must be >= 1"

bench=$build_dir/bench/train_step_bench
[ -x "$bench" ] || die "$bench not found: build first (make, or cmake --build $build_dir --target train_step_bench)"
[ -x "$python" ] || die "$python not found: PyTorch's side needs Debian's python3-torch (make deps)"
"$python" -c "import torch, torchvision" 2>/dev/null ||
  die "$python cannot import torch/torchvision: install Debian's python3-torch python3-torchvision (make deps)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
i=0
for cfg in "${configs[@]}"; do
  common=(--config "$cfg" --threads "$threads" --steps "$steps" --warmup "$warmup")
  echo "== $cfg, $threads threads: resnet_ddp ..." >&2
  OMP_NUM_THREADS=$threads "$bench" "${common[@]}" > "$tmp/rd_$i.json"
  echo "== $cfg, $threads threads: PyTorch ..." >&2
  OMP_NUM_THREADS=$threads "$python" "$here/pytorch_train_step.py" "${common[@]}" > "$tmp/pt_$i.json"
  i=$((i + 1))
done

"$python" - "$tmp" "$i" "$json_out" <<'EOF'
import json, sys
tmp, count, json_out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = []
for i in range(count):
    rd = json.load(open(f"{tmp}/rd_{i}.json"))
    pt = json.load(open(f"{tmp}/pt_{i}.json"))
    for a, b in zip(rd["results"], pt["results"]):
        rows.append({"arch": a["arch"], "image_size": a["image_size"], "batch": a["batch"],
                     "threads": rd["threads"], "resnet_ddp_img_per_s": a["img_per_s"],
                     "pytorch_img_per_s": b["img_per_s"], "resnet_ddp_gflops": a["gflops"],
                     "pytorch_gflops": b["gflops"], "gflop_per_step": a["gflop_per_step"],
                     "ratio": round(a["img_per_s"] / b["img_per_s"], 3),
                     # best step of each: less sensitive to other processes on a shared machine
                     "ratio_best": round(b["step_ms_min"] / a["step_ms_min"], 3),
                     "resnet_ddp_backend": rd["backend"], "pytorch_version": pt["version"]})
print(f"{'model':<10} {'size':>5} {'batch':>5} {'thr':>4} {'resnet_ddp img/s':>17} {'PyTorch img/s':>14} "
      f"{'rd GFLOP/s':>11} {'pt GFLOP/s':>11} {'ratio':>6} {'best':>6}")
for r in rows:
    print(f"{r['arch']:<10} {r['image_size']:>5} {r['batch']:>5} {r['threads']:>4} "
          f"{r['resnet_ddp_img_per_s']:>17.2f} {r['pytorch_img_per_s']:>14.2f} "
          f"{r['resnet_ddp_gflops']:>11.1f} {r['pytorch_gflops']:>11.1f} {r['ratio']:>5.2f}x "
          f"{r['ratio_best']:>5.2f}x")
print("one step = forward + backward + Adam (lr 1e-4), label-smoothed CE, fp32, reference head "
      "Linear-ReLU-Linear with 3 classes; img/s, GFLOP/s and ratio from the median step, 'best' "
      "from the fastest step of each; GFLOP/s counts conv+linear, backward = 2x forward")
if json_out:
    with open(json_out, "w") as f:
        json.dump(rows, f, indent=1)
EOF
