#!/usr/bin/env bash
# A dataset of .tif/.tiff/.webp files (torchvision's ImageFolder reads them) trains,
# predicts and packs; files skipped for their extension are counted by extension in
# the scan line, and a dataset of only such files fails naming them.
source "$(dirname "$0")/common.sh"
/usr/bin/python3 -c 'import PIL.features as f; assert f.check("webp") and f.check("libtiff")' 2>/dev/null ||
  { echo "SKIP: Debian python3-pil with WebP and libtiff is not installed" >&2; exit 77; }

synth_data "$WORK/png" 12 6
# Convert every PNG: a third each to .tif (LZW), .tiff (raw) and .webp (lossless).
/usr/bin/python3 - "$WORK/png" "$WORK/data" <<'PY'
import os, sys
from PIL import Image
src, dst = sys.argv[1], sys.argv[2]
i = 0
for root, _, files in sorted(os.walk(src)):
    for f in sorted(files):
        out_dir = os.path.join(dst, os.path.relpath(root, src))
        os.makedirs(out_dir, exist_ok=True)
        im = Image.open(os.path.join(root, f)).convert("RGB")
        stem = os.path.splitext(f)[0]
        kind = i % 3
        i += 1
        if kind == 0:
            im.save(os.path.join(out_dir, stem + ".tif"), compression="tiff_lzw")
        elif kind == 1:
            im.save(os.path.join(out_dir, stem + ".tiff"))
        else:
            im.save(os.path.join(out_dir, stem + ".webp"), lossless=True)
PY
echo "not an image" >"$WORK/data/Train/C0/notes.txt"
echo "not an image" >"$WORK/data/Train/C2/photo.heic"
echo "not an image" >"$WORK/data/Train/C4/photo2.heic"

note "train and predict on TIFF and WebP"
"$RD_BIN" --data "$WORK/data" "${TINY[@]}" --batch-size 4 --epochs 1 --output-dir "$WORK/out" >"$WORK/train.log" 2>&1 ||
  { cat "$WORK/train.log"; fail "training on TIFF/WebP"; }
grep -q -x -F "Train set size: 12, Validation set size: 6" "$WORK/train.log" || { cat "$WORK/train.log"; fail "set sizes"; }
grep -q -F "Train: 12 images in 3 classes from $WORK/data/Train (0 skipped, 3 non-image files ignored: 2 .heic, 1 .txt)" \
  "$WORK/train.log" || { cat "$WORK/train.log"; fail "the scan line does not count the ignored extensions"; }
"$RD_BIN" predict --checkpoint "$WORK/out/best_model.h5" --threads 1 "$WORK/data" >"$WORK/pred.log" 2>&1 ||
  { cat "$WORK/pred.log"; fail "predict"; }
grep -q -E '^Accuracy: [0-9.]+ \([0-9]+/6\)$' "$WORK/pred.log" || { cat "$WORK/pred.log"; fail "predict over 6 images"; }

note "the decoded pixels equal the PNGs' (lossless formats)"
"$RD_BIN" pack --data "$WORK/png" --out "$WORK/png.h5" --image-size 32 --threads 1 >/dev/null || fail "pack png"
"$RD_BIN" pack --data "$WORK/data" --out "$WORK/tw.h5" --image-size 32 --threads 1 >/dev/null || fail "pack tiff/webp"
if command -v h5diff >/dev/null; then
  for s in Train Validation; do
    h5diff "$WORK/png.h5" "$WORK/tw.h5" "/$s/images" "/$s/images" >/dev/null || fail "$s: TIFF/WebP pixels differ from the PNGs'"
  done
fi

note "a dataset of files this program does not read: the error names their extensions"
mkdir -p "$WORK/heic/Train/a" "$WORK/heic/Train/b" "$WORK/heic/Validation/a" "$WORK/heic/Validation/b"
for d in "$WORK"/heic/*/*; do touch "$d/x.heic" "$d/y.HEIC"; done
rc=0
"$RD_BIN" --data "$WORK/heic" "${TINY[@]}" --output-dir "$WORK/o2" >"$WORK/heic.log" 2>&1 || rc=$?
cat "$WORK/heic.log"
[ "$rc" = 2 ] || fail "exit $rc, expected 2"
grep -q -F "no usable image in the Train split; 4 file(s) skipped for their extension: 4 .heic" "$WORK/heic.log" ||
  fail "the error does not name the extension"
note "ok"
