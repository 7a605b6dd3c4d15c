#!/usr/bin/env python3
"""The LR schedules of resnet_ddp (tests/train/sched_driver) against torch's
schedulers built the way torchvision's references/classification/train.py builds
them: StepLR / MultiStepLR / ExponentialLR / CosineAnnealingLR(T_max = epochs -
warmup, eta_min), after LinearLR or ConstantLR warmup chained by SequentialLR.
Every epoch's LR must agree within a relative error of 1e-6 (the measured maximum is
printed); each schedule also runs through an export/import (resume) part-way.
Exit 77 (skipped) without torch."""
import subprocess
import sys
import warnings

try:
    import torch
except ImportError:
    print("torch not available: skipped")
    sys.exit(77)

TOLERANCE = 1e-6


def torch_sequence(kind, lr, epochs, steps, step_size, gamma, milestones, eta_min, warmup, method, decay):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    S = torch.optim.lr_scheduler
    if kind == "steplr":
        main = S.StepLR(opt, step_size=step_size, gamma=gamma)
    elif kind == "multisteplr":
        main = S.MultiStepLR(opt, milestones=milestones, gamma=gamma)
    elif kind == "exponentiallr":
        main = S.ExponentialLR(opt, gamma=gamma)
    elif kind in ("cosineannealinglr", "cosine"):
        main = S.CosineAnnealingLR(opt, T_max=epochs - warmup, eta_min=eta_min)
    elif kind == "none":
        main = S.LambdaLR(opt, lambda e: 1.0)
    else:
        raise ValueError(kind)
    sched = main
    if warmup > 0:
        if method == "linear":
            first = S.LinearLR(opt, start_factor=decay, total_iters=warmup)
        else:
            first = S.ConstantLR(opt, factor=decay, total_iters=warmup)
        sched = S.SequentialLR(opt, schedulers=[first, main], milestones=[warmup])
    out = [opt.param_groups[0]["lr"]]
    for _ in range(steps):
        opt.step()
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out


def configs():
    mains = [
        ("steplr", dict(step_size=30, gamma=0.1)),
        ("steplr", dict(step_size=7, gamma=0.5)),
        ("multisteplr", dict(milestones=[30, 60, 90], gamma=0.1)),
        ("multisteplr", dict(milestones=[3, 50], gamma=0.2)),
        ("exponentiallr", dict(gamma=0.95)),
        ("cosineannealinglr", dict(eta_min=0.0)),
        ("cosine", dict(eta_min=1e-5)),
        ("none", dict()),
    ]
    warmups = [(0, "constant", 0.01), (5, "linear", 0.01), (5, "constant", 0.01), (3, "linear", 0.1),
               (1, "linear", 0.5), (10, "constant", 0.3)]
    for i, (kind, kw) in enumerate(mains):
        for j, (w, method, decay) in enumerate(warmups):
            for lr in (0.1, 0.5):
                c = dict(kind=kind, lr=lr, epochs=100, steps=100, step_size=30, gamma=0.1, milestones=[],
                         eta_min=0.0, warmup=w, method=method, decay=decay)
                c.update(kw)
                yield f"m{i}w{j}lr{lr}", c
    # Past T_max the cosine goes back up (torch's recursive form restarts).
    yield "cosine_past_tmax", dict(kind="cosineannealinglr", lr=0.1, epochs=20, steps=70, step_size=30, gamma=0.1,
                                   milestones=[], eta_min=1e-3, warmup=4, method="linear", decay=0.01)


def main():
    driver = sys.argv[1]
    cases = list(configs())
    lines = []
    for resume_at in (0, 37):
        for name, c in cases:
            ms = ",".join(str(m) for m in c["milestones"]) or "-"
            lines.append(f"{name}_r{resume_at} {c['kind']} {c['lr']!r} {c['epochs']} {c['steps']} {c['step_size']} "
                         f"{c['gamma']!r} {ms} {c['eta_min']!r} {c['warmup']} {c['method']} {c['decay']!r} {resume_at}")
    got = subprocess.run([driver], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True).stdout
    ours = {row.split()[0]: [float(x) for x in row.split()[1:]] for row in got.splitlines()}
    worst, worst_at, failures = 0.0, "", 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SequentialLR's step(0) deprecation warning
        for name, c in cases:
            ref = torch_sequence(**c)
            for resume_at in (0, 37):
                key = f"{name}_r{resume_at}"
                mine = ours.get(key)
                if mine is None or len(mine) != len(ref):
                    print(f"FAIL {key}: {0 if mine is None else len(mine)} LRs, torch has {len(ref)}")
                    failures += 1
                    continue
                for e, (a, b) in enumerate(zip(mine, ref)):
                    # Relative to torch's LR; where torch's is 0 (cosine's end), to the base LR.
                    err = abs(a - b) / (abs(b) if b != 0 else c["lr"])
                    if err > worst:
                        worst, worst_at = err, f"{key} epoch {e}: ours {a!r} torch {b!r}"
                    if err > TOLERANCE:
                        failures += 1
                        print(f"FAIL {key} epoch {e}: ours {a!r} torch {b!r} (rel {err:.3g})")
    print(f"{2 * len(cases)} schedules ({len(cases)} x with/without resume), torch {torch.__version__}: "
          f"max relative error {worst:.3g}" + (f" at {worst_at}" if worst_at else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
