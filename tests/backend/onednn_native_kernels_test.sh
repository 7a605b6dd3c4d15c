#!/usr/bin/env bash
# The CPU backend's defaults must run on oneDNN kernels native to this CPU's ISA: a
# layout or algorithm oneDNN has no JIT kernel for falls to its reference code, 100x
# slower (nChw16c under the AVX2 cap: ResNet-34@244, 3 steps > 600 s). One training
# step of ResNet-18 (basic blocks) and ResNet-50 (bottlenecks) with the trainer's
# defaults, oneDNN's verbose log on; fails on any reference (`ref:`) or reference-gemm
# primitive. Run under DNNL_MAX_CPU_ISA caps by `make test-isa`.
#
#   onednn_native_kernels_test.sh TRAIN_STEP_BENCH
set -euo pipefail
bench=${1:?usage: onednn_native_kernels_test.sh TRAIN_STEP_BENCH}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "CPU backend here: $("$bench" --print-isa) (DNNL_MAX_CPU_ISA=${DNNL_MAX_CPU_ISA:-unset})"
precisions=(fp32)
"$bench" --print-isa | grep -q 'bf16=1' && precisions+=(bf16)
for precision in "${precisions[@]}"; do
  for cfg in resnet18:40:2 resnet50:40:2; do
    DNNL_VERBOSE=1 ONEDNN_VERBOSE=1 OMP_NUM_THREADS=1 "$bench" --config "$cfg" --threads 1 --steps 1 --warmup 0 \
      --precision "$precision" > "$log" 2>&1 || { cat "$log"; echo "FAIL: train_step_bench $cfg $precision"; exit 1; }
    # Execution lines: onednn_verbose,exec,cpu,<primitive>,<implementation>,...
    total=$(grep -Ec '^(dnnl|onednn)_verbose,exec,' "$log" || true)
    [ "$total" -gt 0 ] || { echo "FAIL: no oneDNN verbose lines (DNNL_VERBOSE not honoured?)"; exit 1; }
    ref=$(grep -E '^(dnnl|onednn)_verbose,exec,' "$log" | awk -F, '$5 ~ /(^|:)ref(:|$)|gemm:ref|ref_/' || true)
    impls=$(grep -E '^(dnnl|onednn)_verbose,exec,' "$log" | awk -F, '{print $4 ":" $5}' | sort | uniq -c | sort -rn | head -8)
    echo "$cfg $precision: $total primitive executions; implementations:"
    echo "$impls" | sed 's/^/    /'
    if [ -n "$ref" ]; then
      echo "FAIL: $cfg $precision ran oneDNN reference kernels:"
      echo "$ref" | awk -F, '{print "    " $4 " " $5 " " $7 " " $8}' | sort | uniq -c | head -20
      exit 1
    fi
  done
done
echo "PASS: no reference primitives"
