#!/usr/bin/env bash
# bench/e2e_vs_pytorch.sh on the CPU with tiny settings (resnet18 @32, 1 rank, 3 steps): its
# usage errors, its skip without torch, the table tool's refusal of a run without numbers,
# then a real run of both sides: every number of the table present and finite, the step
# split consistent with the step, and the resnet_ddp side read from its TensorBoard event
# file agreeing with its metrics.csv. Skipped (77) without torch for $RD_TORCH_PYTHON.
#   e2e_vs_pytorch_cpu.sh RESNET_DDP_BINARY SOURCE_ROOT
set -euo pipefail
RD_BIN=$1
ROOT=$2
DRIVER=$ROOT/bench/e2e_vs_pytorch.sh
PY=${RD_TORCH_PYTHON:-/usr/bin/python3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rd_bench_e2e.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
build=(--build-dir "$(dirname "$RD_BIN")")
command -v python3 >/dev/null || { echo "SKIP: no python3 (the driver's table is a Python script)"; exit 77; }

# expect_error RC TEXT ARGS...: the driver exits RC and its output contains TEXT.
expect_error() {
  local want=$1 text=$2 rc=0
  shift 2
  bash "$DRIVER" "${build[@]}" "$@" >"$WORK/err" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || { cat "$WORK/err"; fail "$*: exit $rc, expected $want"; }
  grep -q -F -- "$text" "$WORK/err" || { cat "$WORK/err"; fail "$*: no '$text' in the output"; }
}
expect_error 2 "--precision fp16 needs --device cuda" --device cpu --precision fp16
expect_error 2 "--steps '0': expected a positive integer" --steps 0
expect_error 2 "--image-size 16: expected at least 32" --image-size 16
expect_error 2 "unknown option '--epochs'" --epochs 2
expect_error 2 "--data $WORK/none: no Train/ folder" --data "$WORK/none"
expect_error 77 "SKIP: /bin/false cannot import torch" --python /bin/false

# A run without numbers is refused, naming what is missing.
rc=0
python3 "$ROOT/bench/e2e_side_by_side.py" "$WORK" "$WORK/no.log" 4 >"$WORK/err" 2>&1 || rc=$?
[ "$rc" = 1 ] || { cat "$WORK/err"; fail "e2e_side_by_side.py without runs: exit $rc, expected 1"; }
for want in "no epoch time in $WORK/metrics.csv" "no TensorBoard event file" "no RESULT_JSON line"; do
  grep -q -F -- "$want" "$WORK/err" || { cat "$WORK/err"; fail "e2e_side_by_side.py does not say '$want'"; }
done

"$PY" -c 'import torch, torchvision' 2>/dev/null || { echo "SKIP: no torch/torchvision for $PY"; exit 77; }
rc=0
bash "$DRIVER" "${build[@]}" --python "$PY" --device cpu --arch resnet18 --image-size 32 --batch-size 4 \
  --ranks 1 --steps 3 --workers 1 --threads 1 --train 12 --val 4 --synth-size 40x40 \
  --synth-dir "$WORK/synth" --keep "$WORK/run" >"$WORK/out" 2>&1 || rc=$?
cat "$WORK/out"
[ "$rc" = 0 ] || fail "the driver failed (exit $rc)"
ls "$WORK"/synth/e2e_12_4_40x40/Train/*/*.jpg >/dev/null 2>&1 || fail "the driver made no JPEG set in --synth-dir"

python3 - "$WORK/out" "$WORK/run" "$ROOT/bench" <<'PY' || fail "the side-by-side numbers are incomplete or inconsistent"
import csv, glob, json, math, statistics, sys
out, run, bench = sys.argv[1:]
sys.path.insert(0, bench)
from e2e_side_by_side import event_scalars
line = [l for l in open(out) if l.startswith("SIDE_BY_SIDE_JSON ")]
assert line, "no SIDE_BY_SIDE_JSON line"
r = json.loads(line[-1][len("SIDE_BY_SIDE_JSON "):])
assert not r["problems"], r["problems"]
assert r["resnet_ddp_steps"] == 3 and r["pytorch_steps"] == 3, (r["resnet_ddp_steps"], r["pytorch_steps"])
rows = r["rows"]
for name in ("epoch time (s)", "steady img/s", "step 1 (ms)", "steady step (ms)"):
    for side in ("resnet_ddp", "pytorch"):
        v = rows[name][side]
        assert math.isfinite(v) and v > 0, f"{side} {name}: {v}"
for when in ("step 1", "steady"):
    for side in ("resnet_ddp", "pytorch"):
        parts = [rows[f"{when} {p} (ms)"][side] for p in ("data", "forward", "backward", "optimizer")]
        assert all(math.isfinite(p) and p >= 0 for p in parts), f"{side} {when}: {parts}"
        total = rows["step 1 (ms)" if when == "step 1" else "steady step (ms)"][side]
        assert parts[1] > 0 and parts[2] > 0, f"{side} {when}: no forward or backward time: {parts}"
        # Step 1's parts add up to at most the step (the median of each part need not).
        assert when != "step 1" or sum(parts) <= total * 1.01 + 0.5, f"{side} {when}: {parts} > {total}"
# resnet_ddp's side: the event file's per-step split averages to metrics.csv's epoch split.
m = next(csv.DictReader(open(f"{run}/resnet_ddp_out/metrics.csv")))
steps = event_scalars(sorted(glob.glob(f"{run}/resnet_ddp_out/events.out.tfevents.*"))[-1])
per_step = [v for _, v in sorted(steps.items()) if "step/forward_ms" in v]
assert len(per_step) == 3, f"{len(per_step)} steps in the event file"
for col in ("data_ms", "forward_ms", "backward_ms", "comm_ms", "optimizer_ms"):
    mean = statistics.mean(s["step/" + col] for s in per_step)
    assert math.isclose(mean, float(m[col]), rel_tol=1e-4, abs_tol=1e-3), f"{col}: events {mean}, metrics.csv {m[col]}"
assert math.isclose(rows["epoch time (s)"]["resnet_ddp"], float(m["time_s"]), rel_tol=1e-9)
print("side by side: complete and consistent")
PY
