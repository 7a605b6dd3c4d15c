#!/usr/bin/python3
"""Summarise bench/run_bench.sh's raw output into results.json, a Markdown table
and gnuplot data + PNG plots; also computes the GPU scaling model (docs/performance.md).

  bench/summarize.py --raw bench/results.raw --json bench/results.json \
                     --md bench/results.md --plots bench

Standard library only. Every figure is the median of its runs with min and max;
every ratio is resnet_ddp / PyTorch measured in the same run (for times: PyTorch's
time / resnet_ddp's time, i.e. a speed ratio; for memory: resnet_ddp / PyTorch).
"""
import argparse
import csv
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

# ---------------------------------------------------------------------------------
# helpers


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


# ---------------------------------------------------------------------------------
# ResNet shapes, for the gradient bytes and FLOPs of the scaling model


def resnet_shapes(arch, size, head="mlp", classes=3):
    """Trainable parameters and forward multiply-adds per image of torchvision's
    ResNet with the reference head (Linear(C,C)-ReLU-Linear(C,K))."""
    blocks = {"resnet18": ("basic", [2, 2, 2, 2]), "resnet34": ("basic", [3, 4, 6, 3]),
              "resnet50": ("bottleneck", [3, 4, 6, 3])}[arch]
    kind, counts = blocks
    params, macs = 0, 0

    def conv(cin, cout, k, stride, pad, hw):
        nonlocal params, macs
        out = (hw + 2 * pad - k) // stride + 1
        params += cin * cout * k * k
        macs += out * out * cin * cout * k * k
        return out

    def bn(c):
        nonlocal params
        params += 2 * c

    hw = conv(3, 64, 7, 2, 3, size)
    bn(64)
    hw = (hw + 2 - 3) // 2 + 1  # max pool 3x3/2
    cin = 64
    for stage, n in enumerate(counts):
        planes = 64 * 2 ** stage
        for b in range(n):
            stride = 2 if stage > 0 and b == 0 else 1
            if kind == "basic":
                out = conv(cin, planes, 3, stride, 1, hw)
                bn(planes)
                conv(planes, planes, 3, 1, 1, out)
                bn(planes)
                cout = planes
            else:
                conv(cin, planes, 1, 1, 0, hw)
                bn(planes)
                out = conv(planes, planes, 3, stride, 1, hw)
                bn(planes)
                conv(planes, planes * 4, 1, 1, 0, out)
                bn(planes * 4)
                cout = planes * 4
            if stride != 1 or cin != cout:
                conv(cin, cout, 1, stride, 0, hw)
                bn(cout)
            cin, hw = cout, out
    c = cin
    if head == "mlp":
        params += c * c + c
        macs += c * c
    params += c * classes + classes
    macs += c * classes
    return params, macs


# Scaling-model assumptions: every number here is an input, not a measurement.
CLUSTERS = {
    "frontera_rtx": {
        "label": "Frontera rtx: 2 nodes x 4 Quadro RTX 5000, FDR InfiniBand",
        "gpus_per_node": 4, "nodes": 2,
        "inter_node_GBps": 6.8,   # FDR 4x: 56 Gb/s signalling, ~6.8 GB/s data
        "intra_node_GBps": 10.0,  # PCIe 3.0 x16 through the host (no NVLink), practical
        # ResNet-50 @224 training img/s per GPU, large batch: V100 FP32 367 img/s (NVIDIA
        # DeepLearningExamples, DGX-1) scaled by FP32 peak 11.2 / 15.7 TFLOPS.
        "r50_img_s": {"fp32": 367 * 11.2 / 15.7, "fp16": 1200 * 89.2 / 125.0},
    },
    "lonestar6_a100": {
        "label": "Lonestar6: 2 nodes x 3 A100 40GB, HDR InfiniBand",
        "gpus_per_node": 3, "nodes": 2,
        "inter_node_GBps": 25.0,  # HDR 200 Gb/s
        "intra_node_GBps": 20.0,  # PCIe 4.0 x16, practical
        # NVIDIA DeepLearningExamples ResNet-50 v1.5, 1x A100 80GB: TF32 938, AMP 2470 img/s.
        "r50_img_s": {"tf32": 938.0, "bf16": 2470.0},
    },
}
NCCL_BUS_EFFICIENCY = 0.8     # achieved busbw / link bandwidth for large messages
SMALL_BATCH_FACTOR = 0.7      # batch 16 per GPU runs below the published large-batch img/s
BACKWARD_SHARE = 2.0 / 3.0    # backward = 2x forward, so 2/3 of the compute time
BUCKET_MB = 25.0              # resnet_ddp --bucket-mb default (as PyTorch DDP)


