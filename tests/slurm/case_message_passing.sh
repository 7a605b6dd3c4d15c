#!/usr/bin/env bash
# jobs/message_passing.slurm across the two emulated nodes (1 rank each) prints the
# tutorial's lines, also with threaded ranks bound to their socket; with srun --mpi=pmix as launcher and a `module` command present too;
# RESNET_DDP_LAUNCHER's variables are read at job time; a rank count that vanished at
# submission (double quotes) or a variable unset in the job is refused naming it; a
# launcher that does not exist fails the job with a message naming it.
set -euo pipefail
# shellcheck source=tests/slurm/harness.sh
source "$(dirname "$0")/harness.sh"
: "${RESNET_DDP_MESSAGE_PASSING_BIN:?set it to the message_passing program}"
export RESNET_DDP_MESSAGE_PASSING_BIN
rd_slurm_start 90

# Submitted from an unrelated directory: the script must find its helpers on its own.
cd "$RD_SLURM_DIR/jobs"
job=$(rd_sbatch -N 2 --ntasks-per-node=1 -t 2 "$RD_REPO/jobs/message_passing.slurm")
result=$(rd_slurm_wait "$job" 60)
[[ $result == "COMPLETED 0:0" ]] || { rd_job_log "$job" >&2; rd_fail "job $job ended $result"; }
rd_expect_log "$job" '^Training command: mpirun -np 2 .*/message_passing$' 1
rd_expect_log "$job" '^worker_0 sent data to Rank 1$' 1
rd_expect_log "$job" '^worker_1 has received data from rank 0$' 1
rd_expect_log "$job" '^message_passing.slurm: 2 rank\(s\) on 2 node\(s\) \(1 per node\)' 1

# Threaded ranks: the default launcher binds each rank to its socket (no binding where
# this machine has 2 sockets and a node 1 rank; mpirun alone would pin each of 2 ranks to
# one core), and Open MPI under Slurm accepts that binding.
job=$(RESNET_DDP_THREADS=2 rd_sbatch -N 2 --ntasks-per-node=1 -t 2 "$RD_REPO/jobs/message_passing.slurm")
result=$(rd_slurm_wait "$job" 60)
[[ $result == "COMPLETED 0:0" ]] || { rd_job_log "$job" >&2; rd_fail "threaded job $job ended $result"; }
rd_expect_log "$job" '^message_passing.slurm: binding for 2 thread\(s\) per rank on [0-9]+ socket\(s\) per node: (--map-by ppr:1:socket --bind-to socket|--bind-to none)$' 1
rd_expect_log "$job" '^Training command: mpirun -np 2 (--map-by ppr:1:socket --bind-to socket|--bind-to none) .*/message_passing$' 1
rd_expect_log "$job" '^worker_1 has received data from rank 0$' 1

# Launcher override, modules through a stand-in `module` command, and the script submitted
# by a relative path from / (Slurm then records "//<repo>/jobs/...": the printed folder
# must still be normalised, wherever the clone lives).
module() { echo "stand-in module command: $*"; }
export -f module
export RESNET_DDP_LAUNCHER="srun --mpi=pmix" RESNET_DDP_MODULES="gcc/12 openmpi/4.1"
cd /
job=$(rd_sbatch -N 2 --ntasks-per-node=1 -t 2 "${RD_REPO#/}/jobs/message_passing.slurm")
result=$(rd_slurm_wait "$job" 60)
[[ $result == "COMPLETED 0:0" ]] || { rd_job_log "$job" >&2; rd_fail "job $job ended $result"; }
rd_expect_log "$job" "^message_passing.slurm: job [0-9]+ \\(message_passing\\) on c001-001 c001-002 from $RD_REPO/jobs\$" 1
rd_expect_log "$job" '^stand-in module command: load gcc/12 openmpi/4.1$' 1
rd_expect_log "$job" '^Training command: srun --mpi=pmix .*/message_passing$' 1
rd_expect_log "$job" '^worker_0 sent data to Rank 1$' 1
rd_expect_log "$job" '^worker_1 has received data from rank 0$' 1

