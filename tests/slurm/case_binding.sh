#!/usr/bin/env bash
# The job scripts' rank binding for threaded ranks (jobs/common.sh rd_mpirun_binding),
# without Slurm: the options chosen for typical node shapes, the binding Open MPI's mpirun
# really applies with them on this machine (every rank may use all the cores of its
# socket, where mpirun's own default for <= 2 ranks gives each rank one core), and
# rd_set_threads adding them to the default launcher only.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
RD_SCRIPT_NAME=case_binding
# shellcheck source=jobs/common.sh
source "$repo/jobs/common.sh"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# PER_NODE NODES NTASKS THREADS SOCKETS -> options
expect() {
  local got
  got=$(rd_mpirun_binding "$1" "$2" "$3" "$4" "$5")
  [[ $got == "$6" ]] || fail "rd_mpirun_binding $1 $2 $3 $4 $5: '$got', expected '$6'"
}
expect 4 2 8 32 2 "--map-by ppr:2:socket --bind-to socket"   # cpu.slurm's default on Milan
expect 2 2 4 64 2 "--map-by ppr:1:socket --bind-to socket"   # one rank per socket
expect 16 2 32 8 2 "--map-by ppr:8:socket --bind-to socket"  # one rank per L3 domain
expect 1 2 2 128 2 "--bind-to none"                          # one rank per node: the whole node
expect 3 2 6 42 2 "--bind-to none"                           # 3 per node (Lonestar6 GPUs) on 2 sockets
expect 4 2 7 14 2 "--bind-to none"                           # uneven ranks per node
expect 2 1 2 1 2 ""                                          # 1 thread: mpirun's default stands
echo "rd_mpirun_binding: 7 node shapes as expected"

# Sockets count only the CPUs this process may use (a job's cgroup may hold one socket).
first=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*\([0-9]*\).*/\1/p' /proc/self/status)
lscpu() { printf '# CPU,Socket\n%s,0\n%s,1\n' "$first" 99999; }
[[ $(rd_node_sockets) == 1 ]] || fail "rd_node_sockets counted a socket of CPUs this job may not use"
lscpu() { printf '# CPU,Socket\n%s,0\n%s,1\n' "$first" "$first"; }
[[ $(rd_node_sockets) == 2 ]] || fail "rd_node_sockets: $(rd_node_sockets) for two sockets"
lscpu() { return 1; }
[[ $(rd_node_sockets) == 1 ]] || fail "rd_node_sockets without lscpu: $(rd_node_sockets), expected 1"
unset -f lscpu
echo "rd_node_sockets: this job's CPUs only; $(rd_node_sockets) here"

command -v mpirun >/dev/null 2>&1 || {
  echo "SKIP: no mpirun"
  exit 77
}
rd_is_open_mpi mpirun || {
  echo "SKIP: mpirun is not Open MPI's"
  exit 77
}
[[ $(id -u) == 0 ]] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
sockets=$(rd_node_sockets)
cpus=$(nproc)
((cpus >= 2)) || {
  echo "SKIP: one CPU: nothing to split"
  exit 77
}
# Two ranks on this node, 2 threads each: each rank may use every CPU of its socket.
read -r -a binding <<<"$(rd_mpirun_binding 2 1 2 2 "$sockets")"
per_rank=$(mpirun --oversubscribe -np 2 "${binding[@]}" nproc 2>&1) || fail "mpirun ${binding[*]} nproc: $per_rank"
for n in $per_rank; do
  ((n >= cpus / sockets)) || fail "with ${binding[*]} a rank may use $n CPU(s), fewer than its socket's $((cpus / sockets)): $per_rank"
done
default=$(mpirun -np 2 nproc 2>&1 | sort -u) || true
echo "mpirun ${binding[*]}: each rank may use $(echo "$per_rank" | sort -u | tr '\n' ' ')CPU(s) of $cpus (mpirun's default for 2 ranks: $default)"

# rd_set_threads: a job of 2 nodes x 1 rank with this node's CPUs binds through the default
# launcher; a launcher the user chose, or 1 thread per rank, stays as it is.
export SLURM_NTASKS=2 SLURM_NNODES=2 SLURM_NTASKS_PER_NODE=1 SLURM_CPUS_ON_NODE=$cpus
unset RESNET_DDP_LAUNCHER RESNET_DDP_THREADS SLURM_CPUS_PER_TASK
RD_LAUNCH=(mpirun -np 2)
rd_set_threads >/dev/null
want=$(rd_mpirun_binding 1 2 2 "$cpus" "$sockets")
[[ "${RD_LAUNCH[*]}" == "mpirun -np 2 $want" ]] || fail "default launcher: '${RD_LAUNCH[*]}', expected 'mpirun -np 2 $want'"
[[ $OMP_NUM_THREADS == "$cpus" ]] || fail "OMP_NUM_THREADS=$OMP_NUM_THREADS, expected $cpus"
RESNET_DDP_LAUNCHER='mpirun -np 2' RD_LAUNCH=(mpirun -np 2)
export RESNET_DDP_LAUNCHER
rd_set_threads >/dev/null
[[ "${RD_LAUNCH[*]}" == "mpirun -np 2" ]] || fail "RESNET_DDP_LAUNCHER was given a binding: '${RD_LAUNCH[*]}'"
unset RESNET_DDP_LAUNCHER
RD_LAUNCH=(mpirun -np 2)
RESNET_DDP_THREADS=1 rd_set_threads >/dev/null
[[ "${RD_LAUNCH[*]}" == "mpirun -np 2" ]] || fail "1 thread per rank was given a binding: '${RD_LAUNCH[*]}'"
echo "rd_set_threads: binds the default launcher only, and only threaded ranks"
