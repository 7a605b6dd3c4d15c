#!/usr/bin/python3
"""MixUp / CutMix, the mixed-target loss and RASampler against torch.

Run by ctest (mix_vs_torch): mix_probe (C++) computes ours, this script the
reference with torch 1.13, and compares:
  - loss and gradient: torch.nn.CrossEntropyLoss(label_smoothing) on the probability
    targets torchvision's RandomMixup / RandomCutmix build (one_hot, roll(1, 0),
    mul_(lam).add_(rolled.mul_(1 - lam))); max relative error printed, bound 1e-5;
  - the mixed batch: the reference's in-place tensor ops on the same batch, lambda
    and box; must be bit-identical;
  - CutMix's box from (lambda, r_x, r_y): the reference's arithmetic, exactly;
  - the accuracy rule: argmax of the mixed target (utils.accuracy's target.max(dim=1));
  - RASampler's indices: the reference's algorithm on torch.randperm with a seeded
    torch.Generator, for several n / world / rank / reps / epoch;
  - lambda ~ Beta(alpha, alpha): one-sample Kolmogorov-Smirnov on 4000 fixed-seed
    draws per alpha against the exact Beta CDF, and the MixUp/CutMix choice ~ 1/2.
The torchvision package (0.14) does not ship RandomMixup / RandomCutmix / RASampler
(they live in references/classification), so their formulas are written out here.
Exits 77 (skip) without torch.
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"skip: torch not importable ({e})", file=sys.stderr)
    sys.exit(77)

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def run(probe, *args):
    return subprocess.run([probe, *map(str, args)], check=True, capture_output=True, text=True).stdout


def mixed_target(labels, k, lam):
    """torchvision's RandomMixup / RandomCutmix target, float32 like theirs."""
    target = torch.nn.functional.one_hot(labels, num_classes=k).to(dtype=torch.float32)
    rolled = target.roll(1, 0)
    rolled.mul_(1.0 - lam)
    target.mul_(lam).add_(rolled)
    return target


def check_loss(probe, tmp):
    worst = 0.0
    gen = torch.Generator().manual_seed(5)
    for n, k, lam, eps in [(8, 10, 0.3, 0.1), (5, 3, 0.9, 0.0), (16, 1000, 0.55, 0.1), (1, 7, 0.2, 0.3),
                           (12, 100, 1.0, 0.1), (7, 5, 0.0, 0.05)]:
        logits = (torch.randn(n, k, generator=gen) * 3).to(torch.float32)
        labels = torch.randint(k, (n,), generator=gen)
        if n > 2:
            labels[2] = labels[1]  # a sample mixed with its own class
        lam32 = float(np.float32(lam))
        target = mixed_target(labels, k, lam32)
        z = logits.clone().double().requires_grad_(True)
        ref = torch.nn.CrossEntropyLoss(label_smoothing=eps)(z, target.double())
        ref.backward()
        paths = [os.path.join(tmp, f) for f in ("z.f32", "a.i32", "b.i32", "dz.f32")]
        logits.numpy().tofile(paths[0])
        labels.to(torch.int32).numpy().tofile(paths[1])
        labels.roll(1, 0).to(torch.int32).numpy().tofile(paths[2])
        ours = float(run(probe, "loss", k, lam32, eps, *paths))
        dz = np.fromfile(paths[3], dtype=np.float32).reshape(n, k)
        rel_loss = abs(ours - ref.item()) / abs(ref.item())
        g = z.grad.numpy()
        rel_grad = np.max(np.abs(dz - g)) / np.max(np.abs(g))
        worst = max(worst, rel_loss, rel_grad)
        check(rel_loss < 1e-5 and rel_grad < 1e-5,
              f"loss n={n} k={k} lam={lam} eps={eps}: rel err loss {rel_loss:.3g}, grad {rel_grad:.3g}")
        # Training accuracy counts the argmax of the mixed target (utils.accuracy).
        want = target.max(dim=1)[1]
        for i in range(n):
            got = int(run(probe, "target", int(labels[i]), int(labels.roll(1, 0)[i]), lam32))
            check(got == int(want[i]), f"target class row {i} lam {lam}: ours {got}, torch {int(want[i])}")
    # A tie (lam = 0.5, two classes): torch's max gives the first, the lower class.
    for a, b in [(3, 7), (7, 3)]:
        t = 0.5 * torch.nn.functional.one_hot(torch.tensor([a]), 10).float() + \
            0.5 * torch.nn.functional.one_hot(torch.tensor([b]), 10).float()
        check(int(run(probe, "target", a, b, 0.5)) == int(t.max(dim=1)[1]), f"tie {a},{b}")
    print(f"loss + gradient vs torch CrossEntropyLoss(label_smoothing), soft targets: max rel err {worst:.3g}")


