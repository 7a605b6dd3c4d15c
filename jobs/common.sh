# shellcheck shell=bash
# Shared by the Slurm job scripts in jobs/ (sourced, never run). Every knob is an
# environment variable, so one script adapts to another cluster without editing it:
#
#   RESNET_DDP_MODULES    modules to `module load` (empty: none); used only if `module` exists
#   RESNET_DDP_LAUNCHER   how ranks start: 'mpirun -np $SLURM_NTASKS' (default), "ibrun",
#                         "srun --mpi=pmix", ...; $VAR / ${VAR} are read when the job runs
#   RESNET_DDP_BIN        the resnet_ddp program (default: next to jobs/, install prefix, PATH)
#   RESNET_DDP_CONTAINER  the command that runs the programs inside a container, e.g.
#                         'apptainer exec --nv $SCRATCH/resnet_ddp.sif' (docs/hpc.md); the
#                         programs' paths (RESNET_DDP_BIN, ...) are then paths inside the image
#   RESNET_DDP_MESSAGE_PASSING_BIN  the same for message_passing
#   RESNET_DDP_DATA_SRC   the dataset on shared storage: .tar.gz, folder or packed .h5
#   RESNET_DDP_STAGE_DIR  node-local folder to stage it to (default /tmp; "none": no
#                         staging, ranks read RESNET_DDP_DATA_SRC directly)
#   RESNET_DDP_THREADS    threads per rank (default: CPUs Slurm gave the node / ranks per node)
#   RESNET_DDP_JOBS_DIR   where jobs/ lives, if Slurm cannot tell (script piped to sbatch)
#   RESNET_DDP_REQUEUE    0: after the clean stop on SIGUSR1 (preemption, time limit) end
#                         the job instead of requeueing it (default 1: `scontrol requeue`)
#
# Job scripts call rd_setup, then rd_train (stage + resnet_ddp) or rd_run_command.

RD_SCRIPT_NAME=${RD_SCRIPT_NAME:-job}
# The real jobs/ folder, normalised (no "//src" when a job was submitted from /).
RD_JOBS_DIR=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
RD_STAGED_SRC=""
RD_STAGED_DEST=""
RD_CHILD=""
RD_SIGNALLED=0
RD_PREEMPT_SIGNAL=""
RD_REQUEUE=0
RD_LAUNCH=()
RD_PREFLIGHT=0
RD_CONTAINER=()
RD_RESUME_HINT="resubmit the same command"

rd_note() { echo "$RD_SCRIPT_NAME: $*"; }
# While the launcher runs, its output (forwarded in chunks that may end mid-line) shares the
# log with ours, and a launcher stopped by a signal may leave a line unfinished: such a note
# starts with a line break of its own, so it never lands in the middle of a training line
# (users read the log; tests anchor on line starts). One write(2) for break and note: bash's
# own printf writes each line separately, and a training chunk could land between the two.
rd_note_async() { env printf '\n%s: %s\n' "$RD_SCRIPT_NAME" "$*"; }
rd_die() {
  echo "$RD_SCRIPT_NAME: error: $*" >&2
  exit 1
}

# Shell-quoted, copy-pasteable form of a command.
rd_quote() {
  local out="" word
  for word in "$@"; do
    out+=" $(printf '%q' "$word")"
  done
  echo "${out# }"
}

rd_in_slurm_job() { [[ -n ${SLURM_JOB_ID:-} && -n ${SLURM_NTASKS:-} && -n ${SLURM_NNODES:-} ]]; }

# rd_load_modules DEFAULT_LIST: RESNET_DDP_MODULES overrides the list (set it empty for none).
rd_load_modules() {
  local modules=${RESNET_DDP_MODULES-$1} list
  [[ -n $modules ]] || return 0
  if ! type module >/dev/null 2>&1; then
    rd_note "no \`module\` command here; not loading: $modules"
    return 0
  fi
  read -r -a list <<<"$modules"
  rd_note "module load ${list[*]}"
  # Module systems are not written for `set -u`.
  set +u
  module load "${list[@]}" ||
    rd_die "\`module load ${list[*]}\` failed; set RESNET_DDP_MODULES to this cluster's module names (empty: load none)"
  set -u
}

