#!/usr/bin/env bash
# `--init FILE.pth`: a torchvision state_dict saved by torch.save (zip format) is read
# directly, without Python. A ResNet-18 (random torchvision init, BN statistics moved off
# their init) saved as .pth gives exactly the `Val loss` line of the same weights
# converted to .h5 by tools/torch_to_h5.py, also under a torchvision-style
# name-<sha256>.pth; training starts from it. Then the refusals, each exit 2 naming the
# file: a name whose hash does not match, a truncated file, a pickle naming a forbidden
# global, predict / --resume with a weights-only .pth. Exit 77 without torch.
source "$(dirname "$0")/common.sh"

torch_python torch torchvision h5py
synth_data "$WORK/data" 12 6
MODEL=(--arch resnet18 --head fc --image-size 32 --normalize imagenet --threads 1 --workers 1 --log-every 0)

note "torch.save a torchvision ResNet-18 state_dict (3 classes) and the files derived from it"
"$PY" - "$WORK" <<'PYEOF' || fail "writing the .pth files"
import hashlib, shutil, sys, zipfile
import torch, torchvision
work = sys.argv[1]
torch.manual_seed(0)
sd = torchvision.models.resnet18(num_classes=3).state_dict()
for name, t in sd.items():
    if name.endswith("running_mean"):
        t.normal_(0, 0.1)
    elif name.endswith("running_var"):
        t.uniform_(0.5, 1.5)
    elif name.endswith("num_batches_tracked"):
        t.fill_(5)
torch.save(sd, f"{work}/model.pth")
data = open(f"{work}/model.pth", "rb").read()
digest = hashlib.sha256(data).hexdigest()
shutil.copy(f"{work}/model.pth", f"{work}/resnet18-{digest[:8]}.pth")
wrong = "0badc0de" if not digest.startswith("0badc0de") else "1badc0de"
shutil.copy(f"{work}/model.pth", f"{work}/resnet18-{wrong}.pth")
open(f"{work}/truncated.pth", "wb").write(data[: len(data) * 2 // 3])
with zipfile.ZipFile(f"{work}/evil.pth", "w") as z:  # what a malicious download could hold
    z.writestr("archive/data.pkl", b"\x80\x02cposix\nsystem\nq\x00X\x0c\x00\x00\x00touch PWNED!q\x01\x85q\x02Rq\x03.")
    z.writestr("archive/version", "3\n")
PYEOF
"$PY" "$RD_ROOT/tools/torch_to_h5.py" "$WORK/model.pth" "$WORK/init.h5" --head fc --num-classes 3 \
  >"$WORK/convert.log" 2>&1 || { cat "$WORK/convert.log"; fail "tools/torch_to_h5.py"; }

eval_line() {  # eval_line INIT: the Val loss line of --eval-only --init INIT
  "$RD_BIN" --data "$WORK/data" --eval-only --init "$1" "${MODEL[@]}" >"$WORK/eval.log" 2>&1 ||
    { cat "$WORK/eval.log"; fail "--eval-only --init $1"; }
  grep -q -F "Initialised weights from $1" "$WORK/eval.log" || { cat "$WORK/eval.log"; fail "$1 not loaded"; }
  grep '^Val loss' "$WORK/eval.log"
}
note "--eval-only: the .pth gives exactly the converted .h5's result"
want=$(eval_line "$WORK/init.h5")
got=$(eval_line "$WORK/model.pth")
echo "  .h5:  $want"
echo "  .pth: $got"
[ -n "$want" ] && [ "$got" = "$want" ] || fail "the .pth evaluates differently from the .h5"
hashed=$(ls "$WORK"/resnet18-*.pth | while read -r f; do
  "$PY" -c "import hashlib,sys; d=hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest(); sys.exit(0 if sys.argv[1].endswith('-'+d[:8]+'.pth') else 1)" "$f" && echo "$f"; done)
[ "$(eval_line "$hashed")" = "$want" ] || fail "the name-<sha256>.pth evaluates differently"

note "training starts from it"
"$RD_BIN" --data "$WORK/data" --init "$WORK/model.pth" "${MODEL[@]}" --batch-size 4 --epochs 1 --max-steps 1 \
  --output-dir "$WORK/out" >"$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; fail "training from the .pth"; }
grep -q -F "Initialised weights from $WORK/model.pth" "$WORK/train.log" || fail "training did not load the .pth"
"$RD_BIN" info "$WORK/model.pth" >"$WORK/info" || fail "info"
grep -q -x "format:          PyTorch state_dict (torch.save zip)" "$WORK/info" || { cat "$WORK/info"; fail "info"; }

# refused EXPECTED_TEXT COMMAND...: exit status 2, EXPECTED_TEXT in the message.
refused() {
  local want=$1 rc=0
  shift
  "$@" >"$WORK/r.out" 2>"$WORK/r.err" || rc=$?
  [ "$rc" = 2 ] || { cat "$WORK/r.out" "$WORK/r.err"; fail "$*: exit $rc, expected 2"; }
  grep -q -F -- "$want" "$WORK/r.err" || { cat "$WORK/r.err"; fail "$*: message lacks: $want"; }
  sed -n 's/^resnet_ddp: error: /  /p' "$WORK/r.err" | head -n 1 | cut -c1-240
}
note "refusals"
EVAL=("$RD_BIN" --data "$WORK/data" --eval-only "${MODEL[@]}")
wrong=$(ls "$WORK"/resnet18-*.pth | grep -v -F "$hashed")
refused "PyTorch file '$wrong': its name says its SHA-256 starts with" "${EVAL[@]}" --init "$wrong"
refused "PyTorch file '$WORK/truncated.pth'" "${EVAL[@]}" --init "$WORK/truncated.pth"
(cd "$WORK" && refused "refused: its pickle names the global 'posix.system'" "${EVAL[@]}" --init "$WORK/evil.pth")
[ ! -e "$WORK/PWNED!" ] && [ ! -e "PWNED!" ] || fail "the forbidden global ran"
refused "Train from it with --init $WORK/model.pth" "$RD_BIN" predict --checkpoint "$WORK/model.pth" "$WORK/data/Validation"
refused "--resume: '$WORK/model.pth' is a PyTorch state_dict" \
  "$RD_BIN" --data "$WORK/data" --resume "$WORK/model.pth" "${MODEL[@]}" --output-dir "$WORK/o2"
echo "PASS"
