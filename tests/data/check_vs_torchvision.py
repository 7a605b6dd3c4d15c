#!/usr/bin/python3
"""Compares the data component's transforms and sampler with torchvision/torch.

Run by ctest (label `data`): generates test images, asks data_probe (C++) to
transform them, applies torchvision's functional ops to the same PIL images and
compares. Exits 77 (skip) when torch/torchvision are missing.
"""
import argparse
import math
import os
import sys
import tempfile

from probe_client import Probe  # tests/data/probe_client.py, next to this file

try:
    import numpy as np
    import torch
    from PIL import Image
    import torchvision.transforms.functional as F
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.autoaugment import AutoAugment, _apply_op
    from torch.utils.data.distributed import DistributedSampler
except ImportError as e:  # pragma: no cover
    print(f"skip: torch/torchvision not importable ({e}); install python3-torchvision", file=sys.stderr)
    sys.exit(77)


def make_image(w, h, seed):
    """A photo-like test image: gradients, shapes, edges and noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    for c in range(3):
        a, b, ph = rng.uniform(0.02, 0.2, 3)
        img[..., c] = 128 + 80 * np.sin(a * x + ph) * np.cos(b * y) + rng.normal(0, 12, (h, w))
    cx, cy, r = w * rng.uniform(0.3, 0.7), h * rng.uniform(0.3, 0.7), min(w, h) * 0.25
    img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0, 255, 3)
    img[: h // 5, : w // 4] = rng.uniform(0, 255, 3)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


failures = []
notes = []


def compare(name, ours_path, expected, tol, max_bad_fraction=0.0):
    ours = np.asarray(Image.open(ours_path).convert("RGB")).astype(np.int16)
    exp = np.asarray(expected).astype(np.int16)
    if ours.shape != exp.shape:
        failures.append(f"{name}: shape {ours.shape} != torchvision {exp.shape}")
        return
    diff = np.abs(ours - exp)
    bad = np.count_nonzero(diff > tol) / diff.size
    if bad > max_bad_fraction:
        failures.append(f"{name}: max |diff| {diff.max()}, {bad:.4%} of values beyond {tol}")
    notes.append(f"{name}: max |diff| {diff.max()}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    args = ap.parse_args()
    probe = Probe(args.probe, raise_errors=True)
    tmp = tempfile.mkdtemp(prefix="rd_tv_")
    images = {}
    for (w, h, seed) in [(97, 61, 1), (320, 240, 2), (244, 244, 3)]:
        path = os.path.join(tmp, f"in_{w}x{h}.png")
        im = make_image(w, h, seed)
        im.save(path)
        images[path] = im

    # Magnitude tables must equal torchvision's (float32 linspace etc.).
    aa = AutoAugment()
    for (w, h) in [(97, 61), (320, 240)]:
        space = aa._augmentation_space(10, (h, w))
        for op, (mags, _signed) in space.items():
            if mags.ndim == 0:
                continue
            for b in range(10):
                ours = float(probe.ask(f"magnitude {op} {b} {w} {h}"))
                theirs = float(mags[b].item())
                if abs(ours - theirs) > 1e-6 * max(1.0, abs(theirs)):
                    failures.append(f"magnitude {op}[{b}] at {w}x{h}: {ours} != {theirs}")

    # Every op, at several magnitudes and both signs, exact PIL semantics.
    ops = {
        "ShearX": [0.3, -0.1667, 0.0333], "ShearY": [0.3, -0.2],
        "TranslateX": [44.0, -13.0], "TranslateY": [29.0, -7.0],
        "Rotate": [30.0, -26.6667, 10.0], "Brightness": [0.9, -0.5, 0.3],
        "Color": [0.9, -0.9, 0.4], "Contrast": [0.8, -0.6], "Sharpness": [0.7, -0.9, 0.2],
        "Posterize": [4.0, 6.0, 8.0], "Solarize": [113.333336, 0.0, 255.0],
        "AutoContrast": [0.0], "Equalize": [0.0], "Invert": [0.0],
    }
    for path, im in images.items():
        for op, mags in ops.items():
            for m in mags:
                if op.startswith("Translate"):
                    m = float(int(m))
                out = os.path.join(tmp, "out.png")
                probe.ask(f"op {op} {m!r} {path} {out}")
                expected = _apply_op(im, op, m, interpolation=InterpolationMode.NEAREST, fill=None)
                compare(f"{op}({m}) {os.path.basename(path)}", out, expected, tol=0)

    # Resize((H, W)) bilinear with antialias, down and up, non-square.
    for path, im in images.items():
        for (w, h) in [(244, 244), (32, 32), (50, 130), (500, 400), (97, 244)]:
            out = os.path.join(tmp, "out.png")
            probe.ask(f"resize {w} {h} {path} {out}")
            expected = F.resize(im, [h, w], interpolation=InterpolationMode.BILINEAR)
            compare(f"Resize({h},{w}) {os.path.basename(path)}", out, expected, tol=0)

    # torch.randperm and DistributedSampler, 1..4 ranks, with and without drop_last.
    for n, seed in [(10, 0), (1322, 42), (363, 7), (5, 3)]:
        ours = [int(v) for v in probe.ask(f"randperm {n} {seed}").split()]
        g = torch.Generator()
        g.manual_seed(seed)
        if ours != torch.randperm(n, generator=g).tolist():
            failures.append(f"randperm({n}, seed {seed}) differs from torch")

    class Sized:
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

    for n in [1, 3, 10, 363]:
        for world in range(1, 5):
            for drop in (0, 1):
                if drop and n < world:
                    continue
                for shuffle in (0, 1):
                    for rank in range(world):
                        s = DistributedSampler(Sized(n), num_replicas=world, rank=rank,
                                               shuffle=bool(shuffle), seed=5, drop_last=bool(drop))
                        s.set_epoch(3)
                        theirs = list(iter(s))
                        ours = [int(v) for v in probe.ask(
                            f"sampler {n} {world} {rank} {shuffle} 5 3 {drop}").split()]
                        if ours != theirs:
                            failures.append(f"sampler n={n} world={world} rank={rank} shuffle={shuffle} "
                                            f"drop_last={drop}: {ours[:8]} != {theirs[:8]}")

    for n in notes:
        print(n)
    if failures:
        print(f"\n{len(failures)} mismatch(es) with torchvision/torch:", file=sys.stderr)
        for f in failures[:60]:
            print("  " + f, file=sys.stderr)
        return 1
    print(f"all {len(notes)} image comparisons and sampler checks match torchvision/torch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
