"""Reads a training run's TensorBoard event files with the tensorboard package's own
readers and checks them against metrics.csv (called by tensorboard.sh).

  tensorboard_check.py OUTPUT_DIR FIRST_STEPS

FIRST_STEPS: comma-separated first global step of each event file, in file order
(1 for a fresh run, checkpoint step + 1 for a resumed one).
"""
import csv
import glob
import math
import os
import struct
import sys

from tensorboard.backend.event_processing import event_file_loader
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto import event_pb2

STEP_TAGS = ["step/loss", "step/accuracy", "step/lr", "step/images_per_s", "step/time_ms",
             "step/data_ms", "step/forward_ms", "step/backward_ms", "step/comm_ms", "step/optimizer_ms"]
# Every metrics.csv column but world_size and global_step (the event's step).
EPOCH_COLUMNS = ["epoch", "time_s", "train_loss", "train_acc", "val_loss", "val_acc", "best_val_acc", "lr",
                 "images_per_s", "images_per_s_per_rank", "data_ms", "forward_ms", "backward_ms", "comm_ms",
                 "optimizer_ms", "val_acc5"]
SPLIT = ["data_ms", "forward_ms", "backward_ms", "comm_ms", "optimizer_ms"]

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)


def f32(x):
    """The float32 TensorBoard's simple_value holds."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def close(a, b, rel=1e-5, abs_=1e-6):
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def main():
    out, first_steps = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
    files = sorted(glob.glob(os.path.join(out, "events.out.tfevents.*")))
    check(len(files) == len(first_steps), f"{len(files)} event files, expected {len(first_steps)}: {files}")

    # Raw events of each file: the header TensorBoard expects, then the restart marker.
    for path, first in zip(files, first_steps):
        events = list(event_file_loader.EventFileLoader(path).Load())
        check(len(events) >= 2, f"{path}: only {len(events)} events")
        if len(events) < 2:
            continue
        check(events[0].file_version == "brain.Event:2", f"{path}: first event is not file_version brain.Event:2")
        check(events[1].session_log.status == event_pb2.SessionLog.START and events[1].step == first,
              f"{path}: second event is not SessionLog START at step {first}: {events[1]}")
        # Per-step scalars start at the restart step. (A run preempted after an epoch's
        # last step but before its validation writes that epoch's epoch/ values at
        # first - 1 once resumed: they were never written, so nothing is purged.)
        steps = [e.step for e in events[2:] if any(v.tag.startswith("step/") for v in e.summary.value)]
        check(steps and steps[0] == first, f"{path}: first step/ scalar at step {steps[:1]}, expected {first}")
        check(all(a <= b for a, b in zip(steps, steps[1:])), f"{path}: steps go backwards")
        check(all(e.wall_time > 1.6e9 for e in events), f"{path}: wall_time is not a Unix time")

    # What TensorBoard shows for the folder (all files, in name order).
    acc = EventAccumulator(out, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    expected_tags = set(STEP_TAGS) | {"epoch/" + c for c in EPOCH_COLUMNS}
    check(tags == expected_tags, f"scalar tags differ: missing {sorted(expected_tags - tags)}, "
                                 f"extra {sorted(tags - expected_tags)}")
    if failures:
        return
    scal = {t: acc.Scalars(t) for t in tags}

    with open(os.path.join(out, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    check(len(rows) >= 1, "metrics.csv has no rows")
    last_step = int(rows[-1]["global_step"])

    # Per-step scalars: every global step exactly once, 1..last, across the files.
    for t in STEP_TAGS:
        steps = [s.step for s in scal[t]]
        check(steps == list(range(1, last_step + 1)), f"{t}: steps {steps[:5]}...{steps[-3:]} "
                                                       f"({len(steps)}), expected 1..{last_step}")
        check(all(math.isfinite(s.value) for s in scal[t]), f"{t}: non-finite values")
    if failures:
        return
    step = {t: {s.step: s.value for s in scal[t]} for t in STEP_TAGS}
    for g in range(1, last_step + 1):
        split = sum(step["step/" + c][g] for c in SPLIT)
        check(close(step["step/time_ms"][g], split, 1e-5, 1e-4),
              f"step {g}: time_ms {step['step/time_ms'][g]} != sum of the split {split}")
        check(step["step/images_per_s"][g] > 0, f"step {g}: images_per_s {step['step/images_per_s'][g]}")
        check(0 <= step["step/accuracy"][g] <= 1, f"step {g}: accuracy {step['step/accuracy'][g]}")

    # Per-epoch scalars: metrics.csv's row at its global step, to float32 precision;
    # and the epoch's per-step values agree with the row (every step had the same
    # number of samples, so the epoch average is the mean of the step averages).
    prev = 0
    for row in rows:
        g = int(row["global_step"])
        for c in EPOCH_COLUMNS:
            pts = [s for s in scal["epoch/" + c] if s.step == g]
            check(len(pts) == 1, f"epoch/{c}: {len(pts)} values at step {g}, expected 1")
            if len(pts) == 1:
                check(pts[0].value == f32(float(row[c])),
                      f"epoch/{c} at step {g}: {pts[0].value} != metrics.csv {row[c]}")
        steps = range(prev + 1, g + 1)
        for t, c in (("step/loss", "train_loss"), ("step/accuracy", "train_acc")):
            mean = sum(step[t][s] for s in steps) / len(steps)
            check(close(mean, float(row[c]), 1e-5), f"epoch {row['epoch']}: mean {t} {mean} != {c} {row[c]}")
        for s in steps:
            check(step["step/lr"][s] == f32(float(row["lr"])),
                  f"step {s}: lr {step['step/lr'][s]} != epoch {row['epoch']} lr {row['lr']}")
        # metrics.csv's timings cover the steps this process ran: compare epochs that
        # one run did whole (the caller lists them in RD_TB_WHOLE_EPOCHS).
        if row["epoch"] in os.environ.get("RD_TB_WHOLE_EPOCHS", "").split(","):
            for c in SPLIT:
                mean = sum(step["step/" + c][s] for s in steps) / len(steps)
                check(close(mean, float(row[c]), 1e-4, 1e-3),
                      f"epoch {row['epoch']}: mean step/{c} {mean} != metrics.csv {row[c]}")
        prev = g
    check(prev == last_step, "the last epoch row is not at the last step")


if __name__ == "__main__":
    main()
    if failures:
        for m in failures:
            print("FAIL:", m, file=sys.stderr)
        sys.exit(1)
    print("tensorboard_check: ok")