def ring_allreduce_s(nbytes, n, gbps):
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / (gbps * 1e9 * NCCL_BUS_EFFICIENCY)


def scaling_model():
    r50_params, r50_macs = resnet_shapes("resnet50", 224)
    models = {"resnet34@244": resnet_shapes("resnet34", 244), "resnet50@224": resnet_shapes("resnet50", 224)}
    batch = 16
    out = {"assumptions": {
        "nccl_bus_efficiency": NCCL_BUS_EFFICIENCY, "small_batch_factor": SMALL_BATCH_FACTOR,
        "backward_share_of_compute": BACKWARD_SHARE, "bucket_mb": BUCKET_MB, "per_gpu_batch": batch,
        "gradient_dtype": "fp32 (4 bytes per parameter, also with AMP: the gradients all-reduced are fp32)",
        "step_time": "t_compute = batch / (published ResNet-50 img/s x small_batch_factor x FLOP ratio)",
        "allreduce": "ring: 2(n-1)/n * bytes / (bandwidth * nccl_bus_efficiency); bandwidth = intra-node "
                     "PCIe within one node, the InfiniBand link once the ring spans 2 nodes",
        "no_overlap": "t_step = t_compute + t_allreduce",
        "overlap": "t_step = t_compute + max(t_allreduce(last 25 MB bucket), t_allreduce - t_backward)",
    }, "clusters": {}}
    for cname, c in CLUSTERS.items():
        cl = {"label": c["label"], "inter_node_GBps": c["inter_node_GBps"], "intra_node_GBps": c["intra_node_GBps"],
              "r50_img_s_published_or_scaled": c["r50_img_s"], "rows": []}
        max_gpus = c["gpus_per_node"] * c["nodes"]
        for mname, (params, macs) in models.items():
            nbytes = params * 4
            for prec, r50_rate in c["r50_img_s"].items():
                rate = r50_rate * SMALL_BATCH_FACTOR * (r50_macs / macs)
                t_c = batch / rate
                for n in range(1, max_gpus + 1):
                    bw = c["intra_node_GBps"] if n <= c["gpus_per_node"] else min(c["inter_node_GBps"],
                                                                                 c["intra_node_GBps"])
                    t_ar = ring_allreduce_s(nbytes, n, bw)
                    t_last = ring_allreduce_s(min(nbytes, BUCKET_MB * 2 ** 20), n, bw)
                    t_no = t_c + t_ar
                    t_ov = t_c + (max(t_last, t_ar - BACKWARD_SHARE * t_c) if n > 1 else 0.0)
                    cl["rows"].append({"model": mname, "precision": prec, "gpus": n, "grad_MB": nbytes / 2 ** 20,
                                       "t_compute_ms": t_c * 1e3, "t_allreduce_ms": t_ar * 1e3,
                                       "t_step_no_overlap_ms": t_no * 1e3, "t_step_overlap_ms": t_ov * 1e3,
                                       "eff_no_overlap": t_c / t_no, "eff_overlap": t_c / t_ov,
                                       "img_s_overlap": n * batch / t_ov})
        out["clusters"][cname] = cl
    return out


# ---------------------------------------------------------------------------------
# sections


def summarize_step(raw):
    rows = []
    for rd_path in sorted(glob.glob(os.path.join(raw, "step_rd_*.json"))):
        pt_path = rd_path.replace("step_rd_", "step_pt_")
        if not os.path.exists(pt_path):
            continue
        rd, pt = load_json(rd_path), load_json(pt_path)
        if not rd or not pt:
            continue
        a, b = rd["results"][0], pt["results"][0]
        batch = a["batch"]
        base = os.path.basename(rd_path)
        cap = base[len("step_rd_isa-"):].split("_")[0] if base.startswith("step_rd_isa-") else "native"
        # The ISA each side actually ran (resnet_ddp's backend line names oneDNN's).
        rd_isa = next((p.strip() for p in rd.get("backend", "").split(",") if p.strip().startswith(("avx", "sse"))), "?")

        def ips(r):
            # img/s of the median, slowest and fastest step
            return {"median": batch / r["step_ms_median"] * 1e3, "min": batch / r.get("step_ms_max", r["step_ms_median"]) * 1e3,
                    "max": batch / r["step_ms_min"] * 1e3, "n": r["steps"]}
        rows.append({"arch": a["arch"], "image_size": a["image_size"], "batch": batch, "threads": rd["threads"],
                     "steps": a["steps"], "resnet_ddp_img_s": ips(a), "pytorch_img_s": ips(b),
                     "resnet_ddp_gflops": a["gflops"], "pytorch_gflops": b["gflops"],
                     "gflop_per_step": a["gflop_per_step"],
                     "ratio": a["step_ms_median"] and b["step_ms_median"] / a["step_ms_median"],
                     "ratio_best": b["step_ms_min"] / a["step_ms_min"],
                     "pytorch_version": pt["version"], "resnet_ddp_layout": rd.get("layout"),
                     "precision": rd.get("precision", "fp32"), "isa_cap": cap, "resnet_ddp_isa": rd_isa,
                     "pytorch_cpu_capability": pt.get("cpu_capability", "?"),
                     "pytorch_channels_last": pt.get("channels_last", False)})
    order = {"resnet18": 0, "resnet34": 1, "resnet50": 2}
    rows.sort(key=lambda r: (r["isa_cap"] != "native", r["isa_cap"], r["precision"] != "fp32",
                             order.get(r["arch"], 9)))
    return rows


