#!/usr/bin/env bash
# Weights that resnet_ddp cannot use are refused with exit status 2 and a message naming
# the file (and the flag): legacy PyTorch .pt files (with the re-save command), damaged .pth, and
# .safetensors files that are truncated or whose header lies (length, JSON, dtype,
# shape, offsets, overlaps, holes, nesting, NaN, wrong shape for the model). `export`
# refuses bad paths and never touches an existing file when it fails.
source "$(dirname "$0")/common.sh"

PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
synth_data "$WORK/data" 8 4
TINY1=(--arch resnet_tiny --image-size 32 --threads 1 --workers 1 --log-every 0)
"$RD_BIN" --data "$WORK/data" "${TINY1[@]}" --batch-size 4 --epochs 1 --max-steps 1 --output-dir "$WORK/out" \
  >"$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; fail "training"; }
GOOD=$WORK/good.safetensors
"$RD_BIN" export --checkpoint "$WORK/out/best_model.h5" --out "$GOOD" >/dev/null || fail "export"

# refused EXPECTED_TEXT COMMAND...: exit status 2, no crash, EXPECTED_TEXT in the message.
refused() {
  local want=$1 rc=0
  shift
  "$@" >"$WORK/r.out" 2>"$WORK/r.err" || rc=$?
  [ "$rc" = 2 ] || { cat "$WORK/r.out" "$WORK/r.err"; fail "$*: exit $rc, expected 2"; }
  grep -q -F -- "$want" "$WORK/r.err" || { cat "$WORK/r.err"; fail "$*: message lacks: $want"; }
  sed -n 's/^resnet_ddp: error: /  /p' "$WORK/r.err" | head -n 1 | cut -c1-220
}

note "PyTorch files: a legacy pickle names the re-save command, a broken zip its problem"
printf 'PK\003\004\024\000\000\000\010\000archive/data.pkl' >"$WORK/w.pth"
printf '\200\002\175q\000(X\005\000\000\000conv1q' >"$WORK/w.pt"
EVAL=("$RD_BIN" --data "$WORK/data" "${TINY1[@]}" --eval-only)
refused "PyTorch file '$WORK/w.pth': no zip end record" "${EVAL[@]}" --init "$WORK/w.pth"
refused "--init: '$WORK/w.pt' is in PyTorch's legacy format" "${EVAL[@]}" --init "$WORK/w.pt"
grep -q -F "torch.save(torch.load(\"$WORK/w.pt\", weights_only=True), \"w.zip.pth\")" "$WORK/r.err" ||
  fail "--init legacy .pt: no re-save command"
refused "--resume: '$WORK/w.pt' is in PyTorch's legacy format" "${EVAL[@]}" --resume "$WORK/w.pt"
refused "--resume: '$WORK/w.pth' is a PyTorch state_dict (torch.save), which holds weights only" \
  "$RD_BIN" --data "$WORK/data" "${TINY1[@]}" --resume "$WORK/w.pth" --output-dir "$WORK/o2"
refused "PyTorch file '$WORK/w.pth'" "$RD_BIN" predict --checkpoint "$WORK/w.pth" "$WORK/data"
refused "checkpoint '$WORK/w.pt': is in PyTorch's legacy format" "$RD_BIN" info "$WORK/w.pt"
refused "PyTorch file '$WORK/w.pth'" "$RD_BIN" export --checkpoint "$WORK/w.pth" --out "$WORK/x.safetensors"

note "damaged or lying .safetensors files"
# Variants of the good file, one per way a header can be wrong (stdlib only).
"$PY" - "$GOOD" "$WORK" <<'EOF'
import json, struct, sys
src, work = sys.argv[1], sys.argv[2]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])

def put(name, blob):
    open(f"{work}/{name}.safetensors", "wb").write(blob)

def rebuilt(name, h, d=data, text=None):
    text = text if text is not None else json.dumps(h)
    b = text.encode()
    put(name, struct.pack("<Q", len(b)) + b + d)

def edited(fn):
    h = json.loads(json.dumps(header))
    fn(h)
    return h

