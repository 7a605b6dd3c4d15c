#!/usr/bin/python3
"""JPEG decoding equals PIL's: Image.open(path).convert("RGB"), as torchvision's
ImageFolder loads images (Debian python3-pil 9.4 on libjpeg62-turbo).

Run by ctest (label `data`). Generates JPEGs of many kinds in a temporary folder
(with PIL; the kinds PIL cannot write with data_probe's libjpeg encoder), decodes
each with data_probe (this project's decoder) and requires max |diff| 0 against
PIL. Also: DCT-domain downscaling against PIL's draft(), truncated and corrupted
files (both refuse, or both decode to the same pixels). Exits 77 (skip) when PIL
or numpy is missing. --keep DIR keeps the generated files there.
"""
import argparse
import io
import os
import sys
import tempfile

from probe_client import Probe  # tests/data/probe_client.py, next to this file

try:
    import numpy as np
    from PIL import Image, features
except ImportError as e:  # pragma: no cover
    print(f"skip: PIL/numpy not importable ({e}); install python3-pil python3-numpy", file=sys.stderr)
    sys.exit(77)


def photo(w, h, seed):
    """Photo-like RGB test image: gradients, noise, hard coloured edges."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    for c in range(3):
        a, b, ph = rng.uniform(0.02, 0.3, 3)
        img[..., c] = 128 + 90 * np.sin(a * x + ph) * np.cos(b * y) + rng.normal(0, 20, (h, w))
    cx, cy, r = w * rng.uniform(0.3, 0.7), h * rng.uniform(0.3, 0.7), max(1.0, min(w, h) * 0.3)
    img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0, 255, 3)
    img[: max(1, h // 4), : max(1, w // 3)] = rng.uniform(0, 255, 3)
    return np.clip(img, 0, 255).astype(np.uint8)


def read_ppm(path):
    with open(path, "rb") as f:
        data = f.read()
    parts = data.split(maxsplit=4)  # P6 W H 255 <pixels>
    w, h = int(parts[1]), int(parts[2])
    return np.frombuffer(parts[4][: w * h * 3], np.uint8).reshape(h, w, 3)


def pil_rgb(path, draft=0):
    """PIL's pixels, or the exception text when PIL refuses the file."""
    try:
        with Image.open(path) as im:
            if draft:
                im.draft("RGB", (draft, draft))
            return np.asarray(im.convert("RGB")).astype(np.int16)
    except Exception as e:  # noqa: BLE001 - any refusal counts as one
        return f"{type(e).__name__}: {e}"


