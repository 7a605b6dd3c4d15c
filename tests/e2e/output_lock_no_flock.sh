#!/usr/bin/env bash
# On a file system without flock the run is not refused (exit 2, as before) but goes on
# unguarded with one warning naming the folder and the reason (review ecosystem D15).
source "$(dirname "$0")/common.sh"
[ -n "${RD_NO_FLOCK_LIB:-}" ] && [ -f "$RD_NO_FLOCK_LIB" ] || fail "RD_NO_FLOCK_LIB is not set to the shim"

synth_data "$WORK/data" 8 4
OUT="$WORK/out"
LD_PRELOAD=$RD_NO_FLOCK_LIB${LD_PRELOAD:+:$LD_PRELOAD} "$RD_BIN" --data "$WORK/data" "${TINY[@]}" --batch-size 4 --epochs 1 --max-steps 1 \
  --output-dir "$OUT" >"$WORK/log" 2>&1 || { cat "$WORK/log"; fail "the run failed on a file system without flock"; }
cat "$WORK/log"
grep -q -F "resnet_ddp: warning: --output-dir: the file system of '$OUT' does not support flock (Function not implemented" "$WORK/log" ||
  fail "no warning naming the folder and the reason"
grep -q "^(Epoch 1/1) Val loss" "$WORK/log" || fail "it did not train"
[ -s "$OUT/last.h5" ] || fail "no checkpoint"
echo PASS
