#!/usr/bin/env bash
# on_node.sh PROGRAM ARGS...: runs PROGRAM with every "%n" in ARGS replaced by the name of
# the node this rank runs on. The job scripts insert it only when RESNET_DDP_STAGE_DIR
# contains %n, i.e. when several "nodes" share one /tmp (Slurm test set-ups) and each rank
# must read its own node's staged copy.
set -euo pipefail
(($# >= 1)) || { echo "usage: on_node.sh PROGRAM [ARGS...]" >&2; exit 2; }
node=${SLURMD_NODENAME:-$(hostname -s)}
args=()
for arg in "$@"; do
  args+=("${arg//%n/$node}")
done
exec "${args[@]}"
