#!/usr/bin/env bash
# predict and --eval-only never classify a file they could not read: such a file is an
# error naming it (exit 2), or with --skip-unreadable a counted skip that the accuracy
# leaves out. Both read a folder that has only the split they score (the classes come
# from the checkpoint), and their errors name their own inputs, not train's --data.
source "$(dirname "$0")/common.sh"

synth_data "$WORK/data" 24 9
OUT="$WORK/out"
"$RD_BIN" --data "$WORK/data" "${TINY[@]}" --batch-size 4 --epochs 1 --output-dir "$OUT" >"$WORK/train.log" 2>&1 ||
  { cat "$WORK/train.log"; fail "training"; }
CK="$OUT/best_model.h5"
good=$(find "$WORK/data/Validation/C0" -name '*.png' | sort | head -n 1)

# Three inputs that are no image this program reads, one good image.
printf 'II*\0not really a tiff' >"$WORK/x.tif"
head -c 300 /dev/urandom >"$WORK/junk.jpg"
echo "read me" >"$WORK/readme.txt"

# expect_rc WANT LOG CMD...: runs CMD, output in LOG; its status must be WANT.
expect_rc() {
  local want=$1 log=$2 rc=0
  shift 2
  "$@" >"$log" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || { cat "$log"; fail "$(basename "$log"): exit $rc, expected $want"; }
}

note "unreadable files named on the command line: exit 2, each named"
expect_rc 2 "$WORK/p1" "$RD_BIN" predict --checkpoint "$CK" --threads 1 "$WORK/x.tif" "$WORK/junk.jpg" \
  "$WORK/readme.txt" "$good"
cat "$WORK/p1"
for f in x.tif junk.jpg readme.txt; do grep -q -F "$WORK/$f" "$WORK/p1" || fail "the error does not name $f"; done
grep -q -F -- "--skip-unreadable" "$WORK/p1" || fail "the error does not name the way out"
! grep -q -F "p(C0)" "$WORK/p1" || fail "a table was printed although inputs were unreadable"

note "--skip-unreadable: the good image only, the skips counted"
expect_rc 0 "$WORK/p2" "$RD_BIN" predict --checkpoint "$CK" --threads 1 --skip-unreadable "$WORK/x.tif" \
  "$WORK/junk.jpg" "$WORK/readme.txt" "$good"
cat "$WORK/p2"
grep -q -F "$good" "$WORK/p2" || fail "the good image is missing"
for f in x.tif junk.jpg readme.txt; do
  grep -q -F "warning: skipping $WORK/$f" "$WORK/p2" || fail "$f: no skip warning"
  ! grep -q -E "^$WORK/$f +C" "$WORK/p2" || fail "$f was classified"
done
grep -q -F "Skipped 3 file(s) that could not be read" "$WORK/p2" || fail "no skip count in the summary"

note "a labelled folder with 2 broken files and 1 good one"
mkdir -p "$WORK/lab/C0" "$WORK/lab/C2"
cp "$good" "$WORK/lab/C0/good.png"
cp "$WORK/junk.jpg" "$WORK/lab/C2/broken.jpg"
printf '\x89PNG\r\n\x1a\n truncated' >"$WORK/lab/C2/broken.png"
echo notes >"$WORK/lab/C2/notes.txt"
expect_rc 2 "$WORK/p3" "$RD_BIN" predict --checkpoint "$CK" --threads 1 "$WORK/lab"
cat "$WORK/p3"
grep -q -F "$WORK/lab/C2/broken.jpg" "$WORK/p3" && grep -q -F "$WORK/lab/C2/broken.png" "$WORK/p3" ||
  fail "the broken files are not named"
