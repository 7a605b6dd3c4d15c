#!/usr/bin/env bash
# Outside a job, jobs/cpu.slurm only checks the set-up (a missing dataset is an error).
# Submitted, it trains on 2 emulated nodes x 1 rank: the data are staged on both nodes,
# each rank reads its own node's copy, training completes with the reference output, only
# rank 0 writes checkpoints, and the staged copies are gone afterwards. Then a job whose
# training fails (an unknown flag) still removes the staged copies, and reports the failure.
set -euo pipefail
# shellcheck source=tests/slurm/harness.sh
source "$(dirname "$0")/harness.sh"
# shellcheck source=tests/slurm/train_common.sh
source "$(dirname "$0")/train_common.sh"
rd_slurm_start 170
rd_make_dataset 24 12 40x40
out=$RD_SLURM_DIR/out

# Pre-flight outside any job (as on a login node): checks and prints, starts nothing.
preflight=$(bash "$RD_REPO/jobs/cpu.slurm" --epochs 1 2>&1) || rd_fail "pre-flight failed: $preflight"
[[ $preflight == *"Training command: mpirun -np NTASKS $RESNET_DDP_BIN --data $RD_STAGE/"*"/Dataset_2 --output-dir output_model/cpu_JOBID --epochs 1"* &&
  $preflight == *"set-up looks complete; submit it with: sbatch $RD_REPO/jobs/cpu.slurm"* ]] ||
  rd_fail "unexpected pre-flight output: $preflight"
# The per-job --output-dir default goes on the command line, which resnet_ddp lets win
# over a --config file: it is left out when the file (or an alias, --output) names one.
printf 'epochs = 1\noutput_dir = runs/a\n' >"$RD_SLURM_DIR/recipe.conf"
preflight=$(bash "$RD_REPO/jobs/cpu.slurm" --config "$RD_SLURM_DIR/recipe.conf" 2>&1) || rd_fail "pre-flight failed: $preflight"
[[ $preflight == *"/Dataset_2 --config $RD_SLURM_DIR/recipe.conf"* ]] || rd_fail "config file: output folder added: $preflight"
printf 'epochs: 1\noutput_dir: runs/y\n' >"$RD_SLURM_DIR/recipe.yaml"
preflight=$(bash "$RD_REPO/jobs/cpu.slurm" --config "$RD_SLURM_DIR/recipe.yaml" 2>&1) || rd_fail "pre-flight failed: $preflight"
[[ $preflight == *"/Dataset_2 --config $RD_SLURM_DIR/recipe.yaml"* ]] || rd_fail "YAML config file: output folder added: $preflight"
preflight=$(bash "$RD_REPO/jobs/cpu.slurm" --output runs/b 2>&1) || rd_fail "pre-flight failed: $preflight"
[[ $preflight == *"/Dataset_2 --output runs/b"* ]] || rd_fail "--output: output folder added: $preflight"
preflight=$(RESNET_DDP_DATA_SRC=$RD_SLURM_DIR/missing.tar.gz bash "$RD_REPO/jobs/cpu.slurm" 2>&1) &&
  rd_fail "pre-flight accepted a missing dataset: $preflight"
[[ $preflight == *"dataset $RD_SLURM_DIR/missing.tar.gz does not exist"* ]] || rd_fail "unclear: $preflight"

cd "$RD_SLURM_DIR/jobs"
# The output folder holds %n as well, so a checkpoint written by the rank on the second
# node would show up under out/c001-002.
job=$(rd_sbatch -N 2 --ntasks-per-node=1 -t 3 "$RD_REPO/jobs/cpu.slurm" \
  --arch resnet_tiny --image-size 32 --batch-size 4 --epochs 2 --workers 1 --augment none \
  --output-dir "$out/%n")
result=$(rd_slurm_wait "$job" 120)
[[ $result == "COMPLETED 0:0" ]] || { rd_job_log "$job" >&2; rd_fail "training job $job ended $result"; }
rd_expect_log "$job" "^Training command: mpirun -np 2 $RD_REPO/jobs/on_node.sh $RESNET_DDP_BIN --data $RD_STAGE/%n/Dataset_2 --threads 1 --arch resnet_tiny .* --output-dir $out/%n\$" 1
rd_expect_log "$job" "^stage_data.sh: every node holds 36 files, [0-9]+ bytes at" 1
rd_expect_log "$job" "^Train set size: 24, Validation set size: 12\$" 1
rd_expect_log "$job" "^\\(Epoch 2/2\\) Val loss: " 1
rd_expect_log "$job" "^Best model \\(val loss: .*\\) has been saved to " 1
rd_expect_log "$job" "^Distributed environment has been properly closed\$" 1
[[ -f $out/c001-001/last.h5 && -f $out/c001-001/best_model.h5 ]] ||
  rd_fail "rank 0 wrote no checkpoints: $(ls -la "$out/c001-001" 2>&1)"
h5_on_node2=$(find "$out/c001-002" -name '*.h5' 2>/dev/null || true)
[[ -z $h5_on_node2 ]] || rd_fail "rank 1 wrote checkpoints too: $h5_on_node2"
rd_expect_staged_and_removed "$job"
rd_log "training job passed"

# Training fails: the job fails with the program's status, and still cleans up.
job=$(rd_sbatch -N 2 --ntasks-per-node=1 -t 3 "$RD_REPO/jobs/cpu.slurm" --no-such-flag)
result=$(rd_slurm_wait "$job" 60)
[[ $result == FAILED* && $result != *" 0:0" ]] || { rd_job_log "$job" >&2; rd_fail "failing job $job ended $result"; }
rd_expect_log "$job" "--no-such-flag" 
rd_expect_log "$job" "^cpu.slurm: removing the staged data from every node\$" 1
rd_expect_staged_and_removed "$job"
rd_log "PASS: CPU training on 2 nodes, rank-0 checkpoints, staging and clean-up on success and failure"
