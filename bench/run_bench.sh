#!/bin/bash
# `make bench`: the whole performance suite, resnet_ddp side by side with PyTorch in
# the same run on the same machine. Writes
#   bench/results.json   every figure (median, min, max of the runs), machine, load
#   bench/results.md     the Markdown table docs/performance.md shows
#   bench/results_*.png  gnuplot plots
#   bench/results.raw/   the raw output of every program run
#
#   bench/run_bench.sh [--quick] [--build-dir DIR] [--only SECTIONS] [--runs N]
#                      [--epoch-runs N] [--torch debian|pypi] [--isa-caps LIST]
#
#   --quick        fewer runs and a shortened epoch (under 5 minutes); the table says so
#   --build-dir    where resnet_ddp and build/bench/* are (default: build/)
#   --only         comma list of sections: step,epoch,ddp,loader (default: all;
#                  the summary keeps earlier sections' raw results)
#   --runs N       timed steps per train-step figure (default 5 full, 3 quick)
#   --epoch-runs N recipe epochs per framework (default 1 full: ~8 min each on 2 busy
#                  cores; 2 quick)
#   --torch WHICH  the PyTorch to compare with: debian (python3-torch 1.13, default) or
#                  pypi (torch 2.15 as users install it today, in a venv that
#                  bench/torch_pypi_venv.sh creates on first use; `make bench TORCH=pypi`)
#   --isa-caps L   also time the train step with the CPU capped to each ISA in the comma
#                  list (oneDNN names: AVX2, AVX512_CORE, AVX512_CORE_BF16, ...), both
#                  frameworks capped alike (DNNL_MAX_CPU_ISA / ONEDNN_MAX_CPU_ISA /
#                  ATEN_CPU_CAPABILITY); default AVX2,AVX512_CORE in full mode, none quick
#
# Sections: (1) train step img/s vs PyTorch (channels-last, its fastest CPU eager mode),
# equal threads, fp32 and bf16, natively and per ISA cap; (2) the reference
# recipe's epoch, 2 ranks, vs bench/pytorch_reference_recipe.py --launch 2, with its
# train / validation / data-wait split and peak RSS per rank; (3) DDP exposed
# communication, overlap on/off, bucket sweep, 1 vs 2 ranks; (4) loader img/s per
# core vs torchvision. The Dataset_2-shaped JPEG set is generated once into
# data/synth_bench/dataset2 and reused.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build_dir=$root/build
quick=0
only="step,epoch,ddp,loader"
runs=""
epoch_runs=""
torch_which=debian
isa_caps=default
python=${RD_TORCH_PYTHON:-/usr/bin/python3}

die() { echo "run_bench.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; shift ;;
    --build-dir) [ $# -ge 2 ] || die "--build-dir needs a value"; build_dir=$(cd "$2" 2>/dev/null && pwd) ||
      die "--build-dir '$2': no such directory"; shift 2 ;;
    --only) [ $# -ge 2 ] || die "--only needs a value"; only=$2; shift 2 ;;
    --runs) [ $# -ge 2 ] || die "--runs needs a value"; runs=$2; shift 2 ;;
    --epoch-runs) [ $# -ge 2 ] || die "--epoch-runs needs a value"; epoch_runs=$2; shift 2 ;;
    --torch) [ $# -ge 2 ] || die "--torch needs a value"; torch_which=$2; shift 2 ;;
    --isa-caps) [ $# -ge 2 ] || die "--isa-caps needs a value"; isa_caps=$2; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
for s in ${only//,/ }; do
  case "$s" in step|epoch|ddp|loader) ;; *) die "--only: unknown section '$s' (step, epoch, ddp, loader)" ;; esac
done
want() { [[ ",$only," == *",$1,"* ]]; }
case "$torch_which" in
  debian) ;;
  pypi) python=$("$here/torch_pypi_venv.sh") || die "--torch pypi: no PyPI torch (see above)" ;;
  *) die "--torch '$torch_which': expected debian or pypi" ;;
