# shellcheck shell=bash
# Test hosts on one machine (label `multihost`): each host is a long-lived process holding
# its own network namespace (a veth link into a bridge), hostname (UTS namespace) and
# node-local /tmp (mount namespace, a per-host directory bound on /tmp; /etc/hosts is bound
# to the harness's hosts file so every host resolves the others by name). Commands run
# inside a host through `nsenter`; Open MPI reaches the other hosts through mh_agent.sh, a
# plm_rsh_agent that enters the target host in place of ssh. Traffic between hosts crosses
# a real network stack (veth + bridge), where `ip link` and `tc` inject faults.
#
# Usage from a case script (bash, sourced):
#   source "$(dirname "$0")/harness.sh"
#   mh_start 3 300            # 3 hosts; skip (exit 77) if impossible; budget in seconds
#   mh_exec 1 CMD...          # run CMD inside host 1 (hostnames: mh1, mh2, ...)
#   mh_mpirun 1 -np 3 PROG... # mpirun from host 1, one rank per host, TCP over the links
#   mh_link 2 down|up         # host 2's link (the bridge end of its veth)
#   mh_qdisc 2 tbf rate 1gbit ...  # egress qdisc, both ends of host 2's link
#   mh_impair 2 1 2           # loss 1% + delay 2 ms on host 2's link (netem, or iptables loss)
# Teardown (every process inside the hosts, the holders, the bridge namespace, the state
# directory) runs on every exit path; leftovers of a killed harness (same prefix, dead
# owner) are removed at the next start. RD_MH_KEEP=1 keeps the state dir.

MH_PREFIX=rdmh
MH_SUBNET=10.77.0
MH_CIDR=$MH_SUBNET.0/24
MH_ID=""      # rdmh-<harness pid>
MH_DIR=""     # state dir (not under /tmp: that is node-local inside the hosts)
MH_N=0
MH_HOLDERS=() # pid of each host's namespace holder, index 1..N
MH_CASE=$(basename "${BASH_SOURCE[1]:-$0}" .sh)
export MH_REPO
MH_REPO=$(readlink -f "$(dirname "${BASH_SOURCE[0]}")/../..")
MH_HERE=$(readlink -f "$(dirname "${BASH_SOURCE[0]}")")

mh_log() { printf '[%s %s] %s\n' "$MH_CASE" "$(date +%T.%N | cut -c1-12)" "$*" >&2; }
mh_fail() { mh_log "FAIL: $*"; exit 1; }
mh_skip() { echo "SKIP ($MH_CASE): $*"; exit 77; }

