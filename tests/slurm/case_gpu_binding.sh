#!/usr/bin/env bash
# GPU ranks' CPU placement in the job scripts (jobs/common.sh rd_mpirun_gpu_binding), without
# Slurm: the mpirun options for typical GPU node shapes (each rank its own cores on its
# GPU's socket, never one core), the physical-core count they use, rd_set_threads choosing
# them for GPU jobs (RD_DEVICE=cuda) and SRUN_CPUS_PER_TASK for srun, and the binding
# Open MPI's mpirun really applies with that form here: every rank's Cpus_allowed_list
# as it ran, disjoint between ranks and as many cores as asked.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
RD_SCRIPT_NAME=case_gpu_binding
# shellcheck source=jobs/common.sh
source "$repo/jobs/common.sh"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# PER_NODE NODES NTASKS CORES SOCKETS -> options
expect() {
  local got
  got=$(rd_mpirun_gpu_binding "$1" "$2" "$3" "$4" "$5")
  [[ $got == "$6" ]] || fail "rd_mpirun_gpu_binding $1 $2 $3 $4 $5: '$got', expected '$6'"
}
expect 4 2 8 16 2 "--map-by ppr:2:socket:PE=4 --bind-to core"   # Frontera rtx: 4 GPUs, 2 x 8 cores
expect 4 1 4 32 2 "--map-by ppr:2:socket:PE=8 --bind-to core"   # a 4-GPU node, 2 x 16 cores
expect 8 1 8 112 2 "--map-by ppr:4:socket:PE=14 --bind-to core" # an 8-GPU node (DGX H100)
expect 1 1 1 64 2 "--bind-to none"                              # 1 rank on 2 sockets: the whole node
expect 3 2 6 128 2 "--bind-to none"                             # Lonestar6: 3 GPUs on 2 sockets
expect 4 1 4 4 1 "--bind-to none"                               # 1 core per rank: never bound to one
expect 4 2 7 32 2 "--bind-to none"                              # uneven ranks per node
echo "rd_mpirun_gpu_binding: 7 node shapes as expected"

# Cores, not hardware threads (PE counts cores): 4 CPUs on 2 cores of one socket.
lscpu() { printf '# CPU,Core,Socket\n0,0,0\n1,1,0\n2,0,0\n3,1,0\n'; }
allowed=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
if [[ $allowed == 0-* ]] && (($(env -u OMP_NUM_THREADS nproc) >= 4)); then
  [[ $(rd_node_cores) == 2 ]] || fail "rd_node_cores counted $(rd_node_cores) cores for 4 hardware threads on 2 cores"
fi
lscpu() { return 1; }
[[ $(rd_node_cores) == "$(env -u OMP_NUM_THREADS nproc)" ]] || fail "rd_node_cores without lscpu: $(rd_node_cores), expected the allowed CPUs"
unset -f lscpu
echo "rd_node_cores: $(rd_node_cores) here"

# rd_set_threads: a GPU job's default launcher gets the GPU binding; srun gets the cores per task.
export SLURM_NTASKS=4 SLURM_NNODES=1 SLURM_NTASKS_PER_NODE=4 SLURM_CPUS_ON_NODE=16
unset RESNET_DDP_LAUNCHER RESNET_DDP_THREADS SLURM_CPUS_PER_TASK SRUN_CPUS_PER_TASK
if command -v mpirun >/dev/null 2>&1 && rd_is_open_mpi mpirun; then
  RD_DEVICE=cuda RD_LAUNCH=(mpirun -np 4)
  rd_set_threads >/dev/null
  want=$(rd_mpirun_gpu_binding 4 1 4 "$(rd_node_cores)" "$(rd_node_sockets)")
  [[ "${RD_LAUNCH[*]}" == "mpirun -np 4 $want" ]] || fail "GPU job: '${RD_LAUNCH[*]}', expected 'mpirun -np 4 $want'"
  echo "rd_set_threads (GPU job): ${RD_LAUNCH[*]}"
fi
# shellcheck disable=SC2317  # found by rd_set_threads through command -v
srun() { :; }
RESNET_DDP_LAUNCHER=srun RD_DEVICE=cuda RD_LAUNCH=(srun)
export RESNET_DDP_LAUNCHER
rd_set_threads >/dev/null
[[ ${SRUN_CPUS_PER_TASK:-} == 4 ]] || fail "srun in a GPU job: SRUN_CPUS_PER_TASK='${SRUN_CPUS_PER_TASK:-}', expected 4"
unset -f srun
unset RESNET_DDP_LAUNCHER SRUN_CPUS_PER_TASK SLURM_NTASKS SLURM_NNODES SLURM_NTASKS_PER_NODE SLURM_CPUS_ON_NODE
echo "rd_set_threads (GPU job, srun): SRUN_CPUS_PER_TASK=4"

command -v mpirun >/dev/null 2>&1 || {
  echo "SKIP: no mpirun"
  exit 77
}
rd_is_open_mpi mpirun || {
  echo "SKIP: mpirun is not Open MPI's"
  exit 77
}
[[ $(id -u) == 0 ]] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(rd_node_cores)
sockets=$(rd_node_sockets)
# ranks_on_this_node RANKS PE: each rank's Cpus_allowed_list (as the rank ran) must hold PE
# CPUs of its own, disjoint from every other rank's.
ranks_on_this_node() {
  local ranks=$1 pe=$2 lists out
  out=$(mpirun -np "$ranks" --map-by "ppr:$((ranks / sockets)):socket:PE=$pe" --bind-to core \
    sh -c 'sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status' 2>&1) ||
    fail "mpirun -np $ranks --map-by ppr:$((ranks / sockets)):socket:PE=$pe: $out"
  lists=$(echo "$out" | tr -d '\r')
  [[ $(echo "$lists" | wc -l) == "$ranks" ]] || fail "expected $ranks Cpus_allowed_list lines: $lists"
  local list range cpu all=()
  while read -r list; do
    local rank_cpus=()
    for range in ${list//,/ }; do
      for ((cpu = ${range%-*}; cpu <= ${range#*-}; cpu++)); do rank_cpus+=("$cpu"); done
    done
    ((${#rank_cpus[@]} == pe)) || fail "a rank may use CPUs '$list', not $pe of its own"
    all+=("${rank_cpus[@]}")
  done <<<"$lists"
  [[ $(printf '%s\n' "${all[@]}" | sort -u | wc -l) == "${#all[@]}" ]] ||
    fail "the ranks' core sets overlap: $(echo "$lists" | tr '\n' ' ')"
  echo "mpirun -np $ranks PE=$pe: Cpus_allowed_list per rank: $(echo "$lists" | tr '\n' ' ')"
}
# The 4-GPU node shape where this machine has the cores for it, else the largest that fits.
ranks=4
while ((ranks > 1 && (cores / ranks < 1 || ranks % sockets != 0))); do ranks=$((ranks / 2)); done
ranks_on_this_node "$ranks" $((cores / ranks))
((cores >= 2)) && ranks_on_this_node 1 "$cores"
echo "PASS: GPU ranks get their own cores"