def read_metrics_csv(path):
    if not os.path.exists(path):
        return None
    rows = list(csv.DictReader(open(path)))
    return rows[-1] if rows else None


def rank_memory(path, framework):
    """Per-rank peaks (MiB) from rss_watch.py's JSON: the ranks' own RSS before the
    epoch's end (training + validation), over the whole run, and for PyTorch the
    DataLoader worker processes each rank forks."""
    if not os.path.exists(path):
        return None
    j = json.load(open(path))
    procs = j["processes"]
    if framework == "resnet_ddp":
        ranks = [p for p in procs if p["name"] == "resnet_ddp"]
    else:
        ranks = [p for p in procs if p["ppid"] == j["root_pid"]]
    if not ranks:
        return None
    rank_pids = {p["pid"] for p in ranks}
    workers = [p for p in procs if p["ppid"] in rank_pids]
    out = {"ranks": len(ranks),
           "train_val_peak_mib": max(p["peak_before_marker_kib"] for p in ranks) / 1024,
           "whole_run_peak_mib": max(p["peak_kib"] for p in ranks) / 1024,
           "workers_per_rank": len(workers) / len(ranks),
           "worker_peak_mib": max((p["peak_before_marker_kib"] for p in workers), default=0) / 1024}
    # Upper bound of a rank's memory with its workers (shared pages counted twice).
    out["rank_plus_workers_peak_mib"] = max(
        p["peak_before_marker_kib"] + sum(w["peak_before_marker_kib"] for w in workers if w["ppid"] == p["pid"])
        for p in ranks) / 1024
    return out


