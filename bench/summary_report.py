"""What bench/summarize.py writes from the summary: the targets check, the
Markdown table and the gnuplot data and plots.
"""
import os
import shutil
import subprocess
import sys

from summary_common import fmt


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
