#!/bin/bash
# Per-op-type time split of one training step, resnet_ddp (bench/op_profile_bench.cpp,
# every Backend call timed) next to PyTorch (bench/pytorch_op_profile.py, torch.profiler
# self CPU time) on the same model, image size, batch, threads and precision. Prints a
# Markdown table (category, ms/step of each, ratio) and writes it to bench/op_profile.md.
#
#   bench/op_profile.sh [--build-dir DIR] [--config ARCH:SIZE:BATCH]... [--threads T]
#                       [--steps N] [--warmup N] [--precision fp32|bf16] [--out FILE]
#
# Defaults: build/, config resnet34:244:16, threads = nproc, 5 profiled steps after
# 2 warm-up, fp32, --out bench/op_profile.md. Each config runs resnet_ddp, then PyTorch,
# back to back, so both see the same machine load.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build_dir=${BUILD_DIR:-$here/../build}
python=${RD_TORCH_PYTHON:-/usr/bin/python3}
threads=$(nproc 2>/dev/null || echo 2)
steps=5
warmup=2
precision=fp32
out=$here/op_profile.md
configs=()

die() { echo "op_profile.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) [ $# -ge 2 ] || die "--build-dir needs a value"; build_dir=$2; shift 2 ;;
    --config) [ $# -ge 2 ] || die "--config needs a value"; configs+=("$2"); shift 2 ;;
    --threads) [ $# -ge 2 ] || die "--threads needs a value"; threads=$2; shift 2 ;;
    --steps) [ $# -ge 2 ] || die "--steps needs a value"; steps=$2; shift 2 ;;
    --warmup) [ $# -ge 2 ] || die "--warmup needs a value"; warmup=$2; shift 2 ;;
    --precision) [ $# -ge 2 ] || die "--precision needs a value"; precision=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a value"; out=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ ${#configs[@]} -gt 0 ] || configs=(resnet34:244:16)
for n in "$threads" "$steps" "$warmup"; do
  [[ "$n" =~ ^[0-9]+$ ]] || die "--threads/--steps/--warmup must be non-negative integers (got '$n')"
done
{ [ "$threads" -ge 1 ] && [ "$steps" -ge 1 ]; } || die "--threads and --steps must be >= 1"
case "$precision" in fp32|bf16) ;; *) die "--precision '$precision': expected fp32 or bf16" ;; esac

bench=$build_dir/bench/op_profile_bench
[ -x "$bench" ] || die "$bench not found: build first (cmake --build $build_dir --target op_profile_bench)"
[ -x "$python" ] || die "$python not found: PyTorch's side needs Debian's python3-torch (make deps)"
"$python" -c "import torch, torchvision" 2>/dev/null ||
  die "$python cannot import torch/torchvision: install Debian's python3-torch python3-torchvision (make deps)"
: > "$out" 2>/dev/null || die "--out '$out': cannot write"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
i=0
for cfg in "${configs[@]}"; do
  common=(--config "$cfg" --threads "$threads" --steps "$steps" --warmup "$warmup" --precision "$precision")
  echo "== $cfg, $threads threads, $precision: resnet_ddp ..." >&2
  OMP_NUM_THREADS=$threads "$bench" "${common[@]}" --json "$tmp/rd_$i.json" >&2
  echo "== $cfg, $threads threads, $precision: PyTorch ..." >&2
  OMP_NUM_THREADS=$threads "$python" "$here/pytorch_op_profile.py" "${common[@]}" --json "$tmp/pt_$i.json" >&2
  i=$((i + 1))
done

"$python" - "$tmp" "$i" "$out" <<'EOF'
import json, sys
tmp, count, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lines = []
def fmt(v):
    return f"{v:.2f}" if v < 10 else f"{v:.1f}"
for i in range(count):
    rd = json.load(open(f"{tmp}/rd_{i}.json"))
    pt = json.load(open(f"{tmp}/pt_{i}.json"))
    rd_ms = {c["key"]: c["ms"] for c in rd["categories"]}
    pt_ms = {c["key"]: c["ms"] for c in pt["categories"]}
    names = {c["key"]: c["name"] for c in rd["categories"]}
    rd_total, pt_total = sum(rd_ms.values()), sum(pt_ms.values())
    lines += [f"### {rd['arch']}:{rd['image_size']}:{rd['batch']}, {rd['threads']} threads, {rd['precision']}", "",
              f"resnet_ddp {rd['version']} ({rd['backend']}): {rd['step_ms']:.1f} ms/step "
              f"(mean of {rd['steps']}, best {rd['step_ms_min']:.1f}); "
              f"PyTorch {pt['version']}: {pt['step_ms']:.1f} ms/step unprofiled, "
              f"{pt['step_ms_profiled']:.1f} profiled (mean of {pt['steps']}). "
              f"Conv backward split for PyTorch: {pt['conv_bwd_split']}.", "",
              "| category | resnet_ddp ms | PyTorch ms | ratio (rd/pt) | rd % | pt % |",
              "|---|---:|---:|---:|---:|---:|"]
    for k in rd_ms:
        a, b = rd_ms[k], pt_ms.get(k, 0.0)
        ratio = f"{a / b:.2f}" if a > 0 and b > 0 else "–"
        lines.append(f"| {names[k]} | {fmt(a)} | {fmt(b)} | {ratio} | "
                     f"{100 * a / rd_total:.1f} | {100 * b / pt_total:.1f} |")
    lines.append(f"| **total** | **{rd_total:.1f}** | **{pt_total:.1f}** | **{rd_total / pt_total:.2f}** | 100 | 100 |")
    lines.append("")
lines.append("ratio < 1: resnet_ddp is faster. resnet_ddp: wall time of each Backend call; PyTorch: "
             "torch.profiler self CPU time mapped as bench/pytorch_op_profile.py's docstring says "
             "(its totals include the profiler's own overhead).")
text = "\n".join(lines) + "\n"
sys.stdout.write(text)
with open(out, "w") as f:
    f.write(text)
EOF
echo "written: $out" >&2
