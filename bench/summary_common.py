"""Shared helpers of bench/summarize.py: statistics of repeated runs and the
readers of run_bench.sh's raw files (key=value, JSON, /usr/bin/time -v, metrics CSV).
"""
import json
import os
import re
import statistics
import sys


def stats(values):
    """{'median', 'min', 'max', 'n'} of a non-empty list, None for an empty one."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fmt(s, digits=1, scale=1.0):
    """'median (min–max)' of a stats dict."""
    if s is None:
        return "n/a"
    if s["n"] == 1:
        return f"{s['median'] * scale:.{digits}f} (n=1)"
    return f"{s['median'] * scale:.{digits}f} ({s['min'] * scale:.{digits}f}–{s['max'] * scale:.{digits}f})"


def read_kv(path):
    out = {}
    if os.path.exists(path):
        for line in open(path):
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                out[k] = v
    return out


def load_json(path):
    """A JSON file, or None (with a warning) when it is empty or damaged, e.g. left
    by an interrupted run."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"summarize.py: skipping {path}: {e}", file=sys.stderr)
        return None


def result_json_line(path):
    """The `RESULT_JSON {...}` line a program printed, parsed; None when absent."""
    if not os.path.exists(path):
        return None
    for line in open(path, errors="replace"):
        if line.startswith("RESULT_JSON "):
            return json.loads(line[len("RESULT_JSON "):])
    return None


def time_v(path):
    """Peak RSS (MiB) and wall seconds from `/usr/bin/time -v -o path`."""
    if not os.path.exists(path):
        return None, None
    text = open(path).read()
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    seconds = None
    if wall:
        parts = [float(p) for p in wall.group(1).split(":")]
        seconds = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    return (int(rss.group(1)) / 1024.0 if rss else None), seconds