esac
[ "$isa_caps" = default ] && isa_caps=$([ $quick = 1 ] && echo "" || echo "AVX2,AVX512_CORE")
for cap in ${isa_caps//,/ }; do
  case "$cap" in AVX2|AVX512_CORE|AVX512_CORE_VNNI|AVX512_CORE_BF16|AVX512_CORE_AMX) ;;
    *) die "--isa-caps: unknown ISA '$cap' (AVX2, AVX512_CORE, AVX512_CORE_VNNI, AVX512_CORE_BF16, AVX512_CORE_AMX)" ;;
  esac
done
if [ -z "$runs" ]; then runs=$([ $quick = 1 ] && echo 3 || echo 5); fi
[[ "$runs" =~ ^[0-9]+$ ]] && [ "$runs" -ge 1 ] || die "--runs '$runs': expected a positive integer"
if [ -z "$epoch_runs" ]; then epoch_runs=$([ $quick = 1 ] && echo 2 || echo 1); fi
[[ "$epoch_runs" =~ ^[0-9]+$ ]] && [ "$epoch_runs" -ge 1 ] ||
  die "--epoch-runs '$epoch_runs': expected a positive integer"

# --- prerequisites, each with the command that fixes it -------------------------
rd=$build_dir/resnet_ddp
for exe in "$rd" "$build_dir/bench/train_step_bench" "$build_dir/bench/loader_bench" \
           "$build_dir/bench/ddp_overhead_bench"; do
  [ -x "$exe" ] || die "$exe not found: build first (make, or cmake --build $build_dir)"
done
[ -x "$python" ] || die "$python not found: the PyTorch side needs Debian's python3-torch (make deps)"
"$python" -c "import torch, torchvision" 2>/dev/null ||
  die "$python cannot import torch/torchvision: install python3-torch python3-torchvision (make deps)"
[ -x /usr/bin/time ] || die "/usr/bin/time not found (peak RSS): apt-get install time"
command -v mpirun >/dev/null || die "mpirun not found: apt-get install openmpi-bin (make deps)"
command -v gnuplot >/dev/null || echo "run_bench.sh: gnuplot not found, no plots (apt-get install gnuplot-nox)" >&2

cores=$(nproc 2>/dev/null || echo 2)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun_cmd=(mpirun --oversubscribe --bind-to none)
raw=$here/results.raw
mkdir -p "$raw"
t_start=$(date +%s)
say() { printf '== [%4ss] %s\n' "$(( $(date +%s) - t_start ))" "$*" >&2; }
# One line per section boundary: when, what, the 1-minute load average.
loadlog() { echo "$(date +%s) $1 $(cut -d' ' -f1-3 /proc/loadavg)" >> "$raw/load.txt"; }

{
  echo "quick=$quick"
  echo "runs=$runs"
  echo "cores=$cores"
  echo "cpu_model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "cpu_flags_bf16=$(grep -m1 -o -w 'avx512_bf16' /proc/cpuinfo || echo no)"
  echo "mem_total_kb=$(awk '/MemTotal/ {print $2}' /proc/meminfo)"
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git_commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "torch_version=$("$python" -c 'import torch; print(torch.__version__)')"
  echo "torch_cpu_capability=$("$python" -c 'import torch; print(torch.backends.cpu.get_cpu_capability())' 2>/dev/null || echo unknown)"
  echo "isa_caps=$isa_caps"
  echo "mpi_version=$(mpirun --version 2>/dev/null | head -1)"
  echo "build_dir=$build_dir"
} > "$raw/machine.txt"
# What else was running: the benchmarks share the machine with other jobs.
ps -eo pcpu,etime,comm --sort=-pcpu 2>/dev/null | head -12 > "$raw/top_at_start.txt" || true
loadlog start