def summarize_epoch(raw):
    flags = open(os.path.join(raw, "epoch_flags.txt")).read().strip() if os.path.exists(
        os.path.join(raw, "epoch_flags.txt")) else ""
    rd_runs, pt_runs = [], []
    for d in sorted(glob.glob(os.path.join(raw, "epoch_rd_*"))):
        m = read_metrics_csv(os.path.join(d, "model", "metrics.csv"))
        if not m:
            continue
        rss, wall = time_v(os.path.join(d, "time.txt"))
        steps = float(m["global_step"])
        per_step_ms = sum(float(m[k]) for k in ("data_ms", "forward_ms", "backward_ms", "comm_ms", "optimizer_ms"))
        train_s = steps * per_step_ms / 1e3
        epoch_s = float(m["time_s"])
        rd_runs.append({"epoch_s": epoch_s, "train_s": train_s, "val_s": epoch_s - train_s,
                        "data_wait_s": steps * float(m["data_ms"]) / 1e3,
                        "exposed_comm_s": steps * float(m["comm_ms"]) / 1e3,
                        "steps": steps, "step_ms": per_step_ms,
                        "split_ms": {k: float(m[k + "_ms"]) for k in ("data", "forward", "backward", "comm", "optimizer")},
                        "val_acc": float(m["val_acc"]), "peak_rss_mib": rss, "process_wall_s": wall,
                        "memory": rank_memory(os.path.join(d, "rss.json"), "resnet_ddp")})
    for d in sorted(glob.glob(os.path.join(raw, "epoch_pt_*"))):
        j = result_json_line(os.path.join(d, "log.txt"))
        if not j:
            continue
        e = j["epochs"][0]
        rss, wall = time_v(os.path.join(d, "time.txt"))
        pt_runs.append({"epoch_s": e["epoch_s"], "train_s": e["train_s"], "val_s": e["val_s"],
                        "data_wait_s": e["data_wait_s"], "train_images": e["train_images"],
                        "peak_rss_mib": rss, "process_wall_s": wall,
                        "memory": rank_memory(os.path.join(d, "rss.json"), "pytorch")})
    if not rd_runs or not pt_runs:
        return None
    keys = ("epoch_s", "train_s", "val_s", "data_wait_s", "peak_rss_mib", "process_wall_s")
    out = {"flags": flags, "ranks": 2,
           "resnet_ddp": {k: stats([r[k] for r in rd_runs]) for k in keys + ("exposed_comm_s", "step_ms")},
           "pytorch": {k: stats([r[k] for r in pt_runs]) for k in keys},
           "resnet_ddp_runs": rd_runs, "pytorch_runs": pt_runs}
    for key, runs_ in (("resnet_ddp", rd_runs), ("pytorch", pt_runs)):
        mems = [r["memory"] for r in runs_ if r["memory"]]
        if mems:
            out[key]["memory"] = {k: stats([m[k] for m in mems]) for k in mems[0] if k.endswith("_mib")}
    out["resnet_ddp"]["split_ms"] = {k: stats([r["split_ms"][k] for r in rd_runs])["median"]
                                     for k in rd_runs[0]["split_ms"]}
    rd, pt = out["resnet_ddp"], out["pytorch"]
    out["speed_ratio_epoch"] = pt["epoch_s"]["median"] / rd["epoch_s"]["median"]
    out["speed_ratio_train"] = pt["train_s"]["median"] / rd["train_s"]["median"]
    out["speed_ratio_val"] = pt["val_s"]["median"] / rd["val_s"]["median"] if rd["val_s"]["median"] > 0 else None
    if rd["peak_rss_mib"] and pt["peak_rss_mib"]:
        out["rss_ratio_time_v"] = rd["peak_rss_mib"]["median"] / pt["peak_rss_mib"]["median"]
    if rd.get("memory") and pt.get("memory"):
        out["rss_ratio"] = (rd["memory"]["train_val_peak_mib"]["median"] /
                            pt["memory"]["train_val_peak_mib"]["median"])
        out["rss_ratio_with_workers"] = (rd["memory"]["train_val_peak_mib"]["median"] /
                                         pt["memory"]["rank_plus_workers_peak_mib"]["median"])
    out["exposed_comm_pct"] = 100 * rd["exposed_comm_s"]["median"] / rd["train_s"]["median"]
    return out


def summarize_ddp(raw):
    runs = []
    for path in sorted(glob.glob(os.path.join(raw, "ddp_np*_b*_*.txt"))):
        j = result_json_line(path)
        if j:
            runs.append(j)
    if not runs:
        return None
    out = {"config": {k: runs[0][k] for k in ("arch", "batch", "pixels", "threads", "steps", "grad_mb")},
           "buckets": [], "weak_scaling": None}
    two = [r for r in runs if r["ranks"] == 2]
    for mb in sorted({r["bucket_mb"] for r in two}):
        rs = [r for r in two if r["bucket_mb"] == mb]
        out["buckets"].append({
            "bucket_mb": mb,
            "no_allreduce_ms": stats([r["no_allreduce_ms"] for r in rs]),
            "overlap_on_ms": stats([r["overlap_on_ms"] for r in rs]),
            "overlap_off_ms": stats([r["overlap_off_ms"] for r in rs]),
            "overlap_on_exposed_pct": stats([100 * r["overlap_on_exposed_ms"] / r["overlap_on_ms"] for r in rs]),
            "overlap_off_exposed_pct": stats([100 * r["overlap_off_exposed_ms"] / r["overlap_off_ms"] for r in rs]),
        })
    one = [r for r in runs if r["ranks"] == 1]
    two25 = [r for r in two if abs(r["bucket_mb"] - 25) < 1e-6]
    if one and two25:
        b = one[0]["batch"]
        s1 = stats([b / r["no_allreduce_ms"] * 1e3 for r in one])
        s2 = stats([2 * b / r["overlap_on_ms"] * 1e3 for r in two25])
        out["weak_scaling"] = {"img_s_1_rank": s1, "img_s_2_ranks": s2,
                               "efficiency": s2["median"] / (2 * s1["median"])}
    return out


def summarize_loader(raw):
    runs = [j for j in (result_json_line(p) for p in sorted(glob.glob(os.path.join(raw, "loader_*.txt")))) if j]
    if not runs:
        return None
    w = runs[0]["workers"]
    out = {"workers": w, "images": runs[0]["images"], "image_size": runs[0]["image_size"],
           "jpeg_img_s_per_core": stats([r["jpeg_img_per_s"] / w for r in runs]),
           "h5_img_s_per_core": stats([r["h5_img_per_s"] / w for r in runs]),
           "torchvision_img_s_per_core": stats([r["torchvision_img_per_s"] / w for r in runs
                                                if r["torchvision_img_per_s"] > 0])}
    tv = [r for r in runs if r["torchvision_img_per_s"] > 0]
    if tv:
        out["ratio_jpeg"] = stats([r["jpeg_img_per_s"] / r["torchvision_img_per_s"] for r in tv])
        out["ratio_h5"] = stats([r["h5_img_per_s"] / r["torchvision_img_per_s"] for r in tv])
    return out


