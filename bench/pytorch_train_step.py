#!/usr/bin/python3
"""PyTorch reference for bench/train_step_bench: one training step (forward,
backward, Adam lr 1e-4, label-smoothed cross-entropy 0.1) of a torchvision ResNet
in fp32 on the CPU, timed as the median of a few steps after warm-up.

Prints one JSON object on stdout, e.g.
  {"framework": "pytorch", "threads": 2, "results": [{"arch": "resnet34", ...}]}

Run it with Debian's interpreter (/usr/bin/python3), which has python3-torch and
python3-torchvision; the python3 first on PATH may not.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../tools"))
from torch_reference import ARCHS, build_model, import_deps  # noqa: E402


def parse_config(text):
    """'resnet34:244:16' -> ('resnet34', 244, 16)."""
    parts = text.split(":")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"--config '{text}': expected ARCH:SIZE:BATCH, e.g. resnet34:244:16")
    arch, size, batch = parts
    if arch not in ARCHS:
        raise argparse.ArgumentTypeError(f"--config '{text}': arch must be one of {', '.join(ARCHS)}")
    try:
        size, batch = int(size), int(batch)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--config '{text}': SIZE and BATCH must be integers")
    if size < 32 or batch < 1:
        raise argparse.ArgumentTypeError(f"--config '{text}': SIZE must be >= 32 and BATCH >= 1")
    return arch, size, batch


def forward_gflop(torch, model, x):
    """Conv and linear FLOPs of one forward pass (2 per multiply-add), counted with hooks."""
    macs = [0]

    def conv_hook(mod, inp, out):
        macs[0] += out.numel() * (mod.in_channels // mod.groups) * mod.kernel_size[0] * mod.kernel_size[1]

    def linear_hook(mod, inp, out):
        macs[0] += out.numel() * mod.in_features

    handles = []
    for mod in model.modules():
        if isinstance(mod, torch.nn.Conv2d):
            handles.append(mod.register_forward_hook(conv_hook))
        elif isinstance(mod, torch.nn.Linear):
            handles.append(mod.register_forward_hook(linear_hook))
    with torch.no_grad():
        model.eval()
        model(x)
        model.train()
    for h in handles:
        h.remove()
    return 2.0 * macs[0] / 1e9


def bench_one(torch, torchvision, arch, size, batch, args):
    torch.manual_seed(0)
    model = build_model(torch, torchvision, arch, args.head, args.num_classes, seed=None)
    model.train()
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, args.num_classes, (batch,))
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    fwd_gflop = forward_gflop(torch, model, x)
    # Training step = forward + backward (data and weight gradients, about 2x forward).
    step_gflop = 3.0 * fwd_gflop
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        if args.precision == "bf16":
            # PyTorch's CPU mixed precision: autocast runs convolutions/linears in bf16.
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
            loss = loss_fn(out.float(), y)
        else:
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    return {
        "arch": arch, "image_size": size, "batch": batch, "head": args.head,
        "num_classes": args.num_classes, "steps": args.steps, "warmup": args.warmup,
        "step_ms_median": round(median * 1e3, 2),
        "step_ms_min": round(min(times) * 1e3, 2),
        "step_ms_max": round(max(times) * 1e3, 2),
        "img_per_s": round(batch / median, 3),
        "gflop_per_step": round(step_gflop, 3),
        "gflops": round(step_gflop / median, 2),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", type=parse_config, metavar="ARCH:SIZE:BATCH",
                   help="model, square image size and batch (repeatable); "
                        "default resnet34:244:16 and resnet18:64:32")
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads (default: OMP_NUM_THREADS or all cores)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    p.add_argument("--steps", type=int, default=3, help="timed steps; the median is reported (default 3)")
    p.add_argument("--head", choices=("fc", "mlp"), default="mlp",
                   help="plain fc or the reference Linear-ReLU-Linear head (default mlp)")
    p.add_argument("--num-classes", type=int, default=3, help="classes of the head (default 3)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="fp32, or bf16 autocast (default fp32)")
    p.add_argument("--channels-last", action="store_true",
                   help="NHWC memory format (PyTorch's faster CPU path; default plain NCHW)")
    p.add_argument("--isa", default="native",
                   help="the ISA cap the caller set in the environment (recorded in the output)")
    args = p.parse_args()
    if args.threads < 0:
        p.error("--threads must be >= 0")
    if args.warmup < 0 or args.steps < 1:
        p.error("--warmup must be >= 0 and --steps >= 1")
    if args.num_classes < 1:
        p.error("--num-classes must be >= 1")
    configs = args.config or [("resnet34", 244, 16), ("resnet18", 64, 32)]

    torch, torchvision = import_deps("pytorch_train_step.py")
    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or os.cpu_count()
    torch.set_num_threads(threads)
    results = [bench_one(torch, torchvision, a, s, b, args) for a, s, b in configs]
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # torch < 2.0
        capability = "unknown"
    print(json.dumps({"framework": "pytorch", "version": torch.__version__, "threads": threads,
                      "isa": args.isa, "cpu_capability": capability,
                      "precision": args.precision, "channels_last": args.channels_last,
                      "results": results}))


if __name__ == "__main__":
    main()