def reference_box(lam, r_x, r_y, h, w):
    """RandomCutmix's box and corrected lambda (references/classification/transforms.py)."""
    r = 0.5 * math.sqrt(1.0 - lam)
    r_w_half, r_h_half = int(r * w), int(r * h)
    x1 = int(torch.clamp(torch.tensor(r_x - r_w_half), min=0))
    y1 = int(torch.clamp(torch.tensor(r_y - r_h_half), min=0))
    x2 = int(torch.clamp(torch.tensor(r_x + r_w_half), max=w))
    y2 = int(torch.clamp(torch.tensor(r_y + r_h_half), max=h))
    return x1, y1, x2, y2, float(1.0 - (x2 - x1) * (y2 - y1) / (w * h))


def check_mixing(probe, tmp):
    gen = torch.Generator().manual_seed(7)
    boxes = 0
    for h, w in [(224, 224), (7, 5), (32, 48)]:
        for lam in [0.0, 0.013, 0.25, 0.5, 0.8, 0.999, 1.0]:
            for r_x, r_y in [(0, 0), (w - 1, h - 1), (w // 2, h // 3), (1, h - 2)]:
                want = reference_box(lam, r_x, r_y, h, w)
                got = run(probe, "box", repr(lam), r_x, r_y, h, w).split()
                got = tuple(int(v) for v in got[2:6]) + (float(got[6]),)
                check(got[:4] == want[:4] and np.float32(got[4]) == np.float32(want[4]),
                      f"cutmix box lam={lam} r=({r_x},{r_y}) {w}x{h}: ours {got}, reference {want}")
                boxes += 1
    # The mixed batch: the reference's in-place ops on a normalised batch.
    for n, c, h, w in [(4, 3, 9, 11), (1, 3, 5, 5), (6, 3, 16, 16)]:
        batch = torch.randn(n, c, h, w, generator=gen)
        path_in, path_out = os.path.join(tmp, "x.f32"), os.path.join(tmp, "y.f32")
        batch.numpy().tofile(path_in)
        for lam in [0.37, 0.9]:
            lam32 = float(np.float32(lam))
            want = batch.clone()
            rolled = want.roll(1, 0)
            rolled.mul_(1.0 - lam32)
            want.mul_(lam32).add_(rolled)
            run(probe, "mix", n, c, h, w, 0, lam32, 0, 0, 0, 0, path_in, path_out)
            got = np.fromfile(path_out, dtype=np.float32).reshape(n, c, h, w)
            diff = np.max(np.abs(got - want.numpy()))
            check(diff == 0, f"mixup {n}x{c}x{h}x{w} lam {lam}: max |diff| {diff}")
        for lam, r_x, r_y in [(0.3, w // 2, h // 2), (0.6, 0, h - 1), (0.05, w - 1, 0)]:
            x1, y1, x2, y2, _ = reference_box(lam, r_x, r_y, h, w)
            want = batch.clone()
            rolled = want.roll(1, 0)
            want[:, :, y1:y2, x1:x2] = rolled[:, :, y1:y2, x1:x2]
            run(probe, "mix", n, c, h, w, 1, 1.0, x1, y1, x2, y2, path_in, path_out)
            got = np.fromfile(path_out, dtype=np.float32).reshape(n, c, h, w)
            diff = np.max(np.abs(got - want.numpy()))
            check(diff == 0, f"cutmix {n}x{c}x{h}x{w} box ({x1},{y1})-({x2},{y2}): max |diff| {diff}")
    print(f"mixed batches vs the reference's tensor ops: exact; {boxes} CutMix boxes exact")


def reference_ra(n, world, rank, reps, seed, epoch):
    """RASampler.__iter__ (references/classification/sampler.py), shuffle=True."""
    num_samples = int(math.ceil(n * float(reps) / world))
    total = num_samples * world
    selected = int(math.floor(n // 256 * 256 / world))
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    idx = torch.randperm(n, generator=g).tolist()
    idx = [e for e in idx for _ in range(reps)]
    idx += idx[: total - len(idx)]
    return idx[rank:total:world][:selected]


def check_ra(probe):
    cases = 0
    for n, world, reps, seed, epoch in [(256, 1, 3, 0, 0), (1000, 2, 3, 0, 1), (777, 3, 3, 42, 5),
                                        (5000, 8, 2, 7, 0), (300, 4, 1, 0, 2), (1281, 5, 4, 3, 9)]:
        for rank in range(world):
            got = [int(v) for v in run(probe, "ra", n, world, rank, reps, seed, epoch).split()]
            want = reference_ra(n, world, rank, reps, seed, epoch)
            check(got == want, f"RASampler n={n} world={world} rank={rank} reps={reps} seed={seed} epoch={epoch}")
            cases += 1
    print(f"RASampler indices vs the reference on torch.randperm: {cases} rank/epoch cases identical")


def beta_cdf(x, a):
    """Regularised incomplete beta I_x(a, a) (continued fraction, Numerical Recipes' betacf)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > 0.5:
        return 1.0 - beta_cdf(1.0 - x, a)
    b = a
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * f


def check_lambdas(probe):
    count = 4000
    crit = 1.63 / math.sqrt(count)  # KS at the 1% level
    for alpha in [0.2, 1.0, 2.0]:
        lines = run(probe, "draws", alpha, 0, 1234, count, 224, 224).split("\n")
        lams = sorted(float(l.split()[1]) for l in lines if l)
        d = max(max((i + 1) / count - beta_cdf(v, alpha), beta_cdf(v, alpha) - i / count)
                for i, v in enumerate(lams))
        check(d < crit, f"lambda ~ Beta({alpha},{alpha}): KS D = {d:.4f} >= {crit:.4f}")
        print(f"lambda ~ Beta({alpha},{alpha}): KS D = {d:.4f} over {count} draws (1% critical value {crit:.4f})")
    lines = [l.split() for l in run(probe, "draws", 0.2, 1.0, 99, count, 32, 40).split("\n") if l]
    cut = sum(1 for l in lines if l[0] == "cutmix")
    check(abs(cut / count - 0.5) < 3 * 0.5 / math.sqrt(count), f"CutMix chosen {cut} of {count} times")
    for l in lines:
        if l[0] == "cutmix":
            x0, y0, x1, y1 = map(int, l[2:6])
            want = np.float32(1.0 - (x1 - x0) * (y1 - y0) / (32 * 40))
            check(np.float32(float(l[6])) == want, f"CutMix target lambda {l[6]} vs box area {want}")
    print(f"MixUp/CutMix choice: CutMix {cut} of {count}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        check_loss(args.probe, tmp)
        check_mixing(args.probe, tmp)
    check_ra(args.probe)
    check_lambdas(args.probe)
    for f in failures[:40]:
        print("FAIL:", f)
    if failures:
        print(f"{len(failures)} failures")
        return 1
    print("all equal to torch / torchvision's reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