def load_average(raw):
    path = os.path.join(raw, "load.txt")
    if not os.path.exists(path):
        return None
    entries = []
    for line in open(path):
        parts = line.split()
        if len(parts) >= 5:
            entries.append({"t": int(parts[0]), "at": parts[1], "load1": float(parts[2]),
                            "load5": float(parts[3]), "load15": float(parts[4])})
    # load.txt keeps every invocation (--only reruns some sections): per section,
    # the load of the latest invocation that ran it; the totals describe the latest.
    per_section = {}
    for sec in ("step", "epoch", "ddp", "loader"):
        last_start = None
        for i, e in enumerate(entries):
            if e["at"] == "start":
                run = i
            if e["at"].startswith(sec + "_") and not e["at"].endswith("_end"):
                if last_start != run:
                    per_section[sec] = []
                    last_start = run
                per_section[sec].append(e["load1"])
    per_section = {k: stats(v) for k, v in per_section.items()}
    starts = [i for i, e in enumerate(entries) if e["at"] == "start"]
    latest = entries[starts[-1]:] if starts else entries
    return {"load1": stats([e["load1"] for e in latest]), "per_section": per_section, "entries": entries,
            "duration_s": latest[-1]["t"] - latest[0]["t"]}


# ---------------------------------------------------------------------------------
# targets, Markdown, plots


def targets(res):
    t = []

    def add(name, goal, value, met, note=""):
        t.append({"target": name, "goal": goal, "measured": value, "met": met, "note": note})
    for r in res.get("train_step") or []:
        goal = 1.2 if r["precision"] == "fp32" else 1.0
        cap = "" if r.get("isa_cap", "native") == "native" else f" (ISA cap {r['isa_cap']})"
        add(f"train step {r['arch']}@{r['image_size']} bs{r['batch']} {r['precision']}{cap}",
            f">= {goal:g}x PyTorch", f"{r['ratio']:.2f}x (best step {r['ratio_best']:.2f}x)", r["ratio"] >= goal)
    e = res.get("epoch")
    if e:
        add("reference-recipe epoch (2 ranks)", ">= 2x PyTorch", f"{e['speed_ratio_epoch']:.2f}x",
            e["speed_ratio_epoch"] >= 2.0, "shortened epoch (--quick)" if e["flags"] else "")
        if e.get("rss_ratio") is not None:
            add("peak RSS per rank (training + validation)", "<= PyTorch",
                f"{e['rss_ratio']:.2f}x of the PyTorch rank, {e['rss_ratio_with_workers']:.2f}x of rank + its workers",
                e["rss_ratio"] <= 1.0)
        if e.get("rss_ratio_time_v") is not None:
            add("peak RSS, largest process of the whole run (/usr/bin/time -v)", "<= PyTorch",
                f"{e['rss_ratio_time_v']:.2f}x", e["rss_ratio_time_v"] <= 1.0,
                "resnet_ddp's includes writing 2 checkpoints; the PyTorch script writes none")
        add("exposed comm in the recipe epoch", "<= 5 % of the step", f"{e['exposed_comm_pct']:.1f} %",
            e["exposed_comm_pct"] <= 5.0)
    d = res.get("ddp")
    if d and d["buckets"]:
        best = min(d["buckets"], key=lambda b: b["overlap_on_exposed_pct"]["median"])
        default = [b for b in d["buckets"] if abs(b["bucket_mb"] - 25) < 1e-6] or [best]
        dflt = default[0]
        add(f"exposed comm, {d['config']['arch']}@{d['config']['pixels']} bs{d['config']['batch']} (stress case), "
            f"default {dflt['bucket_mb']:g} MB buckets", "<= 5 % of the step",
            f"{dflt['overlap_on_exposed_pct']['median']:.1f} % (best: {best['overlap_on_exposed_pct']['median']:.1f} % "
            f"with {best['bucket_mb']:g} MB buckets)", dflt["overlap_on_exposed_pct"]["median"] <= 5.0)
    ld = res.get("loader")
    if ld and ld.get("ratio_jpeg"):
        add("loader JPEG img/s per core", ">= 2x torchvision", f"{ld['ratio_jpeg']['median']:.2f}x",
            ld["ratio_jpeg"]["median"] >= 2.0)
        add("loader .h5 img/s per core", ">= 10x torchvision", f"{ld['ratio_h5']['median']:.2f}x",
            ld["ratio_h5"]["median"] >= 10.0)
    return t


