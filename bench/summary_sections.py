"""The sections of bench/results.json, one per benchmark of run_bench.sh: the
training step, whole epochs, DDP overhead, the loader, and the load average.
"""
import csv
import glob
import json
import os

from summary_common import load_json, result_json_line, stats, time_v


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