# --- (1) train step ---------------------------------------------------------------
# One config, both frameworks back to back (same machine load). $1: ISA cap or "native";
# $2: ARCH:SIZE:BATCH; $3: precision. The cap reaches oneDNN 2.6 (resnet_ddp, Debian's
# torch), oneDNN 3.x (PyPI torch) and PyTorch's own kernels alike.
step_pair() {
  local cap=$1 cfg=$2 precision=$3 tag env=()
  tag=${cfg//:/_}
  [ "$precision" = fp32 ] || tag=${precision}_$tag
  [ "$cap" = native ] || { tag=isa-${cap}_$tag; env=(DNNL_MAX_CPU_ISA="$cap" ONEDNN_MAX_CPU_ISA="$cap"
    ATEN_CPU_CAPABILITY="$( [ "$cap" = AVX2 ] && echo avx2 || echo avx512 )"); }
  loadlog "step_$tag"
  say "train step $cfg $precision ($cap), $cores threads, $steps timed steps: resnet_ddp, then PyTorch"
  env "${env[@]}" OMP_NUM_THREADS=$cores "$build_dir/bench/train_step_bench" --config "$cfg" \
    --threads "$cores" --steps "$steps" --warmup "$warmup" --precision "$precision" > "$raw/step_rd_$tag.json"
  env "${env[@]}" OMP_NUM_THREADS=$cores "$python" "$here/pytorch_train_step.py" --config "$cfg" \
    --threads "$cores" --steps "$steps" --warmup "$warmup" --precision "$precision" --channels-last \
    --isa "$cap" > "$raw/step_pt_$tag.json"
}
# bf16 where this CPU (or the cap) has bf16 instructions: resnet_ddp's backend says.
has_bf16() { env ${1:+DNNL_MAX_CPU_ISA=$1} "$build_dir/bench/train_step_bench" --print-isa | grep -q bf16=1; }
if want step; then
  rm -f "$raw"/step_*.json
  # Quick mode keeps the configs but times fewer steps.
  steps=$runs
  warmup=1
  for cap in native ${isa_caps//,/ }; do
    for cfg in resnet18:64:32 resnet34:244:16 resnet50:224:16; do
      step_pair "$cap" "$cfg" fp32
    done
    if has_bf16 "$( [ "$cap" = native ] || echo "$cap" )"; then
      for cfg in resnet18:64:32 resnet34:244:16; do step_pair "$cap" "$cfg" bf16; done
    else
      say "train step bf16 ($cap): skipped (no AVX512-BF16 or AMX)"
    fi
  done
  loadlog step_end
fi

# --- the Dataset_2-shaped JPEG set (generated once) ---------------------------------
dataset=$root/data/synth_bench/dataset2
if want epoch || want loader; then
  if [ ! -f "$dataset/.complete" ]; then
    say "generating the Dataset_2-shaped set (1322/363 JPEGs, C0 C2 C4) in $dataset"
    rm -rf "$dataset"
    mkdir -p "$(dirname "$dataset")"
    "$rd" synth --out "$dataset" --train 1322 --val 363 > "$raw/synth.log"
    touch "$dataset/.complete"
  fi
fi

# --- (2) the reference recipe's epoch, 2 ranks, + peak RSS ----------------------------
if want epoch; then
  rm -rf "$raw"/epoch_*
  if [ $quick = 1 ]; then
    # Shortened epoch: 5 steps of training at 128 px, full validation at 128 px.
    epoch_flags=(--image-size 128 --max-steps 5)
  else
    epoch_flags=()
  fi
  echo "${epoch_flags[*]:-}" > "$raw/epoch_flags.txt"
  # Peak RSS two ways: /usr/bin/time -v (largest process, whole run) and sampled per
  # process up to the epoch's "Time:" line, before resnet_ddp writes its checkpoints
  # (the PyTorch script writes none).
  rss_watch=(/usr/bin/python3 "$here/rss_watch.py" --marker 'Epoch 1/1\) Time:')
  for i in $(seq 1 "$epoch_runs"); do
    loadlog "epoch_rd_$i"
    say "epoch run $i/$epoch_runs: mpirun -np 2 resnet_ddp --epochs 1 ${epoch_flags[*]:-}"
    out=$raw/epoch_rd_$i
    mkdir -p "$out"
    /usr/bin/time -v -o "$out/time.txt" "${rss_watch[@]}" --out "$out/rss.json" -- \
      "${mpirun_cmd[@]}" -np 2 "$rd" --data "$dataset" --epochs 1 \
      --output-dir "$out/model" --resume none --progress none --log-every 0 "${epoch_flags[@]}" \
      > "$out/log.txt" 2>&1 || die "resnet_ddp epoch failed, see $out/log.txt"
    loadlog "epoch_pt_$i"
    say "epoch run $i/$epoch_runs: pytorch_reference_recipe.py --launch 2 --epochs 1 ${epoch_flags[*]:-}"
    out=$raw/epoch_pt_$i
    mkdir -p "$out"
    /usr/bin/time -v -o "$out/time.txt" "${rss_watch[@]}" --out "$out/rss.json" -- \
      "$python" "$here/pytorch_reference_recipe.py" --launch 2 \
      --data "$dataset" --epochs 1 --port $((29500 + RANDOM % 400)) --output-dir "$out/model" "${epoch_flags[@]}" \
      > "$out/log.txt" 2>&1 || die "PyTorch recipe failed, see $out/log.txt"
  done
  loadlog epoch_end
fi

# --- (3) DDP overhead ------------------------------------------------------------------
if want ddp; then
  rm -f "$raw"/ddp_*.txt
  # ResNet-18 at 64 px, batch 8, 1 thread per rank: little compute per byte of
  # gradient, so communication is as visible as it gets here.
  ddp_common=(--arch resnet18 --batch 8 --pixels 64 --threads 1 --steps "$([ $quick = 1 ] && echo 2 || echo 4)")
  ddp_reps=$([ $quick = 1 ] && echo 1 || echo 3)
  buckets=(25)
  [ $quick = 1 ] || buckets=(1 4 25 100)
  for rep in $(seq 1 "$ddp_reps"); do
    for mb in "${buckets[@]}"; do
      loadlog "ddp_np2_b${mb}_$rep"
      say "DDP overhead, 2 ranks, bucket $mb MB (repeat $rep/$ddp_reps)"
      "${mpirun_cmd[@]}" -np 2 "$build_dir/bench/ddp_overhead_bench" "${ddp_common[@]}" --bucket-mb "$mb" \
        > "$raw/ddp_np2_b${mb}_$rep.txt" 2>&1 || die "ddp_overhead_bench failed, see $raw/ddp_np2_b${mb}_$rep.txt"
    done
    loadlog "ddp_np1_$rep"
    say "DDP overhead, 1 rank (weak-scaling baseline, repeat $rep/$ddp_reps)"
    "${mpirun_cmd[@]}" -np 1 "$build_dir/bench/ddp_overhead_bench" "${ddp_common[@]}" --bucket-mb 25 \
      > "$raw/ddp_np1_b25_$rep.txt" 2>&1 || die "ddp_overhead_bench failed, see $raw/ddp_np1_b25_$rep.txt"
  done
  loadlog ddp_end
fi

# --- (4) loader -------------------------------------------------------------------------
if want loader; then
  rm -f "$raw"/loader_*.txt
  loader_images=$([ $quick = 1 ] && echo 192 || echo 512)
  loader_reps=$([ $quick = 1 ] && echo 2 || echo 3)
  for rep in $(seq 1 "$loader_reps"); do
    loadlog "loader_$rep"
    say "loader, 1 worker, $loader_images images, JPEG / .h5 / torchvision (repeat $rep/$loader_reps)"
    "$build_dir/bench/loader_bench" --data "$dataset" --workers 1 --images "$loader_images" --image-size 244 \
      --torchvision > "$raw/loader_$rep.txt" 2>&1 || die "loader_bench failed, see $raw/loader_$rep.txt"
  done
  loadlog loader_end
fi

loadlog end
say "summarising"
/usr/bin/python3 "$here/summarize.py" --raw "$raw" --json "$here/results.json" --md "$here/results.md" \
  --plots "$here"
say "done: $here/results.json, $here/results.md, $here/results_*.png"
