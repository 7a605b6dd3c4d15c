#!/usr/bin/python3
"""Run a command and sample the resident memory of every process it starts.

  bench/rss_watch.py --out FILE.json [--marker REGEX] [--interval S] -- COMMAND...

The command's stdout/stderr pass through unchanged. Every INTERVAL seconds (default
0.2) the RSS of each descendant process is read from /proc/PID/status; FILE.json
gets, per process (pid, name, parent), the peak RSS over the whole run and the peak
before the first output line matching MARKER (e.g. the end of the epoch, so memory
used later by checkpoint writing is reported apart). Exit status: the command's.
Standard library only, Linux /proc.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time


def children_map():
    """{ppid: [pid, ...]} for every process now."""
    kids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # comm may contain spaces: the fields after the closing parenthesis are fixed.
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def descendants(root):
    kids, out, todo = children_map(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            name, ppid, rss = None, None, None
            for line in f:
                if line.startswith("Name:"):
                    name = line.split(None, 1)[1].strip()
                elif line.startswith("PPid:"):
                    ppid = int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
            return name, ppid, rss
    except OSError:
        return None, None, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file for the per-process peaks")
    ap.add_argument("--marker", default="", help="regex: peaks before the first matching output line are kept apart")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between samples (default 0.2)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command given (put it after --)")
    if a.interval <= 0:
        ap.error("--interval must be > 0")
    marker = re.compile(a.marker) if a.marker else None

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    marker_seen = threading.Event()

    def pump():
        for raw in proc.stdout:
            sys.stdout.buffer.write(raw)
            sys.stdout.flush()
            if marker and not marker_seen.is_set() and marker.search(raw.decode(errors="replace")):
                marker_seen.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    procs = {}
    t0 = time.time()
    while proc.poll() is None:
        before_marker = marker is not None and not marker_seen.is_set()
        for pid in descendants(proc.pid):
            name, ppid, rss = rss_kib(pid)
            if rss is None:
                continue
            p = procs.setdefault(pid, {"pid": pid, "name": name, "ppid": ppid, "peak_kib": 0,
                                       "peak_before_marker_kib": 0, "first_seen_s": round(time.time() - t0, 2)})
            p["peak_kib"] = max(p["peak_kib"], rss)
            if before_marker:
                p["peak_before_marker_kib"] = max(p["peak_before_marker_kib"], rss)
        time.sleep(a.interval)
    reader.join(timeout=5)
    with open(a.out, "w") as f:
        json.dump({"command": cmd, "root_pid": proc.pid, "marker": a.marker, "marker_seen": marker_seen.is_set(),
                   "interval_s": a.interval, "wall_s": round(time.time() - t0, 2),
                   "processes": sorted(procs.values(), key=lambda p: p["pid"])}, f, indent=1)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