def markdown(res):
    m = res["machine"]
    la = res.get("load_average")
    L = []
    L.append(f"Machine: {m.get('cores')} cores, {m.get('cpu_model')}, AVX512-BF16: "
             f"{'yes' if m.get('cpu_flags_bf16') == 'avx512_bf16' else 'no'}; PyTorch {m.get('torch_version')}; "
             f"{m.get('mpi_version')}; commit {m.get('git_commit')}; {m.get('date')}.")
    if la:
        L.append(f"Load average (1 min) during the run: median {la['load1']['median']:.1f}, "
                 f"min {la['load1']['min']:.1f}, max {la['load1']['max']:.1f} on {m.get('cores')} cores"
                 f"{' (other jobs shared the machine)' if la['load1']['max'] > float(m.get('cores') or 1) else ''}; wall time of the latest invocation {la['duration_s'] / 60:.1f} min.")
        if la.get("per_section"):
            L.append("Load average by section (median of the 1-minute load at each run's start): " + ", ".join(
                f"{k} {v['median']:.1f}" for k, v in la["per_section"].items() if v) + ".")
    mode = "quick (--quick)" if m.get("quick") == "1" else "full"
    L.append(f"Mode: {mode}. Figures: median (min–max) over the runs; ratios are resnet_ddp / PyTorch "
             "from the same run (speed ratios for times).")
    L.append("")
    st = res.get("train_step")
    if st:
        L.append(f"### 1. Training step (forward + backward + Adam, equal threads; PyTorch "
                 f"{st[0]['pytorch_version']}{', channels-last' if st[0].get('pytorch_channels_last') else ''}; "
                 "bf16 = PyTorch autocast)")
        L.append("")
        L.append("| ISA cap (resnet_ddp / PyTorch ran) | model | precision | size | batch | threads | resnet_ddp img/s | PyTorch img/s | ratio (median) | ratio (best step) |")
        L.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in st:
            L.append(f"| {r.get('isa_cap', 'native')} ({r.get('resnet_ddp_isa', '?')} / "
                     f"{r.get('pytorch_cpu_capability', '?')}) | {r['arch']} | {r['precision']} | {r['image_size']} | {r['batch']} | {r['threads']} | "
                     f"{fmt(r['resnet_ddp_img_s'], 2)} | {fmt(r['pytorch_img_s'], 2)} | "
                     f"**{r['ratio']:.2f}×** | {r['ratio_best']:.2f}× |")
        L.append(f"\n{st[0]['steps']} timed steps after 1 warm-up per model and framework; min–max are the "
                 "slowest and fastest step.")
        L.append("")
    e = res.get("epoch")
    if e:
        rd, pt = e["resnet_ddp"], e["pytorch"]
        L.append("### 2. Reference-recipe epoch, 2 ranks (1322 train / 363 val JPEGs, ResNet-34, AutoAugment)")
        L.append("")
        if e["flags"]:
            L.append(f"**Shortened epoch (quick mode): `{e['flags']}`** — training stops after that many steps; "
                     "validation runs on all 363 images.")
            L.append("")
        L.append("| seconds | resnet_ddp | PyTorch (gloo) | speed ratio |")
        L.append("|---|---:|---:|---:|")
        for k, label in (("epoch_s", "epoch (train + validation)"), ("train_s", "training"),
                         ("val_s", "validation"), ("data_wait_s", "waiting for data (in training)"),
                         ("process_wall_s", "whole process (start-up included)")):
            ratio = pt[k]["median"] / rd[k]["median"] if rd[k] and pt[k] and rd[k]["median"] > 0 else None
            L.append(f"| {label} | {fmt(rd[k])} | {fmt(pt[k])} | "
                     f"{(f'**{ratio:.2f}×**' if k == 'epoch_s' else f'{ratio:.2f}×') if ratio else '–'} |")
        s = rd["split_ms"]
        L.append(f"\nresnet_ddp step split (ms per step, median run): data wait {s['data']:.1f} + forward "
                 f"{s['forward']:.1f} + backward {s['backward']:.1f} + exposed comm {s['comm']:.1f} + optimizer "
                 f"{s['optimizer']:.1f} = {sum(s.values()):.1f}; exposed comm = {e['exposed_comm_pct']:.1f} % of "
                 "training time.")
        L.append("")
        L.append("### 5. Peak memory per rank (MiB, from the epoch runs above)")
        L.append("")
        L.append("| | resnet_ddp | PyTorch | ratio |")
        L.append("|---|---:|---:|---:|")
        rm, pm = rd.get("memory"), pt.get("memory")
        if rm and pm:
            L.append(f"| rank RSS, training + validation (sampled every 0.2 s) | {fmt(rm['train_val_peak_mib'], 0)} | "
                     f"{fmt(pm['train_val_peak_mib'], 0)} | **{e['rss_ratio']:.2f}×** |")
            L.append(f"| rank + its DataLoader worker processes (upper bound) | {fmt(rm['train_val_peak_mib'], 0)} "
                     f"(loader threads are in-process) | {fmt(pm['rank_plus_workers_peak_mib'], 0)} | "
                     f"{e['rss_ratio_with_workers']:.2f}× |")
            L.append(f"| rank RSS, whole run (resnet_ddp: + checkpoint writes, final evaluation) | "
                     f"{fmt(rm['whole_run_peak_mib'], 0)} | {fmt(pm['whole_run_peak_mib'], 0)} | "
                     f"{rm['whole_run_peak_mib']['median'] / pm['whole_run_peak_mib']['median']:.2f}× |")
        if rd["peak_rss_mib"] and pt["peak_rss_mib"]:
            L.append(f"| largest process, `/usr/bin/time -v` Maximum resident set size | {fmt(rd['peak_rss_mib'], 0)} | "
                     f"{fmt(pt['peak_rss_mib'], 0)} | {e['rss_ratio_time_v']:.2f}× |")
        L.append("")
    d = res.get("ddp")
    if d:
        c = d["config"]
        L.append(f"### 3. DDP overhead ({c['arch']} @{c['pixels']} px, batch {c['batch']}/rank, {c['threads']} "
                 f"thread/rank, {c['grad_mb']:.1f} MB of gradients, 2 ranks, mean of {c['steps']} steps per run)")
        L.append("")
        L.append("| bucket MB | step ms, no all-reduce | step ms, overlap on | exposed % (on) | step ms, overlap off | exposed % (off) |")
        L.append("|---:|---:|---:|---:|---:|---:|")
        for b in d["buckets"]:
            L.append(f"| {b['bucket_mb']:g} | {fmt(b['no_allreduce_ms'], 0)} | {fmt(b['overlap_on_ms'], 0)} | "
                     f"{fmt(b['overlap_on_exposed_pct'])} | {fmt(b['overlap_off_ms'], 0)} | "
                     f"{fmt(b['overlap_off_exposed_pct'])} |")
        w = d.get("weak_scaling")
        if w:
            L.append(f"\nWeak scaling, same batch per rank: 1 rank {fmt(w['img_s_1_rank'])} img/s, 2 ranks "
                     f"{fmt(w['img_s_2_ranks'])} img/s → efficiency {100 * w['efficiency']:.0f} %.")
        L.append("")
    ld = res.get("loader")
    if ld:
        L.append(f"### 4. Loader ({ld['workers']} worker, AutoAugment + Resize({ld['image_size']}), "
                 f"{ld['images']} images per run)")
        L.append("")
        L.append("| loader | img/s per core | vs torchvision |")
        L.append("|---|---:|---:|")
        L.append(f"| resnet_ddp, JPEG ImageFolder | {fmt(ld['jpeg_img_s_per_core'])} | "
                 f"**{ld['ratio_jpeg']['median']:.2f}×** |" if ld.get("ratio_jpeg") else "")
        L.append(f"| resnet_ddp, packed .h5 | {fmt(ld['h5_img_s_per_core'])} | "
                 f"**{ld['ratio_h5']['median']:.2f}×** |" if ld.get("ratio_h5") else "")
        L.append(f"| torchvision ImageFolder + DataLoader | {fmt(ld['torchvision_img_s_per_core'])} | 1× |")
        L.append("")
    t = res.get("targets")
    if t:
        L.append("### Targets")
        L.append("")
        L.append("| target | goal | measured | met? |")
        L.append("|---|---|---|---|")
        for x in t:
            note = f" ({x['note']})" if x["note"] else ""
            L.append(f"| {x['target']} | {x['goal']} | {x['measured']}{note} | {'met' if x['met'] else '**not met**'} |")
        L.append("")
    return "\n".join(L) + "\n"


