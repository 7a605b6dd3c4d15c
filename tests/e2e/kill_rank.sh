#!/usr/bin/env bash
# kill -9 of rank 1 mid-training: rank 0 must not hang; the job ends non-zero
# within 30 s and the output names the lost rank.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 1200 40
mpi 2 --data "$WORK/data" --arch resnet_tiny --image-size 96 --threads 1 --workers 1 --batch-size 2 \
  --epochs 3 --output-dir "$WORK/out" --log-every 1 --progress lines >"$WORK/log" 2>&1 &
job=$!
deadline=$((SECONDS + 60))
until grep -q "(Epoch 1/3) step 3/" "$WORK/log" 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || { cat "$WORK/log"; fail "training did not start"; }
  sleep 0.05
done
victim=""
for pid in $(pgrep -P "$job") $(for c in $(pgrep -P "$job"); do pgrep -P "$c"; done); do
  if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then victim=$pid; fi
done
[ -n "$victim" ] || fail "cannot find rank 1"
start=$SECONDS
kill -KILL "$victim"
rc=0
wait "$job" || rc=$?
elapsed=$((SECONDS - start))
tail -n 15 "$WORK/log"
[ "$rc" != 0 ] || fail "the job reported success after losing a rank"
[ "$elapsed" -lt 30 ] || fail "took ${elapsed}s to stop after rank 1 died (limit 30 s)"
grep -q -i "rank 1" "$WORK/log" || fail "no message names the lost rank 1"
note "ok: stopped ${elapsed}s after kill -9 of rank 1 (status $rc)"
