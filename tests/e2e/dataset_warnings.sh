#!/usr/bin/env bash
# Datasets that load but make a meaningless or degraded run are warned about at start
# (training and --check): a single class (accuracy trivially 1.0) and a packed file whose
# images are smaller than --image-size (silently upsampled).
source "$(dirname "$0")/common.sh"

synth_data "$WORK/one" 12 6
rm -rf "$WORK/one/Train/C2" "$WORK/one/Train/C4" "$WORK/one/Validation/C2" "$WORK/one/Validation/C4"
args=(--arch resnet_tiny --threads 1 --workers 1 --batch-size 4 --epochs 1 --log-every 0)

note "a 1-class dataset"
"$RD_BIN" --data "$WORK/one" "${args[@]}" --image-size 32 --output-dir "$WORK/o1" >"$WORK/l1" 2>&1 ||
  { cat "$WORK/l1"; fail "1-class training"; }
grep -q -F "resnet_ddp: warning: ImageFolder $WORK/one/Train has a single class ('C0'): every prediction is that class" \
  "$WORK/l1" || { cat "$WORK/l1"; fail "no single-class warning"; }
"$RD_BIN" --check --data "$WORK/one" "${args[@]}" --image-size 32 --output-dir "$WORK/o9" >"$WORK/c1" 2>&1 ||
  { cat "$WORK/c1"; fail "--check"; }
grep -q -F "has a single class" "$WORK/c1" || { cat "$WORK/c1"; fail "--check: no single-class warning"; }

note "a 32 px pack trained at 64 px, and at 32 px"
synth_data "$WORK/data" 12 6
"$RD_BIN" pack --data "$WORK/data" --out "$WORK/p32.h5" --image-size 32 --threads 1 >/dev/null || fail "pack"
"$RD_BIN" --data "$WORK/p32.h5" "${args[@]}" --image-size 64 --output-dir "$WORK/o2" >"$WORK/l2" 2>&1 ||
  { cat "$WORK/l2"; fail "upsampled training"; }
grep -q -F "stores 32x32 images, smaller than --image-size 64: they are upsampled" "$WORK/l2" ||
  { cat "$WORK/l2"; fail "no upsampling warning"; }
"$RD_BIN" --data "$WORK/p32.h5" "${args[@]}" --image-size 32 --output-dir "$WORK/o3" >"$WORK/l3" 2>&1 ||
  { cat "$WORK/l3"; fail "32 px training"; }
! grep -q 'warning' "$WORK/l3" || { cat "$WORK/l3"; fail "a warning for a fitting pack"; }
note "ok"