put("trunc4", raw[:4])
put("trunc_header", raw[:8 + n // 2])
put("trunc_data", raw[:-100])
put("len_huge", struct.pack("<Q", 1 << 63) + raw[8:])
put("len_past", struct.pack("<Q", len(raw)) + raw[8:])
put("not_json", raw[:8] + b"{\"conv1.weight\": nonsense" + b" " * (n - 25) + data)
rebuilt("dtype_f64", edited(lambda h: h[names[0]].update(dtype="F64")))
rebuilt("dtype_int", edited(lambda h: h[names[0]].update(dtype="I32")))
rebuilt("shape_bytes", edited(lambda h: h[names[0]].update(shape=[1])))
rebuilt("past_end", edited(lambda h: h[names[-1]].update(data_offsets=[h[names[-1]]["data_offsets"][0], len(data) + 4])))
def overlap(h):
    a, b = h[names[0]], h[names[1]]
    b["data_offsets"] = [a["data_offsets"][0], a["data_offsets"][0] + (b["data_offsets"][1] - b["data_offsets"][0])]
rebuilt("overlap", edited(overlap))
rebuilt("hole", edited(lambda h: h.pop(names[3])))
rebuilt("negative", edited(lambda h: h[names[0]].update(data_offsets=[-1, 3])))
rebuilt("meta_not_str", edited(lambda h: h["__metadata__"].update(num_classes=3)))
s = header[names[0]]["shape"]
rebuilt("model_shape", edited(lambda h: h[names[0]].update(shape=[s[1], s[0]] + s[2:])))
rebuilt("class_names", edited(lambda h: h["__metadata__"].update(class_names="[\"C0\", ")))
dup = json.dumps(header)[:-1] + ", " + json.dumps(names[0]) + ": " + json.dumps(header[names[0]]) + "}"
rebuilt("duplicate", None, text=dup)
rebuilt("deep", None, text="{\"x\": " + "[" * 100000 + "]" * 100000 + "}")
first = header[names[0]]["data_offsets"][0]
rebuilt("nan", header, d=data[:first] + struct.pack("<f", float("nan")) + data[first + 4:])
EOF
while read -r variant want; do
  refused "$want" "${EVAL[@]}" --init "$WORK/$variant.safetensors"
  grep -q -F "'$WORK/$variant.safetensors'" "$WORK/r.err" || fail "$variant: the message does not name the file"
done <<EOF
trunc4 only 4 bytes, shorter than the 8-byte header length
trunc_header exceeds the file's remaining
trunc_data end past the data
len_huge header length 9223372036854775808 exceeds
len_past exceeds the file's remaining
not_json the header is not valid JSON
dtype_f64 dtype F64 is not supported
dtype_int has dtype I32, expected F32, F16 or BF16
shape_bytes does not fill its
past_end end past the data
overlap overlap
hole belong to no tensor
negative holds something other than non-negative integers
meta_not_str __metadata__ value for "num_classes" is not a string
model_shape the model expects
class_names __metadata__ 'class_names' is not valid JSON
duplicate duplicate key
deep JSON nested too deeply
nan contains NaN or Inf
EOF
refused "safetensors file '$WORK/trunc_data.safetensors'" "$RD_BIN" info "$WORK/trunc_data.safetensors"
refused "safetensors file '$WORK/trunc4.safetensors'" "$RD_BIN" predict --checkpoint "$WORK/trunc4.safetensors" \
  "$WORK/data"

note "a .safetensors holds no optimizer state: --resume says to use --init"
refused "to train from these weights use --init $GOOD" "$RD_BIN" --data "$WORK/data" "${TINY1[@]}" --resume "$GOOD" \
  --output-dir "$WORK/o3"

note "export: bad paths, and a failed export leaves an existing file alone"
cp "$GOOD" "$WORK/keep.safetensors"
refused "is the input checkpoint itself" "$RD_BIN" export --checkpoint "$GOOD" --out "$GOOD"
cmp -s "$GOOD" "$WORK/keep.safetensors" || fail "export over its input changed it"
refused "--out: '$WORK/m.h5' should end in .safetensors" "$RD_BIN" export --checkpoint "$GOOD" --out "$WORK/m.h5"
refused "--out: directory '$WORK/nodir' does not exist" "$RD_BIN" export --checkpoint "$GOOD" \
  --out "$WORK/nodir/m.safetensors"
refused "--out: required" "$RD_BIN" export --checkpoint "$GOOD"
refused "--checkpoint: no such file" "$RD_BIN" export --checkpoint "$WORK/none.h5" --out "$WORK/n.safetensors"
cp "$GOOD" "$WORK/target.safetensors"
refused "end past the data" "$RD_BIN" export --checkpoint "$WORK/trunc_data.safetensors" --out "$WORK/target.safetensors"
cmp -s "$GOOD" "$WORK/target.safetensors" || fail "a failed export changed the existing --out file"
! ls -A "$WORK" | grep -q '\.tmp\.' || fail "a failed export left a temporary file"
echo "PASS"
