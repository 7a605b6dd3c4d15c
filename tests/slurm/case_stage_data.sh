#!/usr/bin/env bash
# jobs/stage_data.sh under Slurm on two emulated nodes (per-node folders DEST/%n, since
# both share this machine's /tmp): a tarball, a folder and a single .h5 file are staged on
# both nodes with identical contents; a second run skips identical copies; a damaged copy
# is staged again on that node only; a node that cannot stage is named and fails the job;
# --remove deletes every node's copy.
set -euo pipefail
# shellcheck source=tests/slurm/harness.sh
source "$(dirname "$0")/harness.sh"
rd_slurm_start 120

data=$RD_SLURM_DIR/data
stage=$data/stage
stage_data=$RD_REPO/jobs/stage_data.sh
mkdir -p "$data/src/Dataset_2/Train/C0" "$data/src/Dataset_2/Train/C2" "$data/src/Dataset_2/Validation/C0"
for i in 1 2 3 4 5; do
  head -c $((i * 1111)) /dev/urandom >"$data/src/Dataset_2/Train/C0/img $i.jpg"
  head -c $((i * 777)) /dev/urandom >"$data/src/Dataset_2/Train/C2/$i.png"
done
head -c 999 /dev/urandom >"$data/src/Dataset_2/Validation/C0/v.jpg"
tar -czf "$data/data.tar.gz" -C "$data/src" Dataset_2
head -c 54321 /dev/urandom >"$data/packed.h5"
files=$(find "$data/src/Dataset_2" -type f | wc -l)
bytes=$(find "$data/src/Dataset_2" -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')

# run_job NAME EXPECTED_STATE COMMAND: one 2-node job running COMMAND; prints the job id.
run_job() {
  local name=$1 expected=$2 command=$3 job result
  job=$(rd_sbatch -J "$name" -N 2 --ntasks-per-node=1 -t 2 --wrap "$command")
  result=$(rd_slurm_wait "$job" 60)
  if [[ ${result%% *} != "$expected" ]]; then
    rd_job_log "$job" >&2
    rd_fail "job $name ($job) ended $result, expected $expected"
  fi
  echo "$job"
}

# 1. First staging of a tarball: both nodes copy, and hold exactly the source tree.
job=$(run_job stage1 COMPLETED "$stage_data $data/data.tar.gz '$stage/%n'")
for node in "${RD_SLURM_NODES[@]}"; do
  rd_expect_log "$job" "^stage_data.sh: node $node: staged data.tar.gz to $stage/$node/Dataset_2 \\($files files, $bytes bytes\\) in [0-9.]+ s\$" 1
  diff -r "$data/src/Dataset_2" "$stage/$node/Dataset_2" || rd_fail "node $node's copy differs from the source"
done
rd_expect_log "$job" "^stage_data.sh: every node holds $files files, $bytes bytes at .*; total [0-9.]+ s\$" 1
rd_log "tarball staged on both nodes ($files files, $bytes bytes)"

# 2. Again: identical copies are skipped on both nodes.
job=$(run_job stage2 COMPLETED "$stage_data $data/data.tar.gz '$stage/%n'")
rd_expect_log "$job" "^stage_data.sh: node c001-00[12]: identical copy already at .*, skipped in" 2
rd_expect_log "$job" ": staged data.tar.gz" 0

# 3. Damage node 2's copy: only node 2 copies again.
rm "$stage/c001-002/Dataset_2/Train/C2/3.png"
job=$(run_job stage3 COMPLETED "$stage_data $data/data.tar.gz '$stage/%n'")
rd_expect_log "$job" "^stage_data.sh: node c001-001: identical copy already at" 1
rd_expect_log "$job" "^stage_data.sh: node c001-002: staged data.tar.gz" 1
diff -r "$data/src/Dataset_2" "$stage/c001-002/Dataset_2" || rd_fail "node 2 was not repaired"

# 4. A folder and a packed .h5 file as sources.
job=$(run_job stage4 COMPLETED "$stage_data $data/src/Dataset_2 '$data/dirstage/%n' && $stage_data $data/packed.h5 '$data/h5stage/%n'")
for node in "${RD_SLURM_NODES[@]}"; do
  diff -r "$data/src/Dataset_2" "$data/dirstage/$node/Dataset_2" || rd_fail "folder copy on $node differs"
  cmp "$data/packed.h5" "$data/h5stage/$node/packed.h5" || rd_fail ".h5 copy on $node differs"
done
rd_expect_log "$job" "^stage_data.sh: every node holds 1 files, 54321 bytes at" 1

# 5. A node that cannot stage (its folder is a plain file) is named; the job fails.
mkdir -p "$data/badstage"
: >"$data/badstage/c001-002"
job=$(run_job stage5 FAILED "$stage_data $data/data.tar.gz '$data/badstage/%n'")
rd_expect_log "$job" "^stage_data.sh: node c001-002: FAILED" 1
rd_expect_log "$job" "^stage_data.sh: error: staging failed on: c001-002 \\(failed" 1
[[ -d $data/badstage/c001-001/Dataset_2 ]] || rd_fail "node 1 should still have staged"

# 6. --remove deletes every node's copy (and its record).
job=$(run_job remove COMPLETED "$stage_data --remove $data/data.tar.gz '$stage/%n'")
rd_expect_log "$job" "^stage_data.sh: node c001-00[12]: removed $stage/c001-00[12]/Dataset_2\$" 2
leftover=$(find "$stage" -mindepth 2)
[[ -z $leftover ]] || rd_fail "left behind after --remove: $leftover"

# 7. Bad invocations fail clearly without touching anything.
out=$("$stage_data" "$data/missing.tar.gz" "$stage" 2>&1) && rd_fail "a missing source must fail"
[[ $out == *"source $data/missing.tar.gz does not exist"* ]] || rd_fail "unclear message: $out"
out=$("$stage_data" only-one-arg 2>&1) && rd_fail "a missing DEST must fail"
[[ $out == *"stage_data.sh SRC DEST"* ]] || rd_fail "no usage text: $out"
rd_log "PASS: staging, skip, repair, failure naming and removal on both nodes"
