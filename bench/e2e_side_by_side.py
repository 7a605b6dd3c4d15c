#!/usr/bin/env python3
"""The table of bench/e2e_vs_pytorch.sh: one run of resnet_ddp and one of
bench/pytorch_gpu_ddp_recipe.py on the same data, side by side.

  e2e_side_by_side.py RESNET_DDP_OUTPUT_DIR PYTORCH_LOG GLOBAL_BATCH

resnet_ddp's side comes from its output directory: metrics.csv (the epoch's time_s) and
its TensorBoard event file, whose step/*_ms scalars time every step (the same split as the
`Step time:` line); PyTorch's from the RESULT_JSON line of its log. Step 1 is shown apart;
"steady" is the median of steps 2..N, each part's median taken on its own. Ends with
`SIDE_BY_SIDE_JSON {...}`; exits 1 naming what is missing or not finite.

Standard library only: the event file is read with a few lines of TFRecord and protobuf
decoding rather than the tensorboard package.
"""
import csv
import glob
import json
import math
import os
import statistics
import struct
import sys

PARTS = ("data", "forward", "backward", "optimizer")


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def fields(buf):
    """(field number, wire type, value) of each field of a protobuf message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"protobuf wire type {wire} not expected in an event file")
        yield field, wire, value


def event_scalars(path):
    """{step: {tag: value}} of an event file's simple_value scalars (Event.step = 2,
    Event.summary = 5, Summary.value = 1, Value.tag = 1, Value.simple_value = 2)."""
    data = open(path, "rb").read()
    steps, i = {}, 0
    while i + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, i)
        record = data[i + 12:i + 12 + n]  # after the length and its CRC
        i += 12 + n + 4
        step, values = 0, {}
        for field, _, value in fields(record):
            if field == 2:
                step = value
            elif field == 5:
                for f, _, v in fields(value):
                    if f != 1:
                        continue
                    tag, simple = None, None
                    for vf, vw, vv in fields(v):
                        if vf == 1:
                            tag = vv.decode()
                        elif vf == 2 and vw == 5:
                            (simple,) = struct.unpack("<f", vv)
                    if tag is not None and simple is not None:
                        values[tag] = simple
        if values:
            steps.setdefault(step, {}).update(values)
    return steps


def resnet_ddp_side(out_dir, global_batch, problems):
    side = {"epoch_s": math.nan, "step1_ms": {}, "steady_ms": {}}
    metrics = os.path.join(out_dir, "metrics.csv")
    try:
        rows = list(csv.DictReader(open(metrics)))
        side["epoch_s"] = float(rows[0]["time_s"])
    except (OSError, IndexError, KeyError, ValueError) as e:
        problems.append(f"resnet_ddp: no epoch time in {metrics} ({e})")
    files = sorted(glob.glob(os.path.join(out_dir, "events.out.tfevents.*")))
    if not files:
        problems.append(f"resnet_ddp: no TensorBoard event file in {out_dir} (run without --tensorboard off)")
        return side
    scalars = event_scalars(files[-1])
    per_step = [scalars[s] for s in sorted(scalars) if "step/time_ms" in scalars[s]]
    if not per_step:
        problems.append(f"resnet_ddp: no step/time_ms scalars in {files[-1]}")
        return side

    def split(get):
        d = {"total": get("time_ms"), "data": get("data_ms"), "forward": get("forward_ms"),
             "optimizer": get("optimizer_ms")}
        d["backward"] = get("backward_ms") + get("comm_ms")  # exposed comm counts with backward, as in PyTorch's
        return d

    side["step1_ms"] = split(lambda k: per_step[0].get("step/" + k, math.nan))
    later = per_step[1:]
    side["steady_ms"] = split(lambda k: statistics.median(s.get("step/" + k, math.nan) for s in later)
                              if later else math.nan)
    side["steady_img_per_s"] = global_batch * 1e3 / side["steady_ms"]["total"] if later else math.nan
    side["steps"] = len(per_step)
    return side


def pytorch_side(log, problems):
    try:
        lines = [line for line in open(log) if line.startswith("RESULT_JSON ")]
    except OSError as e:
        lines = []
        problems.append(f"pytorch: cannot read {log} ({e})")
    if not lines:
        problems.append(f"pytorch: no RESULT_JSON line in {log}")
        return {"epoch_s": math.nan, "step1_ms": {}, "steady_ms": {}}
    r = json.loads(lines[-1][len("RESULT_JSON "):])
    return {"epoch_s": r["epochs"][0]["epoch_s"] if r.get("epochs") else math.nan, "step1_ms": r.get("step1_ms") or {},
            "steady_ms": r.get("steady_ms") or {}, "steady_img_per_s": r.get("steady_img_per_s", math.nan),
            "steps": r.get("steps", 0), "math": r.get("math"), "torch": r.get("torch"), "device": r.get("device")}


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    out_dir, log = sys.argv[1], sys.argv[2]
    try:
        global_batch = int(sys.argv[3])
    except ValueError:
        sys.exit(f"e2e_side_by_side.py: GLOBAL_BATCH '{sys.argv[3]}': expected an integer")
    problems = []
    rd, pt = resnet_ddp_side(out_dir, global_batch, problems), pytorch_side(log, problems)
    rows = [("epoch time (s)", "epoch_s", None), ("steady img/s", "steady_img_per_s", None),
            ("step 1 (ms)", "step1_ms", "total")]
    rows += [(f"step 1 {p} (ms)", "step1_ms", p) for p in PARTS]
    rows += [("steady step (ms)", "steady_ms", "total")]
    rows += [(f"steady {p} (ms)", "steady_ms", p) for p in PARTS]
    print(f"{'':24} {'resnet_ddp':>12} {'pytorch':>12} {'pytorch/rd':>11}")
    table = {}
    for label, key, part in rows:
        a, b = (s.get(key, math.nan) if part is None else s.get(key, {}).get(part, math.nan) for s in (rd, pt))
        a, b = (math.nan if v is None else float(v) for v in (a, b))
        for who, v in (("resnet_ddp", a), ("pytorch", b)):
            if not math.isfinite(v):
                problems.append(f"{who}: '{label}' is {v}")
        ratio = b / a if a and math.isfinite(a) and math.isfinite(b) else math.nan
        print(f"{label:24} {a:12.2f} {b:12.2f} {ratio:10.2f}x")
        table[label] = {"resnet_ddp": a, "pytorch": b}
    print("(backward includes the all-reduce time it did not hide; pytorch/rd > 1 for times and < 1 for img/s means"
          " resnet_ddp is ahead; what each row counts: docs/performance.md)")
    if pt.get("math") and pt.get("device") != "cpu":  # TF32 settings mean nothing to a CPU run
        print(f"pytorch {pt.get('torch')} on {pt.get('device')}: {json.dumps(pt['math'])}")
    print("SIDE_BY_SIDE_JSON " + json.dumps({"rows": table, "resnet_ddp_steps": rd.get("steps", 0),
                                             "pytorch_steps": pt.get("steps", 0), "problems": problems}))
    for p in problems:
        print(f"e2e_side_by_side.py: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