# RESNET_DDP_LAUNCHER as docs/slurm.md writes it, in single quotes: Slurm's variables are
# read when the job runs (not where it is submitted); the pre-flight keeps them as text.
export RESNET_DDP_MODULES=
cd "$RD_SLURM_DIR/jobs"
# shellcheck disable=SC2016 # expanded by the job script, at job time
export RESNET_DDP_LAUNCHER='mpirun -np $SLURM_NTASKS --map-by ppr:1:node'
preflight=$(bash "$RD_REPO/jobs/message_passing.slurm" 2>&1) || rd_fail "pre-flight failed: $preflight"
# shellcheck disable=SC2016 # the text the pre-flight prints
[[ $preflight == *'Training command: mpirun -np \$SLURM_NTASKS --map-by ppr:1:node '* ]] ||
  rd_fail "pre-flight: unexpected launcher: $preflight"
job=$(rd_sbatch -N 2 --ntasks-per-node=1 -t 2 "$RD_REPO/jobs/message_passing.slurm")
result=$(rd_slurm_wait "$job" 60)
[[ $result == "COMPLETED 0:0" ]] || { rd_job_log "$job" >&2; rd_fail "job $job ended $result"; }
rd_expect_log "$job" '^Training command: mpirun -np 2 --map-by ppr:1:node .*/message_passing$' 1
rd_expect_log "$job" '^worker_1 has received data from rank 0$' 1
# The same in double quotes on the login node: the rank count is gone. Refused before
# submission, and by the job itself.
export RESNET_DDP_LAUNCHER="mpirun -np ${RD_UNSET_IN_THIS_SHELL:-} --map-by ppr:1:node"
preflight=$(bash "$RD_REPO/jobs/message_passing.slurm" 2>&1) && rd_fail "pre-flight accepted '$RESNET_DDP_LAUNCHER'"
[[ $preflight == *"'-np' is followed by '--map-by', not a number of ranks"*"single quotes"* ]] ||
  rd_fail "pre-flight: unclear error: $preflight"
job=$(rd_sbatch -N 2 --ntasks-per-node=1 -t 2 "$RD_REPO/jobs/message_passing.slurm")
result=$(rd_slurm_wait "$job" 60)
[[ $result == "FAILED 1:0" ]] || { rd_job_log "$job" >&2; rd_fail "job $job ended $result, expected FAILED 1:0"; }
rd_expect_log "$job" "'-np' is followed by '--map-by', not a number of ranks" 1
# shellcheck disable=SC2016
export RESNET_DDP_LAUNCHER='mpirun -np $RD_NOT_SET_ANYWHERE'
job=$(rd_sbatch -N 2 --ntasks-per-node=1 -t 2 "$RD_REPO/jobs/message_passing.slurm")
result=$(rd_slurm_wait "$job" 60)
[[ $result == "FAILED 1:0" ]] || { rd_job_log "$job" >&2; rd_fail "job $job ended $result, expected FAILED 1:0"; }
# shellcheck disable=SC2016 # a regular expression matching the job's message
rd_expect_log "$job" 'RESNET_DDP_LAUNCHER uses \$RD_NOT_SET_ANYWHERE, which is not set in this job' 1

export RESNET_DDP_LAUNCHER="no-such-launcher -n 2"
job=$(rd_sbatch -N 2 --ntasks-per-node=1 -t 2 "$RD_REPO/jobs/message_passing.slurm")
result=$(rd_slurm_wait "$job" 60)
[[ $result == "FAILED 1:0" ]] || { rd_job_log "$job" >&2; rd_fail "job $job ended $result, expected FAILED 1:0"; }
rd_expect_log "$job" "^message_passing.slurm: error: launcher 'no-such-launcher' not found" 1
rd_log "PASS: message_passing over 2 emulated nodes with mpirun and srun --mpi=pmix"
