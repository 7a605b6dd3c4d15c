#!/usr/bin/python3
"""The reference presets' random decisions against torchvision 0.14's sampling.

Our decisions come from SampleRng (one stream per sample), torchvision's from torch's
global generator, so they are compared as distributions: chi-square, two-sample where
torchvision's law has no closed form (RandomResizedCrop, RandomErasing: both sampled
here with torchvision's own get_params), goodness of fit where torchvision's code
fixes it (TrivialAugmentWide / RandAugment: ops, bins and signs uniform). Seeds are
fixed, so the test is deterministic; the bound (df + 6 sqrt(2 df), about 5.5 sigma)
is generous. Exits 77 (skip) without torch/torchvision.
"""
import argparse
import math
import sys

from probe_client import Probe

try:
    import numpy as np
    import torch
    import torchvision.transforms as T
except ImportError as e:  # pragma: no cover
    print(f"skip: torch/torchvision not importable ({e})", file=sys.stderr)
    sys.exit(77)

failures = []
notes = []
N = 20000


def chi2_bound(df):
    return df + 6.0 * math.sqrt(2.0 * df)


def two_sample(name, ours, theirs, edges):
    """Two-sample chi-square on histograms of equal-size samples."""
    a, _ = np.histogram(ours, bins=edges)
    b, _ = np.histogram(theirs, bins=edges)
    keep = (a + b) > 0
    stat = float(np.sum((a[keep] - b[keep]) ** 2 / (a[keep] + b[keep])))
    df = int(keep.sum()) - 1
    notes.append(f"{name}: chi2 {stat:.1f} (df {df}, bound {chi2_bound(df):.1f})")
    if stat > chi2_bound(df):
        failures.append(notes[-1])


def goodness(name, counts, probs):
    counts = np.asarray(counts, dtype=np.float64)
    exp = counts.sum() * np.asarray(probs)
    stat = float(np.sum((counts - exp) ** 2 / exp))
    df = len(counts) - 1
    notes.append(f"{name}: chi2 {stat:.1f} (df {df}, bound {chi2_bound(df):.1f})")
    if stat > chi2_bound(df):
        failures.append(notes[-1])


def boxes(reply):
    v = np.array([int(x) for x in reply.split()]).reshape(-1, 4)
    return v[:, 0], v[:, 1], v[:, 2], v[:, 3]  # top, left, h, w


def check_rrc(probe):
    torch.manual_seed(1)
    # (96, 20): elongated, so some attempts fail and some samples take the fallback.
    for (w, h) in [(320, 240), (61, 97), (96, 20)]:
        t, l, bh, bw = boxes(probe.ask(f"rrc_boxes {w} {h} {N} 5"))
        img = torch.zeros(3, h, w)
        theirs = np.array([T.RandomResizedCrop.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(N)])
        tt, tl, th, tw = theirs.T
        area_edges = np.linspace(0, 1.0001, 21)
        two_sample(f"RRC {w}x{h} area", bh * bw / (w * h), th * tw / (w * h), area_edges)
        two_sample(f"RRC {w}x{h} log ratio", np.log(bw / bh), np.log(tw / th), np.linspace(-0.4, 0.4, 17))
        # Centre of the box, relative: the uniform top/left draws.
        two_sample(f"RRC {w}x{h} centre x", (l + bw / 2) / w, (tl + tw / 2) / w, np.linspace(0, 1, 11))
        two_sample(f"RRC {w}x{h} centre y", (t + bh / 2) / h, (tt + th / 2) / h, np.linspace(0, 1, 11))