mh_check_prereqs() {
  [[ $(id -u) == 0 ]] || mh_skip "network namespaces need root (running as $(id -un))"
  local tool missing=()
  for tool in ip unshare nsenter tc mpirun; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  ((${#missing[@]} == 0)) || mh_skip "missing ${missing[*]} (iproute2, util-linux, openmpi-bin)"
  local probe=$MH_PREFIX-probe-$$
  if ! ip netns add "$probe" 2>/dev/null; then
    mh_skip "network namespaces unavailable (ip netns add failed: container without CAP_SYS_ADMIN?)"
  fi
  if ! ip -n "$probe" link add mhbr type bridge 2>/dev/null; then
    ip netns del "$probe" 2>/dev/null
    mh_skip "cannot create a bridge inside a network namespace (bridge module missing?)"
  fi
  ip netns del "$probe"
  unshare --net --uts --mount true 2>/dev/null || mh_skip "unshare --net --uts --mount fails here"
}

# The net namespace inode of a process ("net:[4026...]"), empty when it is gone.
mh_netns_of() { readlink "/proc/$1/ns/net" 2>/dev/null; }

# Kills every process in the network namespace of holder $1 (holder last), by pid.
mh_kill_ns() {
  local holder=$1 ns pid f _
  ns=$(mh_netns_of "$holder")
  [[ -n $ns ]] || return 0
  for _ in 1 2 3; do
    for f in /proc/[0-9]*/ns/net; do
      pid=${f#/proc/}
      pid=${pid%%/*}
      [[ $pid == "$holder" || $pid == "$$" || $pid == "$BASHPID" ]] && continue
      [[ $(readlink "$f" 2>/dev/null) == "$ns" ]] && kill -KILL "$pid" 2>/dev/null
    done
    sleep 0.1
  done
  kill -KILL "$holder" 2>/dev/null
}

# Leftovers of a previous harness that was killed (SIGKILL skips traps): holders are
# named "rdmh-<owner pid>-hN" (argv0; mh_delay.py forwarders "...-fwdN"), the bridge
# namespace "rdmh-<owner pid>".
mh_clean_leftovers() {
  local f pid argv0 owner ns
  for f in /proc/[0-9]*/cmdline; do
    pid=${f#/proc/}
    pid=${pid%%/*}
    argv0=$({ tr '\0' '\n' <"$f"; } 2>/dev/null | head -n 1) || continue
    [[ $argv0 =~ ^$MH_PREFIX-([0-9]+)-(h|fwd)[0-9]+$ ]] || continue
    owner=${BASH_REMATCH[1]}
    [[ -d /proc/$owner ]] && continue # its harness still runs
    mh_log "removing leftover host $argv0 (pid $pid)"
    mh_kill_ns "$pid"
  done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    [[ $ns =~ ^$MH_PREFIX-([0-9]+)$ ]] || continue
    [[ -d /proc/${BASH_REMATCH[1]} ]] && continue
    mh_log "removing leftover namespace $ns"
    ip netns del "$ns" 2>/dev/null
  done
  for f in "/var/tmp/$MH_PREFIX"-*; do
    [[ -d $f && $f =~ /$MH_PREFIX-([0-9]+)\.[A-Za-z0-9]+$ ]] || continue
    [[ -d /proc/${BASH_REMATCH[1]} ]] || rm -rf "$f"
  done
}

mh_teardown() {
  local rc=$?
  trap - EXIT INT TERM ERR
  set +e
  [[ -n ${MH_WATCHDOG:-} ]] && kill "$MH_WATCHDOG" 2>/dev/null
  local i
  if ((rc != 0 && rc != 77)) && [[ -n $MH_DIR ]]; then
    mh_log "exit status $rc"
  fi
  # (bash reports each killed holder on stderr: silenced)
  exec 3>&2 2>/dev/null
  [[ -n $MH_FORWARDER ]] && kill -KILL "$MH_FORWARDER"
  for ((i = 1; i <= MH_N; i++)); do
    [[ -n ${MH_HOLDERS[i]:-} ]] && mh_kill_ns "${MH_HOLDERS[i]}"
  done
  for ((i = 1; i <= MH_N; i++)); do
    [[ -n ${MH_HOLDERS[i]:-} ]] && wait "${MH_HOLDERS[i]}"
  done
  exec 2>&3 3>&-
  [[ -n $MH_ID ]] && ip netns del "$MH_ID" 2>/dev/null
  if [[ -n $MH_DIR && -d $MH_DIR ]]; then
    if [[ ${RD_MH_KEEP:-0} == 1 ]]; then mh_log "kept $MH_DIR"; else rm -rf "$MH_DIR"; fi
  fi
  exit "$rc"
}

# mh_start N BUDGET_SECONDS: create N hosts (mh1..mhN at $MH_SUBNET.1..N), arm teardown
# and a watchdog that ends the case (with teardown) after BUDGET_SECONDS.
mh_start() {
  local n=$1 budget=$2 i
  mh_check_prereqs
  mh_clean_leftovers
  MH_N=$n
  MH_ID=$MH_PREFIX-$$
  MH_DIR=$(mktemp -d "/var/tmp/$MH_ID.XXXXXX")
  chmod 755 "$MH_DIR"
  trap mh_teardown EXIT
  set -E
  trap 'mh_log "FAIL: \`$BASH_COMMAND\` failed (status $?) at ${BASH_SOURCE[0]}:$LINENO"' ERR
  trap 'mh_log "interrupted"; exit 130' INT
  trap 'mh_log "terminated (time budget or ctest timeout)"; exit 143' TERM
  local main_pid=$$
  (
    sleep "$budget" &
    sleeper=$!
    trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
    wait "$sleeper" && kill -TERM "$main_pid"
  ) 2>/dev/null &
  MH_WATCHDOG=$!

  {
    echo "127.0.0.1 localhost"
    for ((i = 1; i <= n; i++)); do echo "$MH_SUBNET.$i mh$i"; done
  } >"$MH_DIR/hosts"
  ip netns add "$MH_ID"
  ip -n "$MH_ID" link add br0 type bridge
  ip -n "$MH_ID" link set br0 up
  ip -n "$MH_ID" link set lo up
  # A checkout or build under /tmp (git clone . /tmp/x) must stay visible inside the
  # hosts, whose /tmp is their own: those directories are bound into it at the same path.
  local keep=() d
  for d in "$(readlink -f "$MH_HERE/../..")" "$(readlink -f "$PWD")"; do
    [[ $d == /tmp/* ]] && keep+=("${d#/tmp/}")
  done
  for ((i = 1; i <= n; i++)); do
    mkdir -p "$MH_DIR/h$i/tmp"
    chmod 1777 "$MH_DIR/h$i/tmp"
    # The holder: sets its hostname, binds its /tmp and /etc/hosts, then sleeps until
    # killed. --propagation private keeps the binds out of the root mount namespace.
    # shellcheck disable=SC2016 # positional parameters of the inner bash
    unshare --net --uts --mount --propagation private bash -c '
      host=$1 tmp=$2 hosts=$3 ready=$4 name=$5
      shift 5
      for rel; do mkdir -p "$tmp/$rel" && mount --bind "/tmp/$rel" "$tmp/$rel" || exit 1; done
      hostname "$host" && mount --rbind "$tmp" /tmp && mount --bind "$hosts" /etc/hosts &&
        ip link set lo up && touch "$ready" && exec -a "$name" sleep infinity' \
      holder "mh$i" "$MH_DIR/h$i/tmp" "$MH_DIR/hosts" "$MH_DIR/h$i/ready" "$MH_ID-h$i" "${keep[@]}" \
      </dev/null >"$MH_DIR/h$i/holder.log" 2>&1 &
    MH_HOLDERS[i]=$!
  done
  for ((i = 1; i <= n; i++)); do
    local t
    for ((t = 0; t < 100; t++)); do
      [[ -e $MH_DIR/h$i/ready ]] && break
      sleep 0.05
    done
    [[ -e $MH_DIR/h$i/ready ]] || mh_fail "host $i did not start: $(cat "$MH_DIR/h$i/holder.log")"
    ip -n "$MH_ID" link add "b$i" type veth peer name "e$i"
    ip -n "$MH_ID" link set "e$i" netns "${MH_HOLDERS[i]}"
    ip -n "$MH_ID" link set "b$i" master br0 up
    nsenter -t "${MH_HOLDERS[i]}" -n ip link set "e$i" name eth0
    nsenter -t "${MH_HOLDERS[i]}" -n ip addr add "$MH_SUBNET.$i/24" dev eth0
    nsenter -t "${MH_HOLDERS[i]}" -n ip link set eth0 up
  done
  for ((i = 1; i <= n; i++)); do
    [[ $(mh_exec "$i" hostname) == "mh$i" ]] || mh_fail "host $i has hostname $(mh_exec "$i" hostname)"
    mh_exec "$i" ip -br addr show eth0 | grep -q "$MH_SUBNET.$i/24" || mh_fail "host $i has no address"
  done
  # The rsh agent finds holders through this file: "hostname pid" lines.
  for ((i = 1; i <= n; i++)); do echo "mh$i ${MH_HOLDERS[i]}"; echo "$MH_SUBNET.$i ${MH_HOLDERS[i]}"; done \
    >"$MH_DIR/holders"
  mh_log "$n hosts up (${MH_ID}, $MH_CIDR, state $MH_DIR)"
}

# mh_exec I CMD...: CMD inside host I (its network, hostname, /tmp), environment inherited.
mh_exec() {
  local i=$1
  shift
  nsenter -t "${MH_HOLDERS[i]}" -n -u -m -- "$@"
}

# mh_pids I [NAME]: pids of processes running inside host I (not the holder), optionally
# only those whose executable's base name is NAME.
mh_pids() {
  local holder=${MH_HOLDERS[$1]} name=${2:-} ns f pid exe
  ns=$(mh_netns_of "$holder")
  [[ -n $ns ]] || return 0
  for f in /proc/[0-9]*/ns/net; do
    pid=${f#/proc/}
    pid=${pid%%/*}
    [[ $pid == "$holder" ]] && continue
    [[ $(readlink "$f" 2>/dev/null) == "$ns" ]] || continue
    if [[ -n $name ]]; then
      exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue
      [[ ${exe##*/} == "$name" ]] || continue
    fi
    echo "$pid"
  done
}

# mh_mpirun I MPIRUN_ARGS...: mpirun started inside host I, reaching the others through
# the namespace-entering agent, TCP over the veth subnet only (no shared memory).
mh_mpirun() {
  local i=$1
  shift
  local hosts="" k
  for ((k = 1; k <= MH_N; k++)); do hosts+="${hosts:+,}mh$k:4"; done
  MH_HOLDERS_FILE=$MH_DIR/holders \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
    mh_exec "$i" mpirun --host "$hosts" --bind-to none \
    --mca plm_rsh_agent "$MH_HERE/mh_agent.sh" \
    --mca btl tcp,self --mca btl_tcp_if_include "$MH_CIDR" --mca oob_tcp_if_include "$MH_CIDR" \
    "$@"
}

# mh_link I up|down: the bridge end of host I's link.
mh_link() { ip -n "$MH_ID" link set "b$1" "$2"; }

# mh_qdisc I clear | mh_qdisc I QDISC ARGS...: the egress qdisc of host I's eth0 and of
# the bridge end of its link (so both directions see it), e.g. `tbf rate 1gbit ...`.
mh_qdisc() {
  local i=$1
  shift
  if [[ $1 == clear ]]; then
    mh_exec "$i" tc qdisc del dev eth0 root 2>/dev/null || true
    ip netns exec "$MH_ID" tc qdisc del dev "b$i" root 2>/dev/null || true
    return 0
  fi
  mh_exec "$i" tc qdisc replace dev eth0 root "$@" &&
    ip netns exec "$MH_ID" tc qdisc replace dev "b$i" root "$@"
}

# mh_impair I LOSS_PERCENT DELAY_MS: packet loss and latency on both directions of host
# I's link. With sch_netem: `netem loss L% delay Dms` on both ends. Kernels without netem
# (some sandboxes): host I's veth is unplugged from the bridge and mh_delay.py forwards
# its frames to the bridge and back with the same loss and delay (offloads off on every
# host, so frames carry full checksums); failing that (no python3/ethtool), loss only
# through iptables' statistic match. MH_IMPAIRED says which. Returns 1 if none works.
MH_IMPAIRED=""
MH_FORWARDER=""
mh_impair() {
  local i=$1 loss=$2 delay=$3 err p k
  if err=$(mh_qdisc "$i" netem loss "$loss%" delay "${delay}ms" 2>&1); then
    MH_IMPAIRED="netem loss $loss% delay ${delay}ms"
    return 0
  fi
  mh_log "netem unavailable ($err)"
  if [[ -x /usr/bin/python3 ]] && command -v ethtool >/dev/null; then
    for ((k = 1; k <= MH_N; k++)); do
      mh_exec "$k" ethtool -K eth0 tx off tso off gso off gro off >/dev/null 2>&1 || true
    done
    ip -n "$MH_ID" link set "b$i" nomaster
    ip -n "$MH_ID" link add "f$i" type veth peer name "g$i"
    for k in "b$i" "f$i" "g$i"; do
      ip netns exec "$MH_ID" ethtool -K "$k" tx off tso off gso off gro off >/dev/null 2>&1 || true
    done
    ip -n "$MH_ID" link set "g$i" master br0 up
    ip -n "$MH_ID" link set "f$i" up
    rm -f "$MH_DIR/forwarder$i.stats"
    # Named like the holders (argv0), so a killed run's forwarder is found as a leftover.
    # shellcheck disable=SC2016 # positional parameters of the inner bash
    ip netns exec "$MH_ID" bash -c 'exec -a "$1" /usr/bin/python3 "${@:2}"' forwarder "$MH_ID-fwd$i" \
      "$MH_HERE/mh_delay.py" "b$i" "f$i" "$delay" "$loss" "$MH_DIR/forwarder$i.stats" \
      >"$MH_DIR/forwarder$i.log" 2>&1 &
    MH_FORWARDER=$!
    for ((k = 0; k < 100; k++)); do
      [[ -s $MH_DIR/forwarder$i.stats ]] && break
      sleep 0.05
    done
    if [[ -s $MH_DIR/forwarder$i.stats ]]; then
      MH_IMPAIRED="loss $loss% delay ${delay}ms each way (mh_delay.py: kernel without sch_netem)"
      return 0
    fi
    mh_log "mh_delay.py did not start: $(cat "$MH_DIR/forwarder$i.log")"
    mh_impair_clear "$i"
  fi
  command -v iptables >/dev/null || { mh_log "iptables missing too"; return 1; }
  p=$(awk -v l="$loss" 'BEGIN { printf "%.4f", l / 100 }')
  mh_exec "$i" iptables -A OUTPUT -o eth0 -m statistic --mode random --probability "$p" -j DROP || return 1
  mh_exec "$i" iptables -A INPUT -i eth0 -m statistic --mode random --probability "$p" -j DROP || return 1
  MH_IMPAIRED="iptables loss $loss% each way (no delay: kernel without sch_netem, no python3/ethtool)"
}

# mh_impair_counters I: "PACKETS DROPPED" seen by the impairment on host I's link.
mh_impair_counters() {
  local i=$1 stats
  if [[ $MH_IMPAIRED == netem* ]]; then
    stats=$(mh_exec "$i" tc -s qdisc show dev eth0; ip netns exec "$MH_ID" tc -s qdisc show dev "b$i")
    awk '/Sent/ { s += $4 } /dropped/ { for (k = 1; k <= NF; k++) if ($k == "(dropped") d += $(k + 1) }
         END { print s + 0, d + 0 }' <<<"$stats"
  elif [[ -n $MH_FORWARDER ]]; then
    cat "$MH_DIR/forwarder$i.stats"
  else
    # Packets through host I's eth0 (both directions) and the DROP rules' counters.
    local sent
    sent=$(mh_exec "$i" ip -s -j link show dev eth0 | python3 -c \
      'import json, sys; s = json.load(sys.stdin)[0]["stats64"]; print(s["rx"]["packets"] + s["tx"]["packets"])')
    mh_exec "$i" iptables -L -v -n -x | awk -v s="$sent" '/ DROP / { d += $1 } END { print s + 0, d + 0 }'
  fi
}

# mh_rtt_us I J: the smallest of 5 TCP connect round trips (SYN to a closed port, RST
# back) from host I to host J, in microseconds.
mh_rtt_us() {
  mh_exec "$1" /usr/bin/python3 -c '
import socket, sys, time
best = None
for _ in range(5):
    s = socket.socket()
    s.settimeout(3)
    t = time.monotonic()
    try:
        s.connect((sys.argv[1], 9))
    except OSError:
        pass
    d = time.monotonic() - t
    s.close()
    best = d if best is None else min(best, d)
print(int(best * 1e6))' "mh$2"
}

mh_impair_clear() {
  local i=$1
  mh_qdisc "$i" clear
  mh_exec "$i" iptables -F 2>/dev/null || true
  if [[ -n $MH_FORWARDER ]]; then
    kill "$MH_FORWARDER" 2>/dev/null
    wait "$MH_FORWARDER" 2>/dev/null || true
    MH_FORWARDER=""
    ip -n "$MH_ID" link del "f$i" 2>/dev/null || true
    ip -n "$MH_ID" link set "b$i" master br0 up
  fi
}

# --- Training helpers shared by the recipe, netem and fault cases ---------------------
MH_BIN=${RD_MH_RESNET_DDP:-}
# Tiny recipe: resnet_tiny at 32 px, 1 thread, deterministic.
# shellcheck disable=SC2034 # used by the cases that source this file
MH_TINY=(--arch resnet_tiny --image-size 32 --threads 1 --workers 1 --log-every 0 --deterministic
  --batch-size 8 --lr 2e-3 --seed 5)

# mh_synth DIR TRAIN VAL: a generated ImageFolder tree (outside /tmp: all hosts see it).
mh_synth() {
  "$MH_BIN" synth --out "$1" --train "$2" --val "$3" --size 32x32 --format png --threads 1 >/dev/null
}

# mh_metrics LOG: the per-epoch metric lines and the final evaluation (no timings).
mh_metrics() {
  grep -E '^\(Epoch [0-9]+/[0-9]+\) (Average train|Val loss|Current best)|Best model' "$1" |
    sed -E 's|[^ ]*/(best_model\.h5)|\1|'
}

# mh_same_checkpoints A.h5 B.h5: parameters, BN buffers and Adam state bit-identical.
mh_same_checkpoints() {
  local group
  if command -v h5diff >/dev/null; then
    for group in /state_dict /optimizer/exp_avg /optimizer/exp_avg_sq; do
      h5diff "$1" "$2" "$group" "$group" >"$MH_DIR/h5diff" ||
        { head -n 20 "$MH_DIR/h5diff" >&2; mh_log "$group differs"; return 1; }
    done
  else
    cmp <("$MH_BIN" info --tensors "$1" | tail -n +3) <("$MH_BIN" info --tensors "$2" | tail -n +3)
  fi
}
