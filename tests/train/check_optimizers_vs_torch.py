#!/usr/bin/env python3
"""train::Optimizer (tests/train/optim_driver.cpp) against PyTorch over 100 recorded steps.

Every case runs the same recorded gradients through torch.optim (AdamW, Adam, SGD,
RMSprop as torchvision's reference builds it), timm's Lars / Lamb, and the driver, with
torchvision's param groups (references/classification/utils.set_weight_decay semantics:
--norm-weight-decay, --bias-weight-decay) and torch.nn.utils.clip_grad_norm_
(--clip-grad-norm), and compares the parameters after every step: per tensor,
max |ours - torch| / max |torch| must stay <= 1e-6.

timm is not installed for Debian's python; the LARS / LAMB references below follow
timm.optim.lars.Lars and timm.optim.lamb.Lamb (defaults: Lars trust_coeff 1e-3, eps 1e-8,
no trust clip, adapting only tensors with non-zero decay; Lamb betas (0.9, 0.999), eps 1e-6,
bias correction, grad averaging, max_grad_norm 1.0 global clip, no trust clip). When timm
is importable the script uses timm's own classes instead.
Exit 77 (skipped) without torch.
"""
import argparse
import collections
import os
import subprocess
import sys

try:
    import numpy as np
    import torch
except ImportError:
    print("torch/numpy not available: skipped")
    sys.exit(77)

STEPS = 100
TOLERANCE = 1e-6


def build_model():
    """Parameters of several shapes, with torchvision-style names and batch-norm modules."""
    nn = torch.nn
    torch.manual_seed(0)
    block = nn.Module()
    block.conv = nn.Conv2d(8, 8, 3, bias=False)
    block.downsample = nn.Sequential(nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8))
    model = nn.Sequential(collections.OrderedDict(
        conv1=nn.Conv2d(3, 8, 3, bias=False), bn1=nn.BatchNorm2d(8),
        layer1=nn.Sequential(block), fc=nn.Linear(8, 5)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.5 + (1.0 if name.endswith("bn1.weight") else 0.0))
    return model


def weight_decay_groups(model, weight_decay, norm_weight_decay, bias_weight_decay):
    """torchvision's set_weight_decay: a "bias" custom key first, then norm modules, else other."""
    norm_classes = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm)
    groups = {"other": [], "norm": [], "bias": []}
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if bias_weight_decay is not None and name == "bias":
                groups["bias"].append(p)
            elif norm_weight_decay is not None and isinstance(module, norm_classes):
                groups["norm"].append(p)
            else:
                groups["other"].append(p)
    decays = {"other": weight_decay, "norm": norm_weight_decay, "bias": bias_weight_decay}
    return [{"params": groups[k], "weight_decay": decays[k]} for k in groups if groups[k]]


class TimmLars(torch.optim.Optimizer):
    """timm.optim.lars.Lars's algorithm (timm's defaults), written from its description."""

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0, nesterov=False, trust_coeff=0.001, eps=1e-8):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                                      trust_coeff=trust_coeff, eps=eps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            wd, momentum = group["weight_decay"], group["momentum"]
            for p in group["params"]:
                grad = p.grad
                if wd != 0:
                    w_norm, g_norm = p.norm(2.0), grad.norm(2.0)
                    trust = group["trust_coeff"] * w_norm / (g_norm + w_norm * wd + group["eps"])
                    one = torch.ones_like(trust)
                    trust = torch.where(w_norm > 0, torch.where(g_norm > 0, trust, one), one)
                    grad.add_(p, alpha=wd)
                    grad.mul_(trust)
                if momentum != 0:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        buf = state["momentum_buffer"] = torch.clone(grad).detach()
                    else:
                        buf = state["momentum_buffer"]
                        buf.mul_(momentum).add_(grad)
                    grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
                p.add_(grad, alpha=-group["lr"])


class TimmLamb(torch.optim.Optimizer):
    """timm.optim.lamb.Lamb's algorithm (timm's defaults), written from its description."""

    def __init__(self, params, lr, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-6, max_grad_norm=1.0):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, betas=betas, eps=eps,
                                      max_grad_norm=max_grad_norm))

    @torch.no_grad()
    def step(self):
        grads = [p.grad for g in self.param_groups for p in g["params"]]
        global_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        clip = (global_norm / self.defaults["max_grad_norm"]).clamp_(min=1.0)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            group["step"] = group.get("step", 0) + 1
            bc1, bc2 = 1 - beta1 ** group["step"], 1 - beta2 ** group["step"]
            for p in group["params"]:
                grad = p.grad
                grad.div_(clip)
                state = self.state[p]
                if not state:
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (v.sqrt() / (bc2 ** 0.5)).add_(group["eps"])
                update = (m / bc1).div_(denom)
                wd = group["weight_decay"]
                if wd != 0:
                    update.add_(p, alpha=wd)
                    w_norm, u_norm = p.norm(2.0), update.norm(2.0)
                    trust = w_norm / u_norm
                    one = torch.ones_like(trust)
                    trust = torch.where(w_norm > 0, torch.where(u_norm > 0, trust, one), one)
                    update.mul_(trust)
                p.add_(update, alpha=-group["lr"])


def timm_classes():
    try:
        from timm.optim.lamb import Lamb
        from timm.optim.lars import Lars
        return Lars, Lamb, "timm.optim"
    except Exception:  # not installed, or needs a newer torch
        return TimmLars, TimmLamb, "in-script timm algorithm"