! grep -q '^Accuracy' "$WORK/p3" || fail "an accuracy was printed"
expect_rc 0 "$WORK/p4" "$RD_BIN" predict --checkpoint "$CK" --threads 1 --skip-unreadable "$WORK/lab"
cat "$WORK/p4"
grep -q -E '^Accuracy: [0-9.]+ \([01]/1\)$' "$WORK/p4" || fail "the accuracy counts unreadable files"
grep -q -F "Skipped 2 file(s)" "$WORK/p4" || fail "skips not counted"
grep -q -F "Ignored 1 file(s) without an image extension" "$WORK/p4" || fail "non-image file not reported"
expect_rc 0 "$WORK/p5.json" "$RD_BIN" predict --checkpoint "$CK" --threads 1 --skip-unreadable --json "$WORK/lab"
grep -q '"skipped_unreadable": 2' "$WORK/p5.json" && grep -q '"labelled": 1' "$WORK/p5.json" ||
  { cat "$WORK/p5.json"; fail "JSON: skips not counted or counted as labelled"; }
if [ -x /usr/bin/python3 ]; then
  /usr/bin/python3 -c 'import json,sys; json.load(open(sys.argv[1]))' <(sed '/^warning: /d; /^predict: device /d' "$WORK/p5.json") ||
    fail "JSON does not parse"
fi

note "a dataset root with only Validation/ (no Train/)"
mkdir -p "$WORK/valonly"
cp -r "$WORK/data/Validation" "$WORK/valonly/"
expect_rc 0 "$WORK/p6" "$RD_BIN" predict --checkpoint "$CK" --threads 1 "$WORK/valonly"
grep -q -E '^Accuracy: [0-9.]+ \([0-9]+/9\)$' "$WORK/p6" || { cat "$WORK/p6"; fail "predict on a Validation-only root"; }
expect_rc 0 "$WORK/e1" "$RD_BIN" --data "$WORK/valonly" --threads 1 --workers 1 --eval-only --resume "$CK"
cat "$WORK/e1"
grep -q -E '^Val loss: .*, Val accuracy: ' "$WORK/e1" || fail "--eval-only on a Validation-only root"
grep -q -F "Validation set size: 9" "$WORK/e1" || fail "--eval-only: validation set size"

note "predict's errors name its input, not --data"
mkdir -p "$WORK/trainonly"
cp -r "$WORK/data/Train" "$WORK/trainonly/"
expect_rc 2 "$WORK/p7" "$RD_BIN" predict --checkpoint "$CK" --threads 1 --split Test "$WORK/data"
cat "$WORK/p7"
! grep -q -F -- "--data" "$WORK/p7" || fail "predict's error names --data"
grep -q -F "input $WORK/data: no folder 'Test'" "$WORK/p7" || fail "predict's error does not name its input"
expect_rc 2 "$WORK/p8" "$RD_BIN" predict --checkpoint "$CK" --threads 1 "$WORK/nothere.h5"
! grep -q -F -- "--data" "$WORK/p8" || { cat "$WORK/p8"; fail "predict's missing-input error names --data"; }

note "--eval-only with an unreadable validation image"
cp "$WORK/junk.jpg" "$WORK/valonly/Validation/C0/zz_broken.jpg"
expect_rc 2 "$WORK/e2" "$RD_BIN" --data "$WORK/valonly" --threads 1 --workers 1 --eval-only --resume "$CK"
cat "$WORK/e2"
grep -q -F "$WORK/valonly/Validation/C0/zz_broken.jpg" "$WORK/e2" || fail "--eval-only: the error does not name the file"
grep -q -F -- "--skip-unreadable" "$WORK/e2" || fail "--eval-only: the error does not name the way out"
for verify in full header; do
  expect_rc 0 "$WORK/e3" "$RD_BIN" --data "$WORK/valonly" --threads 1 --workers 1 --eval-only --resume "$CK" \
    --skip-unreadable --verify-data "$verify"
  cat "$WORK/e3"
  grep -q -F "on 9 validation images (1 unreadable file(s) skipped, not scored)" "$WORK/e3" ||
    fail "--eval-only --skip-unreadable --verify-data $verify: the skip is not counted"
  grep -q -x -F "$(grep '^Val loss' "$WORK/e1")" "$WORK/e3" || fail "the skipped file changed the result"
done
expect_rc 2 "$WORK/e4" "$RD_BIN" --data "$WORK/data" "${TINY[@]}" --skip-unreadable --output-dir "$WORK/o2"
grep -q -F -- "--skip-unreadable: only with --eval-only" "$WORK/e4" || { cat "$WORK/e4"; fail "--skip-unreadable in training"; }
note "ok"
