#!/usr/bin/env bash
# Packet loss and latency on the link (netem loss 1% delay 2ms, both directions of host
# mh2's link; where the kernel lacks sch_netem, tests/multihost/mh_delay.py does the
# same in user space, or failing that iptables drops 1% with no delay): a
# deterministic 2-host run completes with metrics and checkpoint bit-identical to the
# clean run over the same hosts.
set -euo pipefail
# shellcheck source=tests/multihost/harness.sh
source "$(dirname "$0")/harness.sh"
: "${RD_MH_RESNET_DDP:?}"
mh_start 2 170
d=$MH_DIR
mh_synth "$d/data" 96 32
args=(--data "$d/data" "${MH_TINY[@]}" --epochs 2)

t0=$SECONDS
mh_mpirun 1 -np 2 --map-by node "$MH_BIN" "${args[@]}" --output-dir "$d/clean" >"$d/clean.log" 2>&1 ||
  { cat "$d/clean.log"; mh_fail "clean run"; }
mh_log "clean: $((SECONDS - t0)) s"

rtt_clean=$(mh_rtt_us 1 2)
mh_impair 2 1 2 || mh_skip "no way to drop packets here (no sch_netem, no iptables)"
rtt=$(mh_rtt_us 1 2)
mh_log "impairment: $MH_IMPAIRED; TCP connect round trip mh1->mh2 ${rtt_clean} us clean, ${rtt} us now"
# 2 ms each way: a round trip of at least 4 ms (unless only loss could be had).
if [[ $MH_IMPAIRED != *"no delay"* ]] && ((rtt < 4000)); then mh_fail "round trip ${rtt} us < 4 ms: no delay"; fi
t0=$SECONDS
mh_mpirun 1 -np 2 --map-by node "$MH_BIN" "${args[@]}" --output-dir "$d/lossy" >"$d/lossy.log" 2>&1 ||
  { cat "$d/lossy.log"; mh_fail "run under $MH_IMPAIRED"; }
mh_log "under $MH_IMPAIRED: $((SECONDS - t0)) s"
# The impairment was in the path: it saw the run's packets and dropped some of them.
read -r sent dropped < <(mh_impair_counters 2)
((sent > 200)) || mh_fail "only $sent packets went through the impaired link"
((dropped > 0)) || mh_fail "no packet was dropped out of $sent"
mh_impair_clear 2

grep -q '^rank 1/2: .* on node mh2,' "$d/lossy.log" || { cat "$d/lossy.log"; mh_fail "rank 1 not on mh2"; }
[[ $(mh_metrics "$d/lossy.log" | grep -c .) -ge 7 ]] || { cat "$d/lossy.log"; mh_fail "metric lines missing"; }
diff <(mh_metrics "$d/clean.log") <(mh_metrics "$d/lossy.log") >&2 || mh_fail "metrics differ under $MH_IMPAIRED"
mh_same_checkpoints "$d/clean/last.h5" "$d/lossy/last.h5" || mh_fail "last.h5 differs under $MH_IMPAIRED"
mh_log "PASS: bit-identical under $MH_IMPAIRED ($sent packets, $dropped dropped)"
