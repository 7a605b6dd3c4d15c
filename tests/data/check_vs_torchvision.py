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
    import torchvision.transforms as T
    from torchvision.transforms.autoaugment import (AutoAugment, AutoAugmentPolicy, RandAugment,
                                                    TrivialAugmentWide, _apply_op)
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


def magnitude_of(space, op, bin_):
    mags, signed = space[op]
    return (float(mags[bin_].item()) if mags.ndim > 0 else 0.0), signed


def check_tables(probe):
    """TrivialAugmentWide's and RandAugment's 31-bin tables equal torchvision's."""
    wide = TrivialAugmentWide()._augmentation_space(31)
    for op, (mags, _signed) in wide.items():
        for b in range(31 if mags.ndim else 1):
            ours = float(probe.ask(f"wide_magnitude {op} {b} 0 0"))
            theirs = float(mags[b].item()) if mags.ndim else 0.0
            if np.float32(ours) != np.float32(theirs):
                failures.append(f"TrivialAugmentWide magnitude {op}[{b}]: {ours} != {theirs}")
    for (w, h) in [(97, 61), (224, 224), (176, 176)]:
        space = RandAugment()._augmentation_space(31, (h, w))
        for op, (mags, _signed) in space.items():
            for b in range(31 if mags.ndim else 1):
                ours = float(probe.ask(f"ra_magnitude {op} {b} {w} {h}"))
                theirs = float(mags[b].item()) if mags.ndim else 0.0
                if abs(ours - theirs) > 1e-6 * max(1.0, abs(theirs)):
                    failures.append(f"RandAugment magnitude {op}[{b}] at {w}x{h}: {ours} != {theirs}")


def expected_preset(im, fields, n, policy, ra_mag):
    """torchvision's ClassificationPresetTrain on `im` with the decisions the probe printed."""
    top, left, h, w, flip = (int(v) for v in fields[:5])
    out = F.resized_crop(im, top, left, h, w, [n, n], interpolation=InterpolationMode.BILINEAR)
    if flip:
        out = F.hflip(out)
    rest = fields[5:]
    bil = InterpolationMode.BILINEAR
    if policy == "ta_wide":
        op, b, neg = rest[0], int(rest[1]), int(rest[2])
        m, _ = magnitude_of(TrivialAugmentWide()._augmentation_space(31), op, b) if b >= 0 else (0.0, False)
        out = _apply_op(out, op, -m if neg else m, interpolation=bil, fill=None)
    elif policy == "ra":
        for k in range(2):
            op, neg = rest[3 * k], int(rest[3 * k + 2])
            space = RandAugment()._augmentation_space(31, (out.size[1], out.size[0]))
            m, _ = magnitude_of(space, op, ra_mag)
            out = _apply_op(out, op, -m if neg else m, interpolation=bil, fill=None)
    elif policy == "imagenet":
        aa = AutoAugment(AutoAugmentPolicy.IMAGENET, interpolation=bil)
        sub, probs, signs = int(rest[0]), [float(rest[1]), float(rest[2])], [int(rest[3]), int(rest[4])]
        space = aa._augmentation_space(10, (out.size[1], out.size[0]))
        for i, (op, p, mid) in enumerate(aa.policies[sub]):
            if probs[i] <= float(np.float32(p)):
                mags, signed = space[op]
                m = float(mags[mid].item()) if mid is not None else 0.0
                if signed and signs[i] == 0:
                    m = -m
                out = _apply_op(out, op, m, interpolation=bil, fill=None)
    return out


def check_presets(probe, tmp, images):
    """The reference presets' transforms (presets.py) against torchvision 0.14 on PIL."""
    check_tables(probe)
    out = os.path.join(tmp, "out.png")
    # Extra images: odd sizes, and tiny/extreme ones whose RandomResizedCrop always
    # falls back to the central crop.
    extra = {}
    for (w, h, seed) in [(33, 129, 4), (1, 50, 5), (200, 3, 6), (3, 200, 7), (5, 4, 8)]:
        path = os.path.join(tmp, f"in_{w}x{h}.png")
        extra[path] = make_image(w, h, seed) if min(w, h) > 4 else Image.fromarray(
            np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
        extra[path].save(path)
    all_images = {**images, **extra}
    bil = InterpolationMode.BILINEAR
    # Every op with bilinear sampling (the recipe's --interpolation), incl. the wide
    # magnitudes and the angles PIL's rotate turns into transposes.
    ops = {"ShearX": [0.99, -0.5], "ShearY": [0.3, -0.99], "TranslateX": [32.0, -13.0],
           "TranslateY": [29.0, -7.0], "Rotate": [30.0, -26.6667, 90.0, -90.0, 180.0, 135.0],
           "Identity": [0.0]}
    for path, im in images.items():
        for op, mags in ops.items():
            for m in mags:
                m = float(np.float32(m))  # magnitudes come from float32 tables, and our ops take floats
                probe.ask(f"op {op} {m!r} {path} {out} bilinear")
                compare(f"{op}({m}, bilinear) {os.path.basename(path)}", out,
                        _apply_op(im, op, m, interpolation=bil, fill=None), tol=0)
    for path, im in all_images.items():
        probe.ask(f"hflip {path} {out}")
        compare(f"hflip {os.path.basename(path)}", out, F.hflip(im), tol=0)
        w, h = im.size
        boxes = [[int(v) for v in probe.ask(f"rrc_boxes {w} {h} 6 11").split()]]
        boxes = [boxes[0][i:i + 4] for i in range(0, len(boxes[0]), 4)]
        if min(w, h) <= 4 or max(w, h) / min(w, h) > 10:  # always the fallback: deterministic
            g = torch.manual_seed(0)
            theirs = list(T.RandomResizedCrop.get_params(im, [0.08, 1.0], [3 / 4, 4 / 3]))
            if max(w, h) / min(w, h) > 10 and boxes[0] != theirs:
                failures.append(f"RandomResizedCrop fallback {w}x{h}: {boxes[0]} != {theirs}")
            del g
        for (top, left, bh, bw) in boxes:
            for size in (16, 176):
                probe.ask(f"resized_crop {top} {left} {bh} {bw} {size} {path} {out}")
                compare(f"resized_crop({top},{left},{bh},{bw},{size}) {os.path.basename(path)}", out,
                        F.resized_crop(im, top, left, bh, bw, [size, size], interpolation=bil), tol=0)
        for (r, c) in [(256, 224), (64, 56), (61, 61), (32, 40), (97, 60), (15, 8)]:
            probe.ask(f"eval_preset {r} {c} {path} {out}")
            compare(f"Resize({r})+CenterCrop({c}) {os.path.basename(path)}", out,
                    T.Compose([T.Resize(r, interpolation=bil), T.CenterCrop(c)])(im), tol=0)
        for c in (8, 60, 80, 100, 51):
            probe.ask(f"center_crop {c} {path} {out}")
            compare(f"CenterCrop({c}) {os.path.basename(path)}", out, F.center_crop(im, [c, c]), tol=0)
    # The whole training preset, per policy, with the decisions it took.
    for path, im in all_images.items():
        for policy in ("none", "imagenet", "ta_wide", "ra"):
            for index in range(4 if policy != "none" else 2):
                fields = probe.ask(f"train_preset 48 0.5 {policy} 9 3 {index} {path} {out}").split()
                compare(f"train preset {policy} #{index} {os.path.basename(path)}", out,
                        expected_preset(im, fields, 48, policy, 9), tol=0)


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

    check_presets(probe, tmp, images)

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