def write_plot_data(res, raw):
    paths = {}
    st = res.get("train_step")
    if st:
        p = os.path.join(raw, "plot_step.dat")
        with open(p, "w") as f:
            f.write("# label rd_med rd_min rd_max pt_med pt_min pt_max ratio\n")
            for r in st:
                a, b = r["resnet_ddp_img_s"], r["pytorch_img_s"]
                f.write(f"\"{r['arch']}@{r['image_size']}\\nbs{r['batch']} {r['precision']}\" {a['median']} {a['min']} {a['max']} "
                        f"{b['median']} {b['min']} {b['max']} {r['ratio']}\n")
        paths["step"] = p
    e = res.get("epoch")
    if e:
        p = os.path.join(raw, "plot_epoch.dat")
        with open(p, "w") as f:
            f.write("# label compute_in_train data_wait val\n")
            for name, key in (("resnet_ddp", "resnet_ddp"), ("PyTorch", "pytorch")):
                s = e[key]
                tr, dw, va = s["train_s"]["median"], s["data_wait_s"]["median"], s["val_s"]["median"]
                f.write(f"\"{name}\" {tr - dw} {dw} {va}\n")
        paths["epoch"] = p
    d = res.get("ddp")
    if d and d["buckets"]:
        p = os.path.join(raw, "plot_ddp.dat")
        with open(p, "w") as f:
            f.write("# bucket_mb on_med on_min on_max off_med off_min off_max\n")
            for b in d["buckets"]:
                on, off = b["overlap_on_exposed_pct"], b["overlap_off_exposed_pct"]
                f.write(f"{b['bucket_mb']} {on['median']} {on['min']} {on['max']} "
                        f"{off['median']} {off['min']} {off['max']}\n")
        paths["ddp"] = p
    ld = res.get("loader")
    if ld and ld.get("ratio_jpeg"):
        p = os.path.join(raw, "plot_loader.dat")
        with open(p, "w") as f:
            f.write("# label med min max\n")
            for label, k in (("torchvision\\nJPEG", "torchvision_img_s_per_core"),
                             ("resnet_ddp\\nJPEG", "jpeg_img_s_per_core"), ("resnet_ddp\\n.h5", "h5_img_s_per_core")):
                s = ld[k]
                f.write(f"\"{label}\" {s['median']} {s['min']} {s['max']}\n")
        paths["loader"] = p
    sm = res["scaling_model"]
    p = os.path.join(raw, "plot_scaling.dat")
    with open(p, "w") as f:
        # One gnuplot data block per cluster/model/precision: gpus eff_overlap eff_no_overlap
        for cname, cl in sm["clusters"].items():
            combos = sorted({(r["model"], r["precision"]) for r in cl["rows"]})
            for model, prec in combos:
                f.write(f"# {cname} {model} {prec}\n")
                for r in cl["rows"]:
                    if r["model"] == model and r["precision"] == prec:
                        f.write(f"{r['gpus']} {r['eff_overlap']:.4f} {r['eff_no_overlap']:.4f}\n")
                f.write("\n\n")
    paths["scaling"] = p
    return paths