def make_optimizer(case, groups):
    kind, lr, opts = case["optimizer"], case["lr"], case
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=lr)
    if kind == "adam":
        return torch.optim.Adam(groups, lr=lr)
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=opts.get("momentum", 0.0), nesterov=opts.get("nesterov", False))
    if kind == "rmsprop":  # torchvision's references/classification/train.py
        return torch.optim.RMSprop(groups, lr=lr, momentum=opts.get("momentum", 0.0), eps=0.0316, alpha=0.9)
    lars, lamb, _ = timm_classes()
    if kind == "lars":
        return lars(groups, lr=lr, momentum=opts.get("momentum", 0.0), nesterov=opts.get("nesterov", False))
    if kind == "lamb":
        return lamb(groups, lr=lr)
    raise ValueError(kind)


def run_torch(case, init, grads):
    model = build_model()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in init.items():
            params[name].copy_(torch.from_numpy(value))
    groups = weight_decay_groups(model, case.get("weight_decay", 0.0), case.get("norm_weight_decay"),
                                 case.get("bias_weight_decay"))
    opt = make_optimizer(case, groups)
    trajectory = []
    for step_grads in grads:
        for name, p in params.items():
            p.grad = torch.from_numpy(step_grads[name].copy())
        if case.get("clip_grad_norm"):
            torch.nn.utils.clip_grad_norm_(list(params.values()), case["clip_grad_norm"])
        opt.step()
        trajectory.append({n: p.detach().numpy().copy() for n, p in params.items()})
    return trajectory


def run_driver(args, case, names, shapes, workdir):
    flags = ["--device", args.device]
    for key in ("optimizer", "lr", "weight_decay", "norm_weight_decay", "bias_weight_decay", "momentum",
                "clip_grad_norm"):
        if case.get(key) is not None:
            flags += ["--" + key.replace("_", "-"), str(case[key])]
    if case.get("nesterov"):
        flags.append("--nesterov")
    subprocess.run([args.driver, workdir] + flags, check=True)
    flat = np.fromfile(os.path.join(workdir, "out.bin"), dtype=np.float32)
    sizes = [int(np.prod(s)) for s in shapes]
    total = sum(sizes)
    assert flat.size == total * STEPS, (flat.size, total)
    out = []
    for step in range(STEPS):
        row, off = {}, step * total
        for name, shape, size in zip(names, shapes, sizes):
            row[name] = flat[off:off + size].reshape(shape)
            off += size
        out.append(row)
    return out


CASES = [
    dict(optimizer="adamw", lr=0.01, weight_decay=0.05),
    dict(optimizer="adamw", lr=0.01, weight_decay=0.05, norm_weight_decay=0.0, bias_weight_decay=0.01),
    dict(optimizer="adam", lr=0.01, weight_decay=1e-3, norm_weight_decay=0.0),
    dict(optimizer="sgd", lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3, norm_weight_decay=0.0,
         clip_grad_norm=2.0),
    dict(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-3, clip_grad_norm=1.0),
    dict(optimizer="adam", lr=0.01, clip_grad_norm=3.0),
    dict(optimizer="rmsprop", lr=0.01, momentum=0.9, weight_decay=1e-3, norm_weight_decay=0.0),
    dict(optimizer="rmsprop", lr=0.01, momentum=0.0, weight_decay=1e-3),
    dict(optimizer="lars", lr=0.5, momentum=0.9, weight_decay=1e-3),
    dict(optimizer="lars", lr=0.5, momentum=0.9, nesterov=True, weight_decay=1e-3, norm_weight_decay=0.0,
         bias_weight_decay=0.0),
    dict(optimizer="lamb", lr=0.01, weight_decay=0.01),
    dict(optimizer="lamb", lr=0.01, weight_decay=0.01, norm_weight_decay=0.0, bias_weight_decay=0.0,
         clip_grad_norm=2.0),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)

    model = build_model()
    names = [n for n, _ in model.named_parameters()]
    shapes = [tuple(p.shape) for _, p in model.named_parameters()]
    init = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    rng = np.random.default_rng(27)
    # Recorded gradients: a different global size each step (so the clips sometimes bite),
    # one tensor's gradient now and then exactly zero (the trust ratios' special case).
    grads = []
    for step in range(STEPS):
        scale = float(rng.choice([0.02, 0.3, 1.0, 4.0]))
        row = {n: (rng.standard_normal(s) * scale).astype(np.float32) for n, s in zip(names, shapes)}
        if step % 17 == 5:
            row["fc.bias"][:] = 0.0
        grads.append(row)
    with open(os.path.join(args.workdir, "spec.txt"), "w") as f:
        for n, s in zip(names, shapes):
            f.write(n + " " + " ".join(str(d) for d in s) + "\n")
    np.concatenate([init[n].ravel() for n in names]).astype(np.float32).tofile(os.path.join(args.workdir, "init.bin"))
    np.concatenate([g[n].ravel() for g in grads for n in names]).astype(np.float32).tofile(
        os.path.join(args.workdir, "grads.bin"))

    print("LARS / LAMB reference:", timm_classes()[2])
    failed = False
    for case in CASES:
        ref = run_torch(case, init, grads)
        ours = run_driver(args, case, names, shapes, args.workdir)
        worst, where = 0.0, None
        for step in range(STEPS):
            for n in names:
                denom = max(float(np.abs(ref[step][n]).max()), 1e-30)
                err = float(np.abs(ours[step][n].astype(np.float64) - ref[step][n]).max()) / denom
                if err > worst:
                    worst, where = err, (step + 1, n)
        moved = max(float(np.abs(ref[-1][n] - init[n]).max()) for n in names)
        ok = worst <= TOLERANCE and moved > 1e-3
        failed |= not ok
        print(f"{'ok  ' if ok else 'FAIL'} {case}: max relative error {worst:.3g} (step, tensor {where}); "
              f"largest parameter change {moved:.3g}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
