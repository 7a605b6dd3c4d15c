#!/usr/bin/python3
"""PyTorch side of bench/op_profile.sh: splits one training step (forward, backward,
Adam lr 1e-4, label-smoothed 0.1 cross-entropy, reference Linear-ReLU-Linear head
with 3 classes, random batch) of a torchvision ResNet into the categories of
bench/op_profile_bench.cpp, from torch.profiler's self CPU time over N steps after
warm-up.

  /usr/bin/python3 bench/pytorch_op_profile.py --config resnet34:244:16 --threads 2 \\
      [--steps N] [--warmup N] [--precision fp32|bf16] [--json PATH]

How aten ops map to categories. The step runs in four record_function scopes that
mirror resnet_ddp's step: rd::forward (the model), rd::loss (cross-entropy and its
gradient w.r.t. the logits, as Backend::softmax_xent does both), rd::backward (the
model's backward from those logits) and rd::optimizer (Adam). Every profiler event's
self CPU time goes to one category:
  - rd::loss -> loss; rd::optimizer and Optimizer.zero_grad -> optimizer.
  - rd::forward: by the outermost op under the scope, so everything an op calls
    (oneDNN reorders in mkldnn_convolution, empty, as_strided...) counts with it, as
    resnet_ddp's conv time includes its own reorders:
      aten::conv2d / convolution -> conv_fwd; aten::batch_norm -> bn_fwd, and the
      BN module's num_batches_tracked += 1 (aten::add_ on a 0-d tensor) too;
      aten::relu(_) / aten::add(_) -> eltwise_fwd; aten::max_pool2d /
      adaptive_avg_pool2d -> pool_fwd; aten::linear -> linear_fwd;
      aten::copy_ / contiguous / to -> copy; anything else (flatten) -> other.
  - rd::backward: by the autograd node of the enclosing
    "autograd::engine::evaluate_function: <Node>" (its own self time is the engine's
    cost of running that node and counts with it):
      ConvolutionBackward0 -> conv backward; NativeBatchNormBackward0 -> bn_bwd;
      ReluBackward0 / AddBackward0 -> eltwise_bwd; MaxPool2DWithIndicesBackward0 /
      MeanBackward1 -> pool_bwd; AddmmBackward0 / TBackward0 -> linear_bwd;
      AccumulateGrad and view backwards -> other. An aten::add directly under
      evaluate_function (not inside the node) is the engine summing the two gradients
      of a branch point -> eltwise_bwd, like resnet_ddp's Backend::accumulate.
  - Self time of the rd:: scopes themselves (Python and dispatch between ops) ->
    outside, like resnet_ddp's time outside Backend calls.
aten::convolution_backward computes the data and the weight gradient in one op, so
the profiler cannot split it. One extra step runs with oneDNN's verbose mode (Debian's
PyTorch uses the system oneDNN), and the conv backward total is split in the ratio of
the backward_data and backward_weights primitives' execution times there (reorders
around them are shared out in that ratio). Without oneDNN it stays one row
(conv_bwd_data holds the total, and "conv_bwd_split" says so).

Prints a table on stdout; --json writes the same numbers as JSON.
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_train_step as pts  # noqa: E402  (same model builder and --config parser)

KEYS = ["conv_fwd", "conv_bwd_data", "conv_bwd_weights", "bn_fwd", "bn_bwd", "eltwise_fwd", "eltwise_bwd",
        "pool_fwd", "pool_bwd", "linear_fwd", "linear_bwd", "loss", "optimizer", "copy", "other", "outside"]
NAMES = {
    "conv_fwd": "conv forward", "conv_bwd_data": "conv backward-data",
    "conv_bwd_weights": "conv backward-weights", "bn_fwd": "batch norm forward (+ReLU)",
    "bn_bwd": "batch norm backward (+ReLU)", "eltwise_fwd": "relu / add(+relu) forward",
    "eltwise_bwd": "relu / add backward, grad accumulate", "pool_fwd": "pooling forward (max, avg)",
    "pool_bwd": "pooling backward", "linear_fwd": "linear forward", "linear_bwd": "linear backward",
    "loss": "loss (softmax xent, fwd+bwd)", "optimizer": "optimizer (Adam)",
    "copy": "layout conversions / copies / fills", "other": "other ops",
    "outside": "outside ops (Python, dispatch)",
}

FORWARD_OPS = {
    "aten::conv2d": "conv_fwd", "aten::convolution": "conv_fwd", "aten::_convolution": "conv_fwd",
    "aten::mkldnn_convolution": "conv_fwd",
    "aten::batch_norm": "bn_fwd", "aten::_batch_norm_impl_index": "bn_fwd", "aten::native_batch_norm": "bn_fwd",
    "aten::relu": "eltwise_fwd", "aten::relu_": "eltwise_fwd", "aten::add": "eltwise_fwd", "aten::add_": "eltwise_fwd",
    "aten::max_pool2d": "pool_fwd", "aten::max_pool2d_with_indices": "pool_fwd",
    "aten::adaptive_avg_pool2d": "pool_fwd",
    "aten::linear": "linear_fwd", "aten::addmm": "linear_fwd",
    "aten::copy_": "copy", "aten::contiguous": "copy", "aten::to": "copy", "aten::_to_copy": "copy",
}
BACKWARD_NODES = {
    "ConvolutionBackward0": "conv_bwd", "NativeBatchNormBackward0": "bn_bwd",
    "ReluBackward0": "eltwise_bwd", "AddBackward0": "eltwise_bwd",
    "MaxPool2DWithIndicesBackward0": "pool_bwd", "MeanBackward1": "pool_bwd",
    "AddmmBackward0": "linear_bwd", "TBackward0": "linear_bwd",
}
EVALUATE = "autograd::engine::evaluate_function: "
SCOPES = ("rd::forward", "rd::loss", "rd::backward", "rd::optimizer")


def chain(evt):
    """The event and its ancestors, root first."""
    out = []
    while evt is not None:
        out.append(evt)
        evt = evt.cpu_parent
    return out[::-1]


def categorize(evt):
    c = chain(evt)
    names = [e.name for e in c]
    if any(n.startswith("Optimizer.") for n in names):
        return "optimizer"
    scope = next((i for i, n in enumerate(names) if n in SCOPES), None)
    if scope is None:
        return "other"
    if scope == len(c) - 1:
        return "outside"  # the scope's own self time
    kind, top = names[scope], c[scope + 1]
    if kind == "rd::loss":
        return "loss"
    if kind == "rd::optimizer":
        return "optimizer"
    if kind == "rd::forward":
        cat = FORWARD_OPS.get(top.name, "other")
        if top.name == "aten::add_" and top.input_shapes and top.input_shapes[0] == []:
            cat = "bn_fwd"  # BatchNorm2d's num_batches_tracked += 1
        return cat
    # rd::backward
    if not top.name.startswith(EVALUATE):
        return "other"
    if len(c) > scope + 2 and c[scope + 2].name in ("aten::add", "aten::add_"):
        return "eltwise_bwd"  # the engine summing a branch point's gradients
    return BACKWARD_NODES.get(top.name[len(EVALUATE):], "other")


def onednn_conv_backward_ms(torch, step):
    """Run one step with oneDNN verbose on; returns (backward_data ms, backward_weights ms)
    of the convolution primitives, or None when oneDNN printed nothing."""
    fd, path = tempfile.mkstemp(prefix="onednn_verbose_")
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(fd, 1)  # oneDNN prints to the C stdout
    try:
        with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
            step()
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(fd)
    bd = bw = 0.0
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split(",")
            if len(parts) > 6 and parts[1] == "exec" and parts[3] == "convolution":
                if parts[5] == "backward_data":
                    bd += float(parts[-1])
                elif parts[5] == "backward_weights":
                    bw += float(parts[-1])
    os.unlink(path)
    return (bd, bw) if bd + bw > 0 else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, type=pts.parse_config, metavar="ARCH:SIZE:BATCH",
                   help="model, square image size and batch, e.g. resnet34:244:16")
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads (default: OMP_NUM_THREADS or all cores)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--steps", type=int, default=5, help="profiled steps (default 5)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="fp32, or bf16 autocast (default fp32)")
    p.add_argument("--json", metavar="PATH", help="also write the profile as JSON")
    args = p.parse_args()
    if args.threads < 0:
        p.error("--threads must be >= 0")
    if args.warmup < 0 or args.steps < 1:
        p.error("--warmup must be >= 0 and --steps >= 1")
    arch, size, batch = args.config

    torch, torchvision = pts.import_deps("pytorch_op_profile.py")
    from torch.profiler import ProfilerActivity, profile, record_function
    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or os.cpu_count()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = pts.build_model(torch, torchvision, arch, "mlp", 3, seed=None)
    model.train()
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, 3, (batch,))
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        with record_function("rd::forward"):
            if args.precision == "bf16":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = model(x)
                out = out.float()
            else:
                out = model(x)
        # Loss and its gradient first, then the model's backward from d(loss)/d(logits):
        # the same two calls as resnet_ddp's step, so the profiler can tell them apart.
        with record_function("rd::loss"):
            loss = loss_fn(out, y)
            (dout,) = torch.autograd.grad(loss, out)
        with record_function("rd::backward"):
            out.backward(dout)
        with record_function("rd::optimizer"):
            opt.step()

    for _ in range(args.warmup):
        step()
    # Unprofiled steps first: the profiler's own overhead is in the category times.
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    plain_ms = (time.perf_counter() - t0) * 1e3 / args.steps
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        profiled_ms = (time.perf_counter() - t0) * 1e3 / args.steps

    ms = {k: 0.0 for k in KEYS}
    ms["conv_bwd"] = 0.0
    for evt in prof.events():
        ms[categorize(evt)] += evt.self_cpu_time_total / 1e3 / args.steps
    split = onednn_conv_backward_ms(torch, step) if torch.backends.mkldnn.is_available() else None
    conv_bwd = ms.pop("conv_bwd")
    if split:
        ms["conv_bwd_data"] = conv_bwd * split[0] / (split[0] + split[1])
        ms["conv_bwd_weights"] = conv_bwd * split[1] / (split[0] + split[1])
    else:
        ms["conv_bwd_data"] = conv_bwd

    result = {
        "framework": "pytorch", "version": torch.__version__, "arch": arch, "image_size": size, "batch": batch,
        "threads": threads, "precision": args.precision, "steps": args.steps, "warmup": args.warmup,
        "step_ms": round(plain_ms, 3), "step_ms_profiled": round(profiled_ms, 3),
        "conv_bwd_split": "onednn_verbose_ratio" if split else "none (conv_bwd_data holds data+weights)",
        "categories": [{"key": k, "name": NAMES[k], "ms": round(ms[k], 3)} for k in KEYS],
    }
    total = sum(ms.values())
    print(f"PyTorch {torch.__version__} {arch}:{size}:{batch}, {threads} threads, {args.precision}: "
          f"{plain_ms:.1f} ms/step unprofiled, {profiled_ms:.1f} profiled (mean of {args.steps}); "
          f"categories sum to {total:.1f}")
    print(f"{'category':<40} {'ms/step':>10} {'%':>6}")
    for k in KEYS:
        print(f"{NAMES[k]:<40} {ms[k]:>10.2f} {100 * ms[k] / total:>5.1f}%")
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        except OSError as e:
            sys.exit(f"pytorch_op_profile.py: --json '{args.json}': {e.strerror}")


if __name__ == "__main__":
    main()
