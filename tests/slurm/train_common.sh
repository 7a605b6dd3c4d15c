# shellcheck shell=bash
# Shared by the training cases: a small synthetic dataset packed like the reference
# data.tar.gz (one Dataset_2/ folder), staged into per-node folders.
: "${RESNET_DDP_BIN:?set it to the resnet_ddp program}"
[[ -x $RESNET_DDP_BIN ]] || rd_fail "RESNET_DDP_BIN=$RESNET_DDP_BIN is not an executable (build the resnet_ddp target)"
export RESNET_DDP_BIN

# rd_make_dataset TRAIN VAL SIZE: writes $RD_SLURM_DIR/data/data.tar.gz and exports the
# job scripts' dataset variables.
rd_make_dataset() {
  local data=$RD_SLURM_DIR/data
  mkdir -p "$data/src"
  "$RESNET_DDP_BIN" synth --out "$data/src/Dataset_2" --train "$1" --val "$2" --size "$3" \
    --threads 1 >"$data/synth.log" 2>&1 || {
    cat "$data/synth.log" >&2
    rd_fail "resnet_ddp synth failed"
  }
  tar -czf "$data/data.tar.gz" -C "$data/src" Dataset_2
  RD_STAGE=$data/stage
  export RESNET_DDP_DATA_SRC=$data/data.tar.gz
  export RESNET_DDP_STAGE_DIR=$RD_STAGE/%n
  export RESNET_DDP_MODULES=""
}

# rd_expect_staged JOB: both nodes staged the dataset in JOB and nothing is left now.
rd_expect_staged_and_removed() {
  local job=$1 node leftover
  for node in "${RD_SLURM_NODES[@]}"; do
    rd_expect_log "$job" "^stage_data.sh: node $node: staged data.tar.gz to $RD_STAGE/$node/Dataset_2 " 1
    rd_expect_log "$job" "^stage_data.sh: node $node: removed $RD_STAGE/$node/Dataset_2\$" 1
  done
  leftover=$(find "$RD_STAGE" -mindepth 2 2>/dev/null || true)
  [[ -z $leftover ]] || rd_fail "staged data left behind after job $job: $leftover"
}
