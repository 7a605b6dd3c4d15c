# shellcheck shell=bash
# A private Slurm cluster on this machine, for the `slurm` test cases: one munged, one
# slurmctld and two slurmd daemons emulating the nodes c001-001 and c001-002. Everything
# (key, socket, config, state, spool, logs) lives in one temp dir and the ports are picked
# free at start, so an existing Slurm or munge on the host is never used or touched:
# every client command finds this cluster only through SLURM_CONF.
#
# Usage from a case script (bash, sourced):
#   source "$(dirname "$0")/harness.sh"
#   rd_slurm_start 240          # skip (exit 77) if impossible; budget in seconds
#   job=$(rd_sbatch -J name -N 2 --ntasks-per-node=1 script.slurm args...)
#   rd_slurm_wait "$job" 120    # prints the final state; returns 0 only for COMPLETED
#   rd_job_log "$job"           # the job's stdout/stderr
# Teardown (cancel jobs, stop daemons, remove the temp dir) runs on every exit path;
# RD_SLURM_KEEP=1 keeps the temp dir for post-mortems.
# RD_SLURM_GPUS=N before rd_slurm_start gives each node N GPUs as Slurm generic resources
# (gres/gpu on placeholder device files) and N CPUs, so that --gpus-per-task and
# --gpus-per-node set CUDA_VISIBLE_DEVICES as on a real GPU partition; the emulated CUDA
# device (RD_EMU_DEVICE_COUNT) then plays the GPUs.

RD_SLURM_NODES=(c001-001 c001-002)
RD_SLURM_PARTITION=emu
RD_SLURM_DIR=""
RD_SLURM_PIDS=()
RD_SLURM_CASE=$(basename "${BASH_SOURCE[1]:-$0}" .sh)
RD_SLURM_GPUS=${RD_SLURM_GPUS:-0}

rd_log() { printf '[%s %s] %s\n' "$RD_SLURM_CASE" "$(date +%T)" "$*" >&2; }
rd_fail() { rd_log "FAIL: $*"; exit 1; }
rd_skip() { echo "SKIP ($RD_SLURM_CASE): $*"; exit 77; }

# The repository root (this file lives in tests/slurm/); cases use it.
export RD_REPO
RD_REPO=$(readlink -f "$(dirname "${BASH_SOURCE[0]}")/../..")