# rd_find_program NAME OVERRIDE_VAR: prints the program's path. Looks at the override, the
# repository root next to jobs/ (where `make` links it), the install prefix
# (PREFIX/share/resnet_ddp/jobs -> PREFIX/bin) and PATH.
rd_find_program() {
  local name=$1 var=$2 candidate
  if ((${#RD_CONTAINER[@]})); then
    # The program lives in the image: look for it there, through the container command.
    candidate=${!var:-$name}
    if [[ $candidate != /* ]]; then
      candidate=$("${RD_CONTAINER[@]}" sh -c "command -v $(printf '%q' "$candidate")" 2>/dev/null) ||
        rd_die "cannot find $name inside the container (${RESNET_DDP_CONTAINER}); set $var to its path in the image"
    fi
    "${RD_CONTAINER[@]}" test -x "$candidate" 2>/dev/null ||
      rd_die "$var=$candidate is not an executable file inside the container (${RESNET_DDP_CONTAINER})"
    echo "$candidate"
    return
  fi
  if [[ -n ${!var:-} ]]; then
    [[ -x ${!var} ]] || rd_die "$var=${!var} is not an executable file"
    echo "${!var}"
    return
  fi
  for candidate in "$RD_JOBS_DIR/../$name" "$RD_JOBS_DIR/../build/$name" "$RD_JOBS_DIR/../../../bin/$name"; do
    if [[ -x $candidate && ! -d $candidate ]]; then
      readlink -f "$candidate"
      return
    fi
  done
  candidate=$(command -v "$name" 2>/dev/null) ||
    rd_die "cannot find $name (looked in $RD_JOBS_DIR/.., its build/, the install prefix and PATH); build it with \`make\` or set $var"
  echo "$candidate"
}

# rd_expand_vars TEXT: $VAR and ${VAR} replaced by this environment's values, nothing
# else interpreted (no eval: quotes, globs and $(...) stay text). RESNET_DDP_LAUNCHER is
# written in single quotes (docs/slurm.md) so that Slurm's variables are read when the
# job runs; a variable unset then is an error naming it, except on the login node,
# where the job's variables do not exist yet and the text is kept.
rd_expand_vars() {
  local rest=$1 out="" name
  local re='^([^$]*)[$](\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))(.*)$'
  while [[ $rest =~ $re ]]; do
    out+=${BASH_REMATCH[1]}
    name=${BASH_REMATCH[3]:-${BASH_REMATCH[4]}}
    rest=${BASH_REMATCH[5]}
    if [[ -n ${!name:-} ]]; then
      out+=${!name}
    elif ((RD_PREFLIGHT)); then
      out+="\$$name"
    else
      rd_die "RESNET_DDP_LAUNCHER uses \$$name, which is not set in this job"
    fi
  done
  echo "$out$rest"
}

# Fills RD_LAUNCH from RESNET_DDP_LAUNCHER (default: mpirun with one rank per Slurm task).
rd_set_launcher() {
  local raw=${RESNET_DDP_LAUNCHER:-mpirun -np ${SLURM_NTASKS:-NTASKS}} spec i word next
  spec=$(rd_expand_vars "$raw") || exit 1
  read -r -a RD_LAUNCH <<<"$spec"
  ((${#RD_LAUNCH[@]} > 0)) || rd_die "RESNET_DDP_LAUNCHER is blank"
  # A rank count that vanished: "mpirun -np $SLURM_NTASKS ..." in double quotes was
  # expanded where the job was submitted, where SLURM_NTASKS is empty.
  for ((i = 0; i < ${#RD_LAUNCH[@]}; i++)); do
    word=${RD_LAUNCH[i]}
    [[ $word == -np || $word == -n || $word == --np || $word == --ntasks ]] || continue
    next=${RD_LAUNCH[i + 1]:-}
    [[ $next =~ ^[1-9][0-9]*$ ]] && continue
    ((RD_PREFLIGHT)) && [[ $next == \$* || $next == NTASKS ]] && continue
    rd_die "RESNET_DDP_LAUNCHER=\"$raw\": '$word' is followed by '${next:-nothing}', not a number of ranks; a variable such as \$SLURM_NTASKS expanded to nothing where the job was submitted? Write it in single quotes, RESNET_DDP_LAUNCHER='mpirun -np \$SLURM_NTASKS ...', so that it is read when the job runs"
  done
  if ! command -v "${RD_LAUNCH[0]}" >/dev/null 2>&1; then
    local problem="launcher '${RD_LAUNCH[0]}' not found (RESNET_DDP_LAUNCHER=\"$spec\"); load the MPI module or choose e.g. \"srun --mpi=pmix\""
    # On a login node the MPI module may simply not be loaded yet.
    ((RD_PREFLIGHT)) && rd_note "warning: $problem" && return 0
    rd_die "$problem"
  fi
  # Open MPI's mpirun waits on a daemon whose node dropped off the network for its TCP
  # keepalive (default 300 s + 9 x 20 s) while the ranks have long exited, so the job
  # would sit to its time limit. Short keepalives end it in ~15 s (measured on the
  # multihost harness, docs/distributed.md). A value the user exported wins.
  export OMPI_MCA_oob_tcp_keepalive_time=${OMPI_MCA_oob_tcp_keepalive_time:-5}
  export OMPI_MCA_oob_tcp_keepalive_intvl=${OMPI_MCA_oob_tcp_keepalive_intvl:-2}
  export OMPI_MCA_oob_tcp_keepalive_probes=${OMPI_MCA_oob_tcp_keepalive_probes:-3}
  # scancel (or Ctrl-C on mpirun) makes mpirun send SIGTERM to the ranks after this many
  # seconds and SIGKILL as many later; Open MPI's 1 s leaves no time to finish the step
  # and write last.h5 (Slurm signals the ranks itself at once). Not more: mpirun also
  # waits this long twice whenever a rank fails, which delays the end of a failed job.
  export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-10}
}

# Threads per rank from what Slurm granted on this node, unless RESNET_DDP_THREADS says.
rd_set_threads() {
  local per_node=${SLURM_NTASKS_PER_NODE:-} cpus threads
  if [[ -z $per_node || ! $per_node =~ ^[0-9]+$ ]]; then
    per_node=$(((SLURM_NTASKS + SLURM_NNODES - 1) / SLURM_NNODES))
  fi
  if [[ -n ${RESNET_DDP_THREADS:-} ]]; then
    threads=$RESNET_DDP_THREADS
  elif [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then
    threads=$SLURM_CPUS_PER_TASK
  else
    cpus=${SLURM_CPUS_ON_NODE:-$(nproc)}
    threads=$((cpus / per_node))
  fi
  [[ $threads =~ ^[0-9]+$ ]] || rd_die "threads per rank '$threads' is not a number (RESNET_DDP_THREADS?)"
  ((threads >= 1)) || threads=1
  export OMP_NUM_THREADS=$threads
  rd_note "$SLURM_NTASKS rank(s) on $SLURM_NNODES node(s) ($per_node per node), $threads thread(s) per rank"
  # Only the default launcher gets a binding: one the user chose is theirs to bind.
  if [[ -z ${RESNET_DDP_LAUNCHER:-} ]] && rd_is_open_mpi "${RD_LAUNCH[0]}"; then
    local sockets binding
    sockets=$(rd_node_sockets)
    if [[ ${RD_DEVICE:-} == cuda ]]; then
      local cores
      cores=$(rd_node_cores)
      read -r -a binding <<<"$(rd_mpirun_gpu_binding "$per_node" "$SLURM_NNODES" "$SLURM_NTASKS" "$cores" "$sockets")"
      RD_LAUNCH+=("${binding[@]}")
      rd_note "GPU ranks: each on its own cores near its GPU ($cores core(s), $sockets socket(s) per node): ${binding[*]}"
    else
      read -r -a binding <<<"$(rd_mpirun_binding "$per_node" "$SLURM_NNODES" "$SLURM_NTASKS" "$threads" "$sockets")"
      if ((${#binding[@]} > 0)); then
        RD_LAUNCH+=("${binding[@]}")
        rd_note "binding for $threads thread(s) per rank on $sockets socket(s) per node: ${binding[*]}"
      fi
    fi
  fi
  # srun (Slurm >= 22.05) no longer passes the job's --cpus-per-task to its tasks: each
  # would get one core. SRUN_CPUS_PER_TASK is what srun reads instead; one set wins.
  if [[ ${RD_DEVICE:-} == cuda && ${RD_LAUNCH[0]} == srun && -z ${SRUN_CPUS_PER_TASK:-} ]]; then
    export SRUN_CPUS_PER_TASK=$threads
  fi
}

# A GPU rank's CPU work is its loader threads plus the thread that launches the kernels;
# sharing one core (mpirun's default binding for <= 2 ranks) starves the GPU. As NVIDIA's
# DeepLearningExamples do, each rank gets its own cores on the socket of its GPU (local
# rank i takes GPU i, and GPUs are numbered socket by socket):
# rd_mpirun_gpu_binding PER_NODE NODES NTASKS CORES SOCKETS prints
# "--map-by ppr:R:socket:PE=K --bind-to core" (R ranks per socket, K cores each) when the
# ranks split evenly over the sockets and each gets at least 2 cores; otherwise
# "--bind-to none" (the layout is unknown, and one core per rank is never right).
rd_mpirun_gpu_binding() {
  local per_node=$1 nodes=$2 ntasks=$3 cores=$4 sockets=$5
  if ((sockets >= 1 && per_node >= 1 && per_node % sockets == 0 && ntasks == per_node * nodes &&
    cores / per_node >= 2)); then
    echo "--map-by ppr:$((per_node / sockets)):socket:PE=$((cores / per_node)) --bind-to core"
  else
    echo "--bind-to none"
  fi
}

# Physical cores (not hardware threads: mpirun's PE counts cores) holding the CPUs this
# job may use on this node; the CPUs allowed when lscpu cannot tell.
rd_node_cores() {
  local allowed range cpu core socket n=0
  local -A mine=() seen=()
  allowed=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status 2>/dev/null) || allowed=""
  for range in ${allowed//,/ }; do
    for ((cpu = ${range%-*}; cpu <= ${range#*-}; cpu++)); do mine[$cpu]=1; done
  done
  while IFS=, read -r cpu core socket; do
    [[ $cpu == \#* || -z $core ]] && continue
    [[ -z $allowed || -n ${mine[$cpu]:-} ]] || continue
    [[ -n ${seen[$socket.$core]:-} ]] || { seen[$socket.$core]=1; n=$((n + 1)); }
  done < <(lscpu -p=CPU,CORE,SOCKET 2>/dev/null)
  ((n >= 1)) || n=${#mine[@]}
  ((n >= 1)) || n=$(env -u OMP_NUM_THREADS nproc)
  echo "$n"
}

# Open MPI's mpirun binds each rank to one core when it starts <= 2 ranks and to one
# socket above that (mpirun(1)): with threads per rank, one rank per node on 2 nodes then
# gets 1 core and resnet_ddp clamps to 1 thread, and 1 or 3 ranks per node on 2 sockets
# crowd one socket. rd_mpirun_binding PER_NODE NODES NTASKS THREADS SOCKETS prints the
# mpirun options that give every rank its share instead (nothing for 1 thread per rank,
# where the default is right): whole sockets shared by an equal number of ranks when
# the ranks per node split evenly over the sockets, else no binding at all.
rd_mpirun_binding() {
  local per_node=$1 nodes=$2 ntasks=$3 threads=$4 sockets=$5
  ((threads > 1)) || return 0
  if ((sockets >= 1 && per_node % sockets == 0 && ntasks == per_node * nodes)); then
    echo "--map-by ppr:$((per_node / sockets)):socket --bind-to socket"
  else
    echo "--bind-to none"
  fi
}

# Sockets holding the CPUs this job may use on this node (the job's first; the nodes of a
# partition are alike). 1 if unknown.
rd_node_sockets() {
  local allowed range cpu socket n=0
  local -A mine=() seen=()
  allowed=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status 2>/dev/null) || allowed=""
  for range in ${allowed//,/ }; do
    for ((cpu = ${range%-*}; cpu <= ${range#*-}; cpu++)); do mine[$cpu]=1; done
  done
  while IFS=, read -r cpu socket; do
    [[ $cpu == \#* || -z $socket ]] && continue
    [[ -z $allowed || -n ${mine[$cpu]:-} ]] || continue
    [[ -n ${seen[$socket]:-} ]] || { seen[$socket]=1; n=$((n + 1)); }
  done < <(lscpu -p=CPU,SOCKET 2>/dev/null)
  ((n >= 1)) || n=1
  echo "$n"
}

rd_is_open_mpi() {
  "$1" --version 2>/dev/null | grep -q "Open MPI"
}

# --- signals and clean-up ---------------------------------------------------------------
# Slurm's --signal=B:USR1@T (and scancel --batch --signal=USR1) reach only this shell; pass
# the signal to the launcher, which forwards it to every rank (mpirun and srun both do).
# resnet_ddp then finishes its step, rank 0 writes last.h5, and all ranks exit 0.
# SIGTERM is not passed on: Slurm sends it to every process of the job itself (time limit,
# scancel), and a second one makes resnet_ddp exit without its checkpoint.
rd_on_signal() {
  local sig=$1
  RD_SIGNALLED=1
  RD_PREEMPT_SIGNAL=$sig
  if [[ $sig == TERM && -n $RD_CHILD ]]; then
    rd_note_async "got SIGTERM: Slurm is ending the job and signals every rank itself; waiting for the launcher"
  elif [[ -n $RD_CHILD ]] && kill -0 "$RD_CHILD" 2>/dev/null; then
    rd_note_async "got SIG$sig: passing it to the launcher (pid $RD_CHILD) so training checkpoints and stops"
    kill -s "$sig" "$RD_CHILD" 2>/dev/null || true
  elif [[ $sig == TERM || $sig == INT ]]; then
    rd_note_async "got SIG$sig before training started: stopping"
    exit 143
  else
    rd_note_async "got SIG$sig before training started: will not start training"
  fi
}

rd_on_exit() {
  local rc=$?
  trap - EXIT
  if [[ -n $RD_STAGED_SRC ]]; then
    rd_note "removing the staged data from every node"
    # Bounded: at a time limit or scancel, Slurm refuses new steps and kills us soon anyway.
    if ! timeout 120 "$RD_JOBS_DIR/stage_data.sh" --remove "$RD_STAGED_SRC" "$RD_STAGED_DEST"; then
      rd_note "could not remove it through srun (job ending?); removing this node's copy only"
      SLURM_JOB_ID="" "$RD_JOBS_DIR/stage_data.sh" --remove "$RD_STAGED_SRC" "$RD_STAGED_DEST" || true
    fi
  fi
  if ((RD_REQUEUE)) && ((rc == 0)); then
    # Last: Slurm ends this script as it requeues the job.
    rd_note "requeueing job $SLURM_JOB_ID (scontrol requeue); it resumes from its last.h5"
    if ! timeout 60 scontrol requeue "$SLURM_JOB_ID"; then
      rd_note "scontrol requeue $SLURM_JOB_ID failed (is the job requeueable? #SBATCH --requeue); $RD_RESUME_HINT to resume"
    fi
  fi
  rd_note "exit status $rc"
  exit "$rc"
}

# rd_setup DEFAULT_MODULES: checks, modules, launcher, threads, traps.
#
# Run outside Slurm (`bash jobs/X.slurm ARGS` on a login node), it only checks what a job
# would need — program, dataset, launcher — and prints the command: a queue wait is too
# expensive to find a typo.
rd_setup() {
  if [[ -n ${RESNET_DDP_CONTAINER:-} ]]; then
    read -r -a RD_CONTAINER <<<"$(rd_expand_vars "$RESNET_DDP_CONTAINER")"
    command -v "${RD_CONTAINER[0]}" >/dev/null 2>&1 ||
      rd_die "RESNET_DDP_CONTAINER: '${RD_CONTAINER[0]}' is not a command here (load the apptainer module?)"
  fi
  if ! rd_in_slurm_job; then
    RD_PREFLIGHT=1
    rd_note "not inside a Slurm job: checking the set-up only"
    rd_set_launcher
    return 0
  fi
  trap rd_on_exit EXIT
  trap 'rd_on_signal USR1' USR1
  trap 'rd_on_signal TERM' TERM
  trap 'rd_on_signal INT' INT
  rd_note "job ${SLURM_JOB_ID} (${SLURM_JOB_NAME:-}) on $(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | tr '\n' ' ')from $RD_JOBS_DIR"
  rd_load_modules "$1"
  rd_set_launcher
  rd_set_threads
}

# rd_run_command CMD...: prints it as "Training command: ..." and runs it in the
# background so that signals reach rd_on_signal while it runs. Returns its status.
rd_run_command() {
  echo "Training command: $(rd_quote "$@")"
  if ((RD_PREFLIGHT)); then
    rd_note "set-up looks complete; submit it with: sbatch ${RD_SUBMIT_PATH:-$RD_JOBS_DIR/$RD_SCRIPT_NAME} [options]"
    return 0
  fi
  if ((RD_SIGNALLED)); then
    rd_note "not starting: a SIG$RD_PREEMPT_SIGNAL arrived during set-up"
    return 0
  fi
  "$@" &
  RD_CHILD=$!
  local status=0 rc
  while :; do
    RD_SIGNALLED=0
    rc=0
    wait "$RD_CHILD" || rc=$?
    # 127: bash reaped it while a trap ran; the status from the previous wait stands.
    ((rc == 127)) && break
    status=$rc
    # A trapped signal interrupts `wait` (status > 128) while the child keeps running.
    ((RD_SIGNALLED)) || break
  done
  RD_CHILD=""
  if [[ $RD_PREEMPT_SIGNAL == USR1 && $status == 0 && ${RESNET_DDP_REQUEUE:-1} != 0 ]]; then
    # The clean stop after --signal=B:USR1: come back as the same job (same id, same
    # log with --open-mode=append, same output folder) and resume from last.h5.
    RD_REQUEUE=1
    rd_note_async "training stopped after SIGUSR1 and saved its last.h5; the job requeues itself when it ends"
  elif [[ -n $RD_PREEMPT_SIGNAL ]]; then
    rd_note_async "training stopped after SIG$RD_PREEMPT_SIGNAL with status $status; $RD_RESUME_HINT to resume from its last.h5"
  fi
  return "$status"
}

# rd_has_flag "FLAG [ALIAS...]" ARGS...: whether ARGS set FLAG in one of its spellings
# (as "FLAG VALUE" or "FLAG=VALUE"), or the `--config FILE` among ARGS does (lines
# "--flag value", "flag = value" or YAML's "flag: value"). The defaults rd_train adds go
# on the command line, which resnet_ddp lets win over the file: they must not be added
# when the file has them.
rd_has_flag() {
  local flags=$1 arg f key prev="" cfg=""
  shift
  for arg in "$@"; do
    for f in $flags; do
      [[ $arg == "$f" || $arg == "$f="* ]] && return 0
    done
    [[ $prev == --config ]] && cfg=$arg
    [[ $arg == --config=* ]] && cfg=${arg#--config=}
    prev=$arg
  done
  [[ -n $cfg && -r $cfg ]] || return 1
  for f in $flags; do
    key=${f#-}
    key=${key#-}
    key=${key//-/[-_]}
    grep -Eq "^[[:space:]]*-{0,2}${key}([[:space:]]|=|:|\$)" "$cfg" && return 0
  done
  return 1
}

# rd_train DATA_SRC_DEFAULT [RESNET_DDP_ARGS...]: stage the data on every node, run
# resnet_ddp on it through the launcher, remove the staged copy at exit. The threads per
# rank go to resnet_ddp as --threads (its own default counts every core of the node, not
# the ones Slurm granted), unless ARGS set --threads.
rd_train() {
  local src=${RESNET_DDP_DATA_SRC:-$1} dest=${RESNET_DDP_STAGE_DIR:-/tmp} bin data
  shift
  local defaults=()
  if ((!RD_PREFLIGHT)) && ! rd_has_flag --threads "$@"; then
    defaults=(--threads "$OMP_NUM_THREADS")
  fi
  # One folder per submission (job name and id; per task of a job array), so two
  # submissions never continue each other's last.h5. A requeued job keeps its id and
  # resumes; a new submission resumes only when given that folder's --output-dir.
  if ! rd_has_flag "--output-dir --output" "$@"; then
    local out="output_model/${SLURM_JOB_NAME:-${RD_SCRIPT_NAME%.slurm}}_${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-JOBID}}"
    out+=${SLURM_ARRAY_TASK_ID:+_$SLURM_ARRAY_TASK_ID}
    defaults+=(--output-dir "$out")
    RD_RESUME_HINT="resubmit with --output-dir $out"
  fi
  bin=$(rd_find_program resnet_ddp RESNET_DDP_BIN)
  # GPU job scripts set RD_DEVICE=cuda: a job without GPUs, or a binary built without
  # the CUDA backend, then stops at once instead of training for hours on the CPU.
  if [[ -n ${RD_DEVICE:-} ]] && ! rd_has_flag --device "$@"; then
    defaults+=(--device "$RD_DEVICE")
  fi
  if ((RD_PREFLIGHT)); then
    rd_note "$(${RD_CONTAINER[@]+"${RD_CONTAINER[@]}"} "$bin" --version 2>/dev/null | sed -n 's/^backends: /program backends: /p') ($bin)"
  fi
  [[ -e $src ]] || rd_die "dataset $src does not exist; set RESNET_DDP_DATA_SRC to a .tar.gz, folder or .h5 on shared storage"
  local program=(${RD_CONTAINER[@]+"${RD_CONTAINER[@]}"} "$bin")
  if [[ $dest == none ]]; then
    data=$src
  elif ((RD_PREFLIGHT)); then
    # Reads the archive's first member: a corrupt or foreign file fails here already.
    data=$("$RD_JOBS_DIR/stage_data.sh" --path "$src" "$dest")
    rd_note "the job will stage $src to $dest on every node"
  else
    data=$("$RD_JOBS_DIR/stage_data.sh" --path "$src" "$dest")
    RD_STAGED_SRC=$src
    RD_STAGED_DEST=$dest
    "$RD_JOBS_DIR/stage_data.sh" "$src" "$dest"
    if [[ $dest == *%n* ]]; then
      # Per-node folders on a shared /tmp (emulated nodes): each rank must read its own
      # node's copy, so the node name is filled in on the rank's node.
      data=${dest}/$(basename "$data")
      program=("$RD_JOBS_DIR/on_node.sh" ${RD_CONTAINER[@]+"${RD_CONTAINER[@]}"} "$bin")
    fi
  fi
  if ((RD_PREFLIGHT)); then
    # The program's own dry run: every flag and the config file, the dataset's headers
    # (on shared storage; an archive is checked when staged), the output folder, the
    # device and a checkpoint a resume would read. A typo costs seconds here.
    rd_note "resnet_ddp --check (validates the flags, config, data, output folder and device):"
    ${RD_CONTAINER[@]+"${RD_CONTAINER[@]}"} "$bin" --check --data "$src" ${defaults[@]+"${defaults[@]}"} "$@" ||
      rd_die "resnet_ddp --check found the problem above (exit $?); fix it before submitting"
  fi
  # ${a[@]+...}: bash before 4.4 (CentOS 7 login nodes) calls an empty array unbound.
  rd_run_command "${RD_LAUNCH[@]}" "${program[@]}" --data "$data" ${defaults[@]+"${defaults[@]}"} "$@"
}