def ours_rgb(probe, path, out, draft=0):
    reply = probe.ask(f"decode {path} {out} {draft}")
    if not reply.startswith("ok"):
        return reply
    return read_ppm(out).astype(np.int16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    ap.add_argument("--keep", help="write the generated JPEGs here and keep them")
    args = ap.parse_args()
    if not features.check_feature("libjpeg_turbo"):
        print("skip: this PIL is not built on libjpeg-turbo", file=sys.stderr)
        return 77
    probe = Probe(args.probe)
    tmp = args.keep or tempfile.mkdtemp(prefix="rd_jpeg_")
    os.makedirs(tmp, exist_ok=True)
    out = os.path.join(tmp, "ours.ppm")
    failures, rows = [], []

    def compare(kind, path, draft=0):
        theirs = pil_rgb(path, draft)
        ours = ours_rgb(probe, path, out, draft)
        if isinstance(theirs, str) or isinstance(ours, str):
            failures.append(f"{kind}: PIL {theirs if isinstance(theirs, str) else 'decodes'}; "
                            f"ours {ours if isinstance(ours, str) else 'decodes'}")
            return None
        if ours.shape != theirs.shape:
            failures.append(f"{kind}: shape {ours.shape} != PIL {theirs.shape}")
            return None
        d = int(np.abs(ours - theirs).max())
        if d != 0:
            failures.append(f"{kind}: max |diff| {d} in {np.count_nonzero(ours != theirs)} values")
        return d

    sizes = [(37, 23), (256, 256), (255, 129), (1, 1), (8, 8), (17, 1), (1, 33), (500, 331)]
    worst = {}

    def record(kind, w, h, d):
        if d is not None:
            worst[kind] = max(worst.get(kind, 0), d)

    # Kinds PIL writes itself: chroma subsamplings, quality, progressive, optimised,
    # grayscale and CMYK (PIL writes CMYK Adobe-inverted).
    pil_kinds = {
        "4:4:4 q95": dict(quality=95, subsampling=0),
        "4:2:2 q90": dict(quality=90, subsampling=1),
        "4:2:0 q75": dict(quality=75, subsampling=2),
        "4:2:0 q20": dict(quality=20, subsampling=2),
        "4:2:0 progressive": dict(quality=85, progressive=True),
        "4:2:0 optimised": dict(quality=85, optimize=True),
        "4:2:2 progressive+optimised": dict(quality=90, subsampling=1, progressive=True, optimize=True),
        "4:4:4 q100": dict(quality=100, subsampling=0),
    }
    for i, (w, h) in enumerate(sizes):
        rgb = photo(w, h, 10 + i)
        for kind, opts in pil_kinds.items():
            p = os.path.join(tmp, f"pil_{kind.replace(' ', '_').replace(':', '')}_{w}x{h}.jpg")
            Image.fromarray(rgb, "RGB").save(p, "JPEG", **opts)
            record(f"PIL RGB {kind}", w, h, compare(f"PIL RGB {kind} {w}x{h}", p))
        for kind, mode, opts in [("grayscale", "L", dict(quality=90)),
                                 ("grayscale progressive", "L", dict(quality=80, progressive=True)),
                                 ("CMYK", "CMYK", dict(quality=90)),
                                 ("CMYK progressive", "CMYK", dict(quality=80, progressive=True))]:
            im = Image.fromarray(rgb, "RGB").convert(mode)
            if mode == "CMYK":  # a K channel of its own, not PIL's K = 0
                c = np.asarray(im).copy()
                c[..., 3] = photo(w, h, 99 + i)[..., 0] // 2
                im = Image.fromarray(c, "CMYK")
            p = os.path.join(tmp, f"pil_{kind.replace(' ', '_')}_{w}x{h}.jpg")
            im.save(p, "JPEG", **opts)
            record(f"PIL {kind}", w, h, compare(f"PIL {kind} {w}x{h}", p))

    # Kinds PIL cannot write, from libjpeg's encoder: 4:4:0 and 4:1:1, Adobe RGB,
    # YCCK (Adobe transform 2), CMYK without an Adobe marker, arithmetic coding,
    # restart markers.
    enc_kinds = [
        ("4:4:0", "ycc", "1x2", 90, 0, 0, 0), ("4:1:1", "ycc", "4x1", 90, 0, 0, 0),
        ("4:4:0 progressive", "ycc", "1x2", 85, 1, 0, 0), ("4:1:0", "ycc", "4x2", 80, 0, 0, 0),
        ("Adobe RGB (no YCbCr)", "rgb", "1x1", 90, 0, 0, 0),
        ("YCCK (Adobe transform 2)", "ycck", "2x2", 90, 0, 0, 0),
        ("CMYK without Adobe marker", "cmyk-noadobe", "1x1", 90, 0, 0, 0),
        ("4:2:0 arithmetic", "ycc", "2x2", 85, 0, 1, 0),
        ("4:2:0 progressive arithmetic", "ycc", "2x2", 85, 1, 1, 0),
        ("4:2:0 restart markers", "ycc", "2x2", 85, 0, 0, 1),
    ]
    for i, (w, h) in enumerate(sizes):
        rgb = photo(w, h, 50 + i)
        for kind, space, samp, q, prog, arith, rst in enc_kinds:
            raw = os.path.join(tmp, "in.raw")
            if space in ("ycck", "cmyk-noadobe"):
                px = np.concatenate([rgb, photo(w, h, 77 + i)[..., :1] // 2], axis=2)
            else:
                px = rgb
            px.tofile(raw)
            p = os.path.join(tmp, f"enc_{space}_{samp}_p{prog}_a{arith}_r{rst}_{w}x{h}.jpg")
            reply = probe.ask(f"jpeg_encode {space} {samp} {q} {prog} {arith} {rst} {w} {h} {raw} {p}")
            if reply != "ok":
                failures.append(f"libjpeg {kind} {w}x{h}: encoding failed: {reply}")
                continue
            record(f"libjpeg {kind}", w, h, compare(f"libjpeg {kind} {w}x{h}", p))

    # DCT-domain downscaling (jpeg_draft) against PIL's draft("RGB", (n, n)).
    big = photo(613, 411, 5)
    for kind, opts in [("4:2:0", dict(quality=85)), ("4:4:4 progressive", dict(quality=90, subsampling=0, progressive=True))]:
        p = os.path.join(tmp, f"draft_{kind.replace(' ', '_').replace(':', '')}.jpg")
        Image.fromarray(big, "RGB").save(p, "JPEG", **opts)
        for n in (400, 200, 120, 60, 20):
            record(f"draft {kind}", 613, 411, compare(f"draft({n}) {kind} 613x411", p, n))
    gp = os.path.join(tmp, "draft_gray.jpg")
    Image.fromarray(big[..., 1], "L").save(gp, "JPEG", quality=85)
    for n in (200, 60):
        record("draft grayscale", 613, 411, compare(f"draft({n}) grayscale", gp, n))

    # Truncated and corrupted files: whatever PIL does (refuse, or decode despite a
    # libjpeg warning), we do the same, with the same pixels when both decode.
    src = os.path.join(tmp, "pil_4:2:0_q75_256x256.jpg".replace(":", ""))
    prog = os.path.join(tmp, "pil_4:2:0_progressive_256x256.jpg".replace(":", ""))
    agree = {"refused": 0, "decoded": 0}
    for base in (src, prog):
        data = open(base, "rb").read()
        variants = [data[:n] for n in (2, 20, 200, len(data) // 3, len(data) // 2, len(data) - 300,
                                       len(data) - 2, len(data) - 1)]
        rng = np.random.default_rng(3)
        for _ in range(12):
            b = bytearray(data)
            for pos in rng.integers(len(data) // 3, len(data) - 2, 3):
                b[pos] = int(rng.integers(0, 256))
            variants.append(bytes(b))
        variants.append(data[:700] + data[900:])  # a hole in the scan data
        for k, v in enumerate(variants):
            p = os.path.join(tmp, f"bad_{os.path.basename(base)}_{k}.jpg")
            open(p, "wb").write(v)
            theirs, ours = pil_rgb(p), ours_rgb(probe, p, out)
            if isinstance(theirs, str) != isinstance(ours, str):
                failures.append(f"damaged {os.path.basename(p)} ({len(v)} bytes): PIL "
                                f"{theirs if isinstance(theirs, str) else 'decodes'}; ours "
                                f"{ours if isinstance(ours, str) else 'decodes'}")
            elif isinstance(ours, str):
                agree["refused"] += 1
                if p not in ours:
                    failures.append(f"damaged {p}: error does not name the file: {ours}")
            elif ours.shape != theirs.shape or np.abs(ours - theirs).max() != 0:
                failures.append(f"damaged {os.path.basename(p)}: decodes differently from PIL")
            else:
                agree["decoded"] += 1

    # The one limit PIL lacks: a progressive file whose last scan is repeated past
    # 1000 scans (each costs a pass over the image; libjpeg only warns) is refused.
    data = open(prog, "rb").read()
    last_sos = data.rindex(b"\xff\xda")
    p = os.path.join(tmp, "many_scans.jpg")
    open(p, "wb").write(data[:-2] + data[last_sos:-2] * 1000 + b"\xff\xd9")
    reply = ours_rgb(probe, p, out)
    if not (isinstance(reply, str) and p in reply and "more than 1000 scans" in reply):
        failures.append(f"{p}: not refused for its scan count: {reply if isinstance(reply, str) else 'decoded'}")

    for kind, d in worst.items():
        rows.append(f"  {kind:40s} max |diff| {d}")
    print("JPEG decoding vs PIL " + Image.__version__ + " (libjpeg-turbo " +
          str(features.version("libjpeg_turbo")) + "), sizes " + ", ".join(f"{w}x{h}" for w, h in sizes))
    print("\n".join(rows))
    print(f"  damaged files: {agree['refused']} refused by both, {agree['decoded']} decoded identically by both")
    if failures:
        print(f"\n{len(failures)} mismatch(es) with PIL:", file=sys.stderr)
        for f in failures[:60]:
            print("  " + f, file=sys.stderr)
        return 1
    print("all JPEGs decode identically to PIL (max |diff| 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