def check_erasing(probe):
    torch.manual_seed(2)
    # (10, 8): small enough that all 10 attempts often fail (then nothing is erased).
    for (w, h, p) in [(224, 224, 0.5), (48, 32, 1.0), (10, 8, 1.0)]:
        t, l, bh, bw = boxes(probe.ask(f"erase_boxes {w} {h} {p} {N} 6"))
        er = T.RandomErasing(p=p)
        img = torch.zeros(3, h, w)
        theirs = []
        for _ in range(N):
            if torch.rand(1) < p:  # forward's coin, then get_params as forward calls it
                i, j, eh, ew, _v = er.get_params(img, scale=er.scale, ratio=er.ratio, value=[0.0])
                theirs.append((i, j, eh, ew) if eh < h else (0, 0, 0, 0))  # no erasing: whole image back
            else:
                theirs.append((0, 0, 0, 0))
        tt, tl, th, tw = np.array(theirs).T
        two_sample(f"RandomErasing {w}x{h} p={p} erased or not", (bh * bw > 0).astype(float),
                   (th * tw > 0).astype(float), [-0.5, 0.5, 1.5])
        mine, yours = bh * bw > 0, th * tw > 0
        two_sample(f"RandomErasing {w}x{h} area", (bh * bw)[mine] / (w * h), (th * tw)[yours] / (w * h),
                   np.linspace(0, 0.4, 21))
        two_sample(f"RandomErasing {w}x{h} log h/w", np.log(bh[mine] / bw[mine]), np.log(th[yours] / tw[yours]),
                   np.linspace(-1.5, 1.5, 16))
        two_sample(f"RandomErasing {w}x{h} top", t[mine] / h, tt[yours] / h, np.linspace(0, 1, 11))


OPS = ["Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
       "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize"]
UNSIGNED = {"Identity", "Posterize", "Solarize", "AutoContrast", "Equalize"}
NO_BINS = {"Identity", "AutoContrast", "Equalize"}


def triples(reply):
    v = reply.split()
    return [(v[i], int(v[i + 1]), int(v[i + 2])) for i in range(0, len(v), 3)]


def check_policies(probe):
    # The op lists must be torchvision's, in its order.
    for cls in (T.TrivialAugmentWide, T.RandAugment):
        space = cls()._augmentation_space(31) if cls is T.TrivialAugmentWide else cls()._augmentation_space(31, (8, 8))
        if list(space.keys()) != OPS:
            failures.append(f"{cls.__name__} op list {list(space.keys())} != {OPS}")
        for op, (_m, signed) in space.items():
            if signed != (op not in UNSIGNED):
                failures.append(f"{cls.__name__} {op}: signed {signed}")
    ta = triples(probe.ask(f"ta_draws {N} 7"))
    goodness("TrivialAugmentWide op", [sum(op == o for op, _, _ in ta) for o in OPS], [1 / 14] * 14)
    binned = [b for op, b, _ in ta if op not in NO_BINS]
    goodness("TrivialAugmentWide bin", np.bincount(binned, minlength=31), [1 / 31] * 31)
    signs = [n for op, _, n in ta if op not in UNSIGNED]
    goodness("TrivialAugmentWide sign", np.bincount(signs, minlength=2), [0.5, 0.5])
    if any((b >= 0) != (op not in NO_BINS) or (n and op in UNSIGNED) for op, b, n in ta):
        failures.append("TrivialAugmentWide: a bin or sign drawn for an op without one")
    ra = triples(probe.ask(f"ra_draws 9 {N} 8"))
    goodness("RandAugment op", [sum(op == o for op, _, _ in ra) for o in OPS], [1 / 14] * 14)
    goodness("RandAugment sign", np.bincount([n for op, _, n in ra if op not in UNSIGNED], minlength=2), [0.5, 0.5])
    if any(b != (-1 if op in NO_BINS else 9) for op, b, _ in ra):
        failures.append("RandAugment: magnitude bin other than --ra-magnitude")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    args = ap.parse_args()
    probe = Probe(args.probe, raise_errors=True)
    check_rrc(probe)
    check_erasing(probe)
    check_policies(probe)
    for n in notes:
        print(n)
    if failures:
        print(f"\n{len(failures)} distribution(s) differ from torchvision's:", file=sys.stderr)
        for f in failures:
            print("  " + f, file=sys.stderr)
        return 1
    print("all random decisions follow torchvision's distributions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