rd_slurm_check_prereqs() {
  local missing=() tool
  for tool in munged mungekey slurmctld slurmd sbatch srun scontrol sinfo squeue scancel; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  ((${#missing[@]} == 0)) ||
    rd_skip "missing ${missing[*]} (Debian packages slurm-wlm, munge)"
  # slurmd starts job steps as the submitting user, which only root may do.
  [[ $(id -u) == 0 ]] || rd_skip "a private slurmd needs root (running as $(id -un))"
}

# Whether some socket is bound to TCP port $1 (read from /proc: no iproute2 needed).
rd_port_in_use() {
  local hex
  hex=$(printf '%04X' "$1")
  awk -v port=":$hex" 'FNR > 1 && substr($2, length($2) - 4) == port { found = 1 } END { exit !found }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# A TCP port nobody uses now. A race with another process is possible; the start-up
# retries with fresh ports when a daemon cannot bind.
rd_free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 40000))
    if ! rd_port_in_use "$port"; then
      echo "$port"
      return
    fi
  done
}

# The settings every private test cluster shares (this harness and the multihost one):
# paths under DIR, munge auth through DIR's socket, no accounting, short waits.
rd_slurm_conf_common() {
  local dir=$1
  : >"$dir/plugstack.conf"
  cat <<EOF
AuthType=auth/munge
# cred_expire also holds a requeued job back that long (default 120 s).
AuthInfo=socket=$dir/munge/socket,cred_expire=20
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
MailProg=/bin/true
PlugStackConfig=$dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
# Short waits keep the tests fast: signals escalate to SIGKILL after KillWait seconds.
KillWait=10
MessageTimeout=20
InactiveLimit=0
MinJobAge=600
EOF
}

rd_write_slurm_conf() {
  local dir=$1 ctld_port=$2 node_port_lo=$3 host
  host=$(hostname -s)
  {
    cat <<EOF
# Private test cluster written by tests/slurm/harness.sh
ClusterName=rdtest
# The address in brackets: clients need not resolve the host name (chroots, containers).
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
# Per-node scratch (srun --mpi=pmix puts its client dirs there): the nodes share /tmp.
TmpFS=$dir/tmpfs/%n
# Job ids unlike another private cluster's, should two run at once.
FirstJobId=$((1000 + RANDOM * 10))
SlurmctldDebug=info
SlurmdDebug=info
EOF
    rd_slurm_conf_common "$dir"
    local nodes="${RD_SLURM_NODES[0]%-*}-[001-002]" node_extra="CPUs=1"
    if ((RD_SLURM_GPUS > 0)); then
      node_extra="CPUs=$RD_SLURM_GPUS Gres=gpu:$RD_SLURM_GPUS"
      echo "GresTypes=gpu"
      # A node shape with more CPUs than this machine has (4 GPUs, 4 CPUs on 2 cores):
      # slurmd takes the configured counts instead of marking the node invalid.
      echo "SlurmdParameters=config_overrides"
    fi
    cat <<EOF
NodeName=$nodes NodeHostname=$host NodeAddr=127.0.0.1 Port=$node_port_lo-$((node_port_lo + 1)) $node_extra State=UNKNOWN
PartitionName=$RD_SLURM_PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  } >"$dir/slurm.conf"
  : >"$dir/plugstack.conf"
  if ((RD_SLURM_GPUS > 0)); then
    # slurmd takes the device index from the file name's number (nvidia0 -> 0) and sets
    # CUDA_VISIBLE_DEVICES from it; it wants a character device: links to /dev/null.
    mkdir -p "$dir/dev"
    local i
    for ((i = 0; i < RD_SLURM_GPUS; i++)); do ln -sf /dev/null "$dir/dev/nvidia$i"; done
    echo "NodeName=$nodes Name=gpu File=$dir/dev/nvidia[0-$((RD_SLURM_GPUS - 1))]" >"$dir/gres.conf"
  fi
}

# Starts a daemon in the foreground as a child of this shell, so that even if the harness
# is killed outright (ctest timeout) the whole tree goes with it.
rd_spawn() {
  local log=$1
  shift
  "$@" >>"$log" 2>&1 &
  RD_SLURM_PIDS+=($!)
}

rd_nodes_idle() {
  local states
  states=$(timeout 10 sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
  [[ $(grep -c ' idle$' <<<"$states") == "${#RD_SLURM_NODES[@]}" ]]
}

# rd_slurm_start BUDGET_SECONDS: start the cluster, arm the teardown and a watchdog that
# ends the case (with teardown) after BUDGET_SECONDS, before ctest's own TIMEOUT kills it.
rd_slurm_start() {
  local budget=$1 attempt ctld_port node_port
  rd_slurm_check_prereqs
  # Never let an outer Slurm job (CI running inside an allocation) leak into this cluster.
  local var
  for var in $(compgen -e); do
    [[ $var == SLURM_* ]] && unset "$var"
  done
  RD_SLURM_DIR=$(mktemp -d "${TMPDIR:-/tmp}/rd-slurm.XXXXXX")
  trap rd_slurm_teardown EXIT
  # A failing command under `set -e` names itself instead of ending the case silently.
  set -E
  trap 'rd_log "FAIL: \`$BASH_COMMAND\` failed (status $?) at ${BASH_SOURCE[0]}:$LINENO"' ERR
  trap 'rd_log "interrupted"; exit 130' INT
  trap 'rd_log "terminated (time budget or ctest timeout)"; exit 143' TERM
  local main_pid=$$
  (
    sleep "$budget" &
    sleeper=$!
    trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
    wait "$sleeper" && kill -TERM "$main_pid"
  ) 2>/dev/null &
  RD_SLURM_WATCHDOG=$!
  # Marks every process started from here on, so teardown can find stragglers by pid.
  export RD_SLURM_HARNESS_ID=$RD_SLURM_DIR
  export SLURM_CONF=$RD_SLURM_DIR/slurm.conf
  # Open MPI inside the jobs runs as root on an emulated machine.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
  export OMP_NUM_THREADS=1

  local d=$RD_SLURM_DIR
  mkdir -p "$d/munge" "$d/state" "$d/run" "$d/log" "$d/jobs"
  local node
  for node in "${RD_SLURM_NODES[@]}"; do
    mkdir -p "$d/spool/$node" "$d/tmpfs/$node"
  done
  chmod 755 "$d" "$d/munge"
  mungekey -c -k "$d/munge/munge.key" >/dev/null
  rd_spawn "$d/log/munged.out" munged -F --force --socket="$d/munge/socket" \
    --key-file="$d/munge/munge.key" --pid-file="$d/run/munged.pid" \
    --log-file="$d/log/munged.log" --seed-file="$d/munge/seed"
  local i
  for ((i = 0; i < 50; i++)); do
    [[ -S $d/munge/socket ]] && break
    sleep 0.1
  done
  [[ -S $d/munge/socket ]] || rd_fail "munged did not create its socket (see $d/log/munged.log)"

  for attempt in 1 2 3; do
    ctld_port=$(rd_free_port)
    node_port=$(rd_free_port)
    # Two consecutive free ports for the two slurmd daemons.
    while rd_port_in_use $((node_port + 1)) || [[ $node_port == "$ctld_port" ||
      $((node_port + 1)) == "$ctld_port" ]]; do
      node_port=$(rd_free_port)
    done
    rd_write_slurm_conf "$d" "$ctld_port" "$node_port"
    rd_spawn "$d/log/slurmctld.out" slurmctld -D -c -i
    local node
    for node in "${RD_SLURM_NODES[@]}"; do
      rd_spawn "$d/log/slurmd.$node.out" slurmd -D -N "$node"
    done
    for ((i = 0; i < 100; i++)); do
      rd_nodes_idle && break
      sleep 0.3
    done
    if rd_nodes_idle; then
      rd_log "private Slurm up in $d (slurmctld :$ctld_port, slurmd :$node_port-$((node_port + 1)))"
      return 0
    fi
    rd_log "cluster did not come up (attempt $attempt); logs:"
    tail -n 5 "$d"/log/slurm*.log "$d"/log/*.out >&2 || true
    rd_stop_slurm_daemons
  done
  rd_fail "private Slurm did not start"
}

# Stops slurmctld/slurmd (keeps munged) and kills whatever they left behind.
rd_stop_slurm_daemons() {
  timeout 10 scontrol shutdown >/dev/null 2>&1 || true
  local pid i keep=()
  for ((i = 0; i < 50; i++)); do
    keep=()
    for pid in "${RD_SLURM_PIDS[@]:1}"; do
      kill -0 "$pid" 2>/dev/null && keep+=("$pid")
    done
    ((${#keep[@]} == 0)) && break
    sleep 0.2
  done
  for pid in "${keep[@]}"; do
    kill -KILL "$pid" 2>/dev/null || true
  done
  RD_SLURM_PIDS=("${RD_SLURM_PIDS[0]}")
}

# Processes started under this harness that escaped the daemon tree (slurmstepd and job
# processes are re-parented to init): found by the marker in their environment. (Only
# exec'd programs show it in /proc/PID/environ, so this shell's subshells never match.)
rd_harness_stragglers() {
  local env_file pid
  for env_file in /proc/[0-9]*/environ; do
    pid=${env_file#/proc/}
    pid=${pid%/environ}
    [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
    if { tr '\0' '\n' <"$env_file"; } 2>/dev/null | grep -qxF "RD_SLURM_HARNESS_ID=$RD_SLURM_DIR"; then
      echo "$pid"
    fi
  done
}

rd_slurm_teardown() {
  local rc=$?
  trap - EXIT INT TERM ERR
  # Best effort from here on: one failing step must not skip the rest.
  set +e
  [[ -n ${RD_SLURM_WATCHDOG:-} ]] && kill "$RD_SLURM_WATCHDOG" 2>/dev/null
  if [[ -n $RD_SLURM_DIR && -d $RD_SLURM_DIR ]]; then
    if ((rc != 0 && rc != 77)); then
      rd_log "exit status $rc; daemon log tails:"
      tail -n 15 "$RD_SLURM_DIR"/log/slurmctld.log "$RD_SLURM_DIR"/log/slurmd.*.log >&2 2>/dev/null || true
    fi
    if ((${#RD_SLURM_PIDS[@]} > 0)); then
      timeout 10 scancel --quiet --partition "$RD_SLURM_PARTITION" >/dev/null 2>&1 || true
      local i
      for ((i = 0; i < 40; i++)); do
        [[ -z $(timeout 5 squeue -h -o %i 2>/dev/null) ]] && break
        sleep 0.25
      done
      rd_stop_slurm_daemons
      local pid
      for pid in $(rd_harness_stragglers); do
        kill -KILL "$pid" 2>/dev/null || true
      done
      kill "${RD_SLURM_PIDS[0]}" 2>/dev/null || true
      wait "${RD_SLURM_PIDS[0]}" 2>/dev/null || true
    fi
    if [[ ${RD_SLURM_KEEP:-0} == 1 ]]; then
      rd_log "kept $RD_SLURM_DIR"
    else
      rm -rf "$RD_SLURM_DIR"
    fi
  fi
  exit "$rc"
}

# rd_sbatch SBATCH_ARGS...: submits to the private partition with the log in the temp
# dir (jobs/<job name>.<id>.out) and prints the job id.
rd_sbatch() {
  local out
  out=$(timeout 30 sbatch --parsable -p "$RD_SLURM_PARTITION" \
    -o "$RD_SLURM_DIR/jobs/%x.%j.out" "$@") || rd_fail "sbatch $* failed: $out"
  echo "${out%%;*}"
}

rd_job_field() { # rd_job_field JOBID FIELD → value from `scontrol show job`
  timeout 10 scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

rd_job_log() {
  local path
  path=$(rd_job_field "$1" StdOut)
  [[ -n $path && -f $path ]] && cat "$path"
}

# rd_slurm_wait JOBID TIMEOUT: waits for the job to end; prints "STATE EXITCODE".
rd_slurm_wait() {
  local job=$1 timeout_s=$2 state="" start=$SECONDS
  while ((SECONDS - start < timeout_s)); do
    state=$(rd_job_field "$job" JobState)
    case $state in
      PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | "") sleep 0.5 ;;
      *) break ;;
    esac
  done
  case $state in
    PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | "")
      rd_log "job $job still $state after ${timeout_s}s; its log so far:"
      rd_job_log "$job" >&2 || true
      return 1
      ;;
  esac
  echo "$state $(rd_job_field "$job" ExitCode)"
}

# rd_wait_for_log JOBID REGEX TIMEOUT: waits until the job's log matches (job must run).
rd_wait_for_log() {
  local job=$1 regex=$2 timeout_s=$3 start=$SECONDS
  while ((SECONDS - start < timeout_s)); do
    rd_job_log "$job" 2>/dev/null | grep -Eq -- "$regex" && return 0
    case $(rd_job_field "$job" JobState) in
      PENDING | CONFIGURING | RUNNING | "") sleep 0.5 ;;
      *) break ;;
    esac
  done
  rd_log "job $job log never matched /$regex/; log:"
  rd_job_log "$job" >&2 || true
  return 1
}

# rd_expect_log JOBID REGEX [COUNT]: the log has a line matching REGEX (exactly COUNT times).
rd_expect_log() {
  local job=$1 regex=$2 count=${3:-} n
  n=$(rd_job_log "$job" | grep -Ec -- "$regex" || true)
  if [[ -z $count && $n -ge 1 ]] || [[ -n $count && $n == "$count" ]]; then
    return 0
  fi
  rd_log "job $job: /$regex/ matched $n lines, expected ${count:-at least 1}; log:"
  rd_job_log "$job" >&2 || true
  exit 1
}
