#!/usr/bin/env bash
# Damaged checkpoints through the program itself: a real last.h5 truncated, with a
# bit flipped in its tensors, in its HDF5 metadata and in its checksum header. Each
# of `info`, `predict`, `--init` and `--resume` must exit with status 2 and an error
# naming the file, within a timeout (no crash, no hang). The exhaustive version
# (hundreds of offsets and bits, in process) is tests/train/test_checkpoint_damage.cpp.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 12 6
OUT="$WORK/out"
run=(--data "$WORK/data" "${TINY[@]}" --batch-size 4 --epochs 1 --max-steps 1 --conv-algo direct)
"$RD_BIN" "${run[@]}" --output-dir "$OUT" >"$WORK/log" 2>&1 || { cat "$WORK/log"; fail "setup run"; }
good="$OUT/last.h5"
size=$(stat -c %s "$good")

# flip FILE OFFSET: xor one byte with 0x10.
flip() {
  local b
  b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
  printf '%b' "$(printf '\\%03o' $((b ^ 16)))" | dd of="$1" bs=1 seek="$2" count=1 conv=notrunc status=none
}
mk() { cp "$good" "$WORK/$1.h5"; }
mk truncated && truncate -s $((size / 2)) "$WORK/truncated.h5"
mk tensor && flip "$WORK/tensor.h5" $((size - 2000))
mk metadata && flip "$WORK/metadata.h5" 600       # HDF5 superblock / root group, after the 512-byte header
mk header && flip "$WORK/header.h5" 40            # inside the "crc32 ..." line

for f in truncated tensor metadata header; do
  file="$WORK/$f.h5"
  for cmd in info predict init resume; do
    case $cmd in
      info) args=(info "$file") ;;
      predict) args=(predict --checkpoint "$file" "$WORK/data") ;;
      init) args=("${run[@]}" --output-dir "$WORK/o_init" --init "$file") ;;
      resume) args=("${run[@]}" --output-dir "$WORK/o_resume" --epochs 2 --resume "$file") ;;
    esac
    rc=0
    timeout 300 "$RD_BIN" "${args[@]}" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
    [ "$rc" = 2 ] || { cat "$WORK/out.txt" "$WORK/err.txt"; fail "$cmd on the $f file exited $rc, expected 2"; }
    grep -q -F "checkpoint '$file'" "$WORK/err.txt" || { cat "$WORK/err.txt"; fail "$cmd on the $f file: file not named"; }
    echo "$f / $cmd: $(grep -m1 'error' "$WORK/err.txt")"
  done
done
note "ok"
