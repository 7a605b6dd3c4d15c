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
import json
import os
import sys

# The modules sit next to this script (run as bench/summarize.py from anywhere).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from summary_common import read_kv  # noqa: E402
from summary_model import scaling_model  # noqa: E402
from summary_report import markdown, run_gnuplot, targets, write_plot_data  # noqa: E402
from summary_sections import load_average, summarize_ddp, summarize_epoch, summarize_loader, summarize_step  # noqa: E402


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