def run_gnuplot(paths, raw, plots_dir):
    if not shutil.which("gnuplot"):
        print("summarize.py: gnuplot not found, no PNGs (apt-get install gnuplot-nox)", file=sys.stderr)
        return []
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot.gnuplot")
    made = []
    for name, data in paths.items():
        png = os.path.join(plots_dir, f"results_{name}.png")
        cmd = ["gnuplot", "-e", f"section='{name}'; data='{data}'; out='{png}'", script]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"summarize.py: gnuplot failed for {name}: {r.stderr.strip()}", file=sys.stderr)
        else:
            made.append(png)
    return made


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--raw", required=True, help="bench/results.raw written by run_bench.sh")
    ap.add_argument("--json", required=True)
    ap.add_argument("--md", required=True)
    ap.add_argument("--plots", required=True, help="directory for results_*.png")
    a = ap.parse_args()
    if not os.path.isdir(a.raw):
        sys.exit(f"summarize.py: --raw '{a.raw}': no such directory (run bench/run_bench.sh first)")
    res = {"machine": read_kv(os.path.join(a.raw, "machine.txt")), "load_average": load_average(a.raw),
           "train_step": summarize_step(a.raw), "epoch": summarize_epoch(a.raw), "ddp": summarize_ddp(a.raw),
           "loader": summarize_loader(a.raw), "scaling_model": scaling_model()}
    res["targets"] = targets(res)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    with open(a.md, "w") as f:
        f.write(markdown(res))
    made = run_gnuplot(write_plot_data(res, a.raw), a.raw, a.plots)
    sys.stdout.write(markdown(res))
    for p in made:
        print(f"plot: {p}")


if __name__ == "__main__":
    main()
