#!/usr/bin/env bash
# Exposed communication per step vs link bandwidth, bucket size and overlap (resnet_ddp
# --progress-thread on/off; without it, overlap relies on polling between layers), measured on
# two namespace test hosts (tests/multihost/harness.sh) with a token-bucket limit on the
# link between them. Not a ctest (it is a measurement): run as root from a build tree,
#   tools/multihost_bandwidth.sh [BUILD_DIR]      (default: build)
# Prints a Markdown table: per configuration the measured step parts (ms per step,
# averaged by resnet_ddp over the steps of one epoch) and the ring model's prediction
#   t_allreduce = 2(n-1)/n * bytes / bandwidth;  no overlap: exposed = t_allreduce;
#   progress thread: exposed = max(t_allreduce(last bucket), t_allreduce - t_backward)
# (the scaling model of docs/performance.md with efficiency 1).
# Knobs (environment): RATES ("none 10gbit 1gbit"), BUCKETS ("1 25 100"), ARCH (resnet18),
# IMAGE (32), BATCH (8), STEPS (6).
set -euo pipefail
BUILD=$(readlink -f "${1:-build}")
export RD_MH_RESNET_DDP=$BUILD/resnet_ddp
[[ -x $RD_MH_RESNET_DDP ]] || { echo "no $RD_MH_RESNET_DDP: build first" >&2; exit 1; }
# shellcheck source=tests/multihost/harness.sh
source "$(dirname "$0")/../tests/multihost/harness.sh"
RATES=${RATES:-none 10gbit 1gbit}
BUCKETS=${BUCKETS:-1 25 100}
ARCH=${ARCH:-resnet18} IMAGE=${IMAGE:-32} BATCH=${BATCH:-8} STEPS=${STEPS:-6}
mh_start 2 3000
d=$MH_DIR
mh_synth "$d/data" $((2 * BATCH * STEPS)) 8

# rate in bit/s from tc's notation
bits() { case $1 in *gbit) echo $((${1%gbit} * 1000000000)) ;; *mbit) echo $((${1%mbit} * 1000000)) ;; *) echo 0 ;; esac; }

echo "| link | bucket MiB | progress thread | step ms | backward ms | exposed comm ms | model: exposed ms |"
echo "|---|---:|---|---:|---:|---:|---:|"
for rate in $RATES; do
  mh_qdisc 2 clear
  if [[ $rate != none ]]; then
    # burst: at least one 64 KiB GSO segment plus a timer tick's worth of bytes
    burst=$(( $(bits "$rate") / 8 / 250 + 65536 ))
    mh_qdisc 2 tbf rate "$rate" burst "$burst" latency 100ms
  fi
  for bucket in $BUCKETS; do
    for overlap in off on; do
      extra=()
      [[ $overlap == on ]] && extra=(--progress-thread)
      log=$d/run.log
      mh_mpirun 1 -np 2 --map-by node "$MH_BIN" --data "$d/data" --arch "$ARCH" --image-size "$IMAGE" \
        --batch-size "$BATCH" --threads 1 --workers 1 --epochs 1 --max-steps "$STEPS" --log-every 0 \
        --bucket-mb "$bucket" "${extra[@]}" --resume none --output-dir "$d/out" >"$log" 2>&1 ||
        { cat "$log" >&2; mh_fail "run failed ($rate, bucket $bucket, overlap $overlap)"; }
      params=$(grep -o '[0-9.]*M parameters' "$log" | head -n 1 | cut -d M -f 1)
      line=$(grep -m 1 'Step time:' "$log")
      awk -v line="$line" -v rate="$(bits "$rate")" -v link="$rate" -v bucket="$bucket" \
        -v overlap="$overlap" -v params="$params" 'BEGIN {
          n = split(line, w, " ")
          for (k = 1; k <= n; k++) {
            if (w[k] == "time:") step = w[k + 1]
            if (w[k] == "backward") bwd = w[k + 1]
            if (w[k] == "comm") comm = w[k + 1]
          }
          model = "-"
          if (rate > 0) {
            bytes = params * 1e6 * 4
            ar = 1e3 * bytes * 8 / rate                        # 2(n-1)/n = 1 for n = 2
            last = 1e3 * (bytes < bucket * 1048576 ? bytes : bucket * 1048576) * 8 / rate
            model = (overlap == "off") ? ar : ((ar - bwd > last) ? ar - bwd : last)
            model = sprintf("%.1f", model)
          }
          printf "| %s | %s | %s | %s | %s | %s | %s |\n", (link == "none" ? "unlimited" : link),
            bucket, overlap, step, bwd, comm, model
        }'
    done
  done
done
mh_qdisc 2 clear
echo
echo "($ARCH @ ${IMAGE} px, batch $BATCH per rank, 2 ranks on 2 namespace hosts, 1 thread each," \
  "${params}M parameters = $(awk -v p="$params" 'BEGIN { printf "%.1f", p * 4e6 / 1048576 }') MiB of gradients," \
  "mean of $STEPS steps incl. the first)"
