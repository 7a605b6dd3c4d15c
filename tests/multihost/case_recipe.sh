#!/usr/bin/env bash
# A short deterministic recipe run with 2 ranks on 2 namespace hosts (TCP over the veth
# link) gives exactly the metrics and checkpoint of the same 2 ranks on one host (shared
# memory), and the second host really ran a rank (its own hostname in the start-up lines).
set -euo pipefail
# shellcheck source=tests/multihost/harness.sh
source "$(dirname "$0")/harness.sh"
: "${RD_MH_RESNET_DDP:?}"
mh_start 2 170
d=$MH_DIR
mh_synth "$d/data" 96 32
args=(--data "$d/data" "${MH_TINY[@]}" --epochs 2)

t0=$SECONDS
mh_exec 1 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
  OMPI_MCA_btl_vader_single_copy_mechanism=none \
  mpirun --oversubscribe --bind-to none -np 2 "$MH_BIN" "${args[@]}" --output-dir "$d/one" \
  >"$d/one.log" 2>&1 || { cat "$d/one.log"; mh_fail "single-host run"; }
mh_log "single host: $((SECONDS - t0)) s"
t0=$SECONDS
mh_mpirun 1 -np 2 --map-by node "$MH_BIN" "${args[@]}" --output-dir "$d/two" >"$d/two.log" 2>&1 ||
  { cat "$d/two.log"; mh_fail "two-host run"; }
mh_log "two hosts: $((SECONDS - t0)) s"

if ! { grep -q '^rank 0/2: .* on node mh1,' "$d/one.log" && grep -q '^rank 1/2: .* on node mh1,' "$d/one.log"; }; then
  cat "$d/one.log"
  mh_fail "single-host run not on mh1 only"
fi
if ! { grep -q '^rank 0/2: .* on node mh1,' "$d/two.log" && grep -q '^rank 1/2: .* on node mh2,' "$d/two.log"; }; then
  cat "$d/two.log"
  mh_fail "two-host run not spread over mh1 and mh2"
fi
[[ $(mh_metrics "$d/two.log" | grep -c .) -ge 7 ]] || { cat "$d/two.log"; mh_fail "metric lines missing"; }
diff <(mh_metrics "$d/one.log") <(mh_metrics "$d/two.log") >&2 || mh_fail "metrics differ between one and two hosts"
mh_same_checkpoints "$d/one/last.h5" "$d/two/last.h5" || mh_fail "last.h5 differs between one and two hosts"
mh_log "PASS: 2 hosts == 1 host, bit for bit ($(mh_metrics "$d/two.log" | grep 'Val loss' | tail -n 1))"
