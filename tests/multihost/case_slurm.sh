#!/usr/bin/env bash
# Slurm across 2 namespace hosts: slurmctld and munged on mh1, one slurmd per host, each
# node at its own NodeAddr (10.77.0.i). `sbatch jobs/frontera_rtx.slurm` sized down to
# 2 nodes x 1 CPU rank stages the dataset with jobs/stage_data.sh into each host's own
# /tmp (the default destination: node-local here), trains across the link (TCP only),
# writes checkpoints on rank 0's host only (--output-dir in /tmp) and removes the
# staged copies. Reuses tests/slurm/harness.sh's job helpers (rd_sbatch, rd_slurm_wait...).
set -euo pipefail
# shellcheck source=tests/multihost/harness.sh
source "$(dirname "$0")/harness.sh"
: "${RD_MH_RESNET_DDP:?}"
for tool in munged mungekey slurmctld slurmd sbatch srun scontrol sinfo squeue scancel; do
  command -v "$tool" >/dev/null 2>&1 || mh_skip "missing $tool (Debian packages slurm-wlm, munge)"
done
# shellcheck source=tests/slurm/harness.sh
source "$MH_REPO/tests/slurm/harness.sh"
mh_start 2 200
RD_SLURM_NODES=(mh1 mh2)
RD_SLURM_DIR=$MH_DIR/slurm
d=$RD_SLURM_DIR
mkdir -p "$d/munge" "$d/state" "$d/run" "$d/log" "$d/jobs" "$d/bin" "$d/spool/mh1" "$d/spool/mh2"
chmod 755 "$d" "$d/munge"
for var in $(compgen -e); do [[ $var == SLURM_* ]] && unset "$var"; done
export SLURM_CONF=$d/slurm.conf
{
  cat <<CONF
# Private test cluster written by tests/multihost/case_slurm.sh: nodes are namespace hosts
ClusterName=rdmh
SlurmctldHost=mh1($MH_SUBNET.1)
SlurmctldPort=6817
SlurmdPort=6818
CONF
  rd_slurm_conf_common "$d"
  cat <<CONF
NodeName=mh1 NodeAddr=$MH_SUBNET.1 CPUs=1 State=UNKNOWN
NodeName=mh2 NodeAddr=$MH_SUBNET.2 CPUs=1 State=UNKNOWN
PartitionName=$RD_SLURM_PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
} >"$SLURM_CONF"
# Slurm clients run on mh1 (the cluster's network is only there): wrappers on PATH.
for tool in sbatch scontrol squeue scancel sinfo srun; do
  printf '#!/bin/sh\nexec nsenter -t %s -n -u -m -- %s "$@"\n' "${MH_HOLDERS[1]}" "$(command -v "$tool")" >"$d/bin/$tool"
  chmod +x "$d/bin/$tool"
done
export PATH=$d/bin:$PATH

mungekey -c -k "$d/munge/munge.key" >/dev/null
mh_exec 1 munged -F --force --socket="$d/munge/socket" --key-file="$d/munge/munge.key" \
  --pid-file="$d/run/munged.pid" --log-file="$d/log/munged.log" --seed-file="$d/munge/seed" \
  >"$d/log/munged.out" 2>&1 &
for ((i = 0; i < 50; i++)); do [[ -S $d/munge/socket ]] && break; sleep 0.1; done
[[ -S $d/munge/socket ]] || mh_fail "munged did not start"
mh_exec 1 slurmctld -D -c -i >"$d/log/slurmctld.out" 2>&1 &
for h in 1 2; do mh_exec "$h" slurmd -D >"$d/log/slurmd.mh$h.out" 2>&1 & done
for ((i = 0; i < 100; i++)); do rd_nodes_idle && break; sleep 0.3; done
rd_nodes_idle || { tail -n 20 "$d"/log/* >&2; mh_fail "the two slurmd did not register"; }
addrs=$(timeout 10 scontrol show nodes | grep -o 'NodeAddr=[^ ]*' | sort | tr '\n' ' ')
[[ $addrs == "NodeAddr=$MH_SUBNET.1 NodeAddr=$MH_SUBNET.2 " ]] || mh_fail "node addresses: $addrs"
mh_log "Slurm up: $(timeout 10 sinfo -h -N -o '%N %T' | tr '\n' ' ')"

# Dataset packed like the reference data.tar.gz, on shared storage (/var/tmp).
mkdir -p "$d/data/src"
"$MH_BIN" synth --out "$d/data/src/Dataset_2" --train 48 --val 12 --size 40x40 --threads 1 >/dev/null
tar -czf "$d/data/data.tar.gz" -C "$d/data/src" Dataset_2
export RESNET_DDP_BIN=$MH_BIN RESNET_DDP_DATA_SRC=$d/data/data.tar.gz RESNET_DDP_MODULES="" RESNET_DDP_REQUEUE=0
unset RESNET_DDP_STAGE_DIR # default /tmp: each host's own
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=$MH_CIDR OMPI_MCA_oob_tcp_if_include=$MH_CIDR

cd "$d/jobs"
# CPU hosts: the GPU script asks for --device cuda unless told otherwise.
job=$(rd_sbatch -N 2 --ntasks-per-node=1 -t 5 "$MH_REPO/jobs/frontera_rtx.slurm" --device cpu --arch resnet_tiny \
  --image-size 32 --batch-size 2 --workers 1 --augment none --epochs 2 --output-dir /tmp/out)
result=$(rd_slurm_wait "$job" 150)
[[ $result == "COMPLETED 0:0" ]] || { rd_job_log "$job" >&2; tail -n 20 "$d"/log/slurm*.log >&2; mh_fail "job $job ended $result"; }
for h in 1 2; do
  rd_expect_log "$job" "^stage_data.sh: node mh$h: staged data.tar.gz to /tmp/Dataset_2 " 1
  rd_expect_log "$job" "^stage_data.sh: node mh$h: removed /tmp/Dataset_2\$" 1
  [[ ! -e $MH_DIR/h$h/tmp/Dataset_2 ]] || mh_fail "staged data left in mh$h's /tmp"
done
rd_expect_log "$job" "^rank 0/2: .* on node mh1," 1
rd_expect_log "$job" "^rank 1/2: .* on node mh2," 1
rd_expect_log "$job" "^\\(Epoch 2/2\\) Val loss: " 1
rd_expect_log "$job" "^Distributed environment has been properly closed\$" 1
# Checkpoints on rank 0's host only: its /tmp has them, mh2's has no output folder.
for f in best_model.h5 last.h5; do
  "$MH_BIN" info "$MH_DIR/h1/tmp/out/$f" >/dev/null || mh_fail "no loadable $f on mh1"
done
[[ ! -e $MH_DIR/h2/tmp/out ]] || mh_fail "rank 1 wrote into mh2's /tmp/out"
mh_log "PASS: sbatch frontera_rtx.slurm over 2 namespace hosts: staged per-host /tmp, trained, cleaned up"
