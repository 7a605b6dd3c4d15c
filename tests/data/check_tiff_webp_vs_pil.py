#!/usr/bin/python3
"""TIFF and WebP decoding equals PIL's Image.open(path).convert("RGB") (Debian
python3-pil 9.4 on libtiff 4.5 / libwebp 1.2), as torchvision's ImageFolder loads
the .tif/.tiff/.webp files it accepts.

Run by ctest (label `data`). Writes TIFFs (every photometric / bit depth / compression
this project decodes, strips of several rows, MinIsWhite by hand; tiled files are not
covered: PIL cannot write them) and WebPs (lossy and
lossless, with and without alpha) into a temporary folder, decodes each with data_probe
and requires max |diff| 0 against PIL. Variants this project refuses (16-bit, CMYK,
animation, ...) must be refused with "unsupported" in the message; truncated files
must be refused, never crash. Exits 77 (skip) when PIL, its WebP/libtiff support or
numpy is missing.
"""
import argparse
import os
import struct
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
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    for c in range(3):
        a, b, ph = rng.uniform(0.02, 0.3, 3)
        img[..., c] = 128 + 90 * np.sin(a * x + ph) * np.cos(b * y) + rng.normal(0, 20, (h, w))
    img[: h // 4, : w // 3] = rng.uniform(0, 255, 3)
    return np.clip(img, 0, 255).astype(np.uint8)


def alpha(w, h, seed):
    """Alpha with opaque, transparent and every level in between."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (h, w), dtype=np.uint8)
    a[: h // 3] = 255
    a[h // 3 : h // 2] = 0
    return a


def read_ppm(path):
    with open(path, "rb") as f:
        data = f.read()
    # "P6 W H 255" and one whitespace byte; the pixels may start with a whitespace value.
    parts = data.split(maxsplit=3)
    w, h = int(parts[1]), int(parts[2])
    return np.frombuffer(data[len(data) - w * h * 3 :], np.uint8).reshape(h, w, 3)


def pil_rgb(path):
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).astype(np.int16)


def raw_tiff(path, w, h, photometric, bps, spp, data, rows_per_strip=None, little=True):
    """A minimal uncompressed TIFF (what PIL cannot be asked to write: MinIsWhite,
    16-bit RGB, several strips in big-endian order)."""
    e = "<" if little else ">"
    rows_per_strip = rows_per_strip or h
    row_bytes = len(data) // h
    strips = [data[r * row_bytes : min(h, r + rows_per_strip) * row_bytes] for r in range(0, h, rows_per_strip)]
    entries = []  # (tag, type, count, value or offset payload)
    extra = b""
    header = 8
    n_tags = 9
    ifd_size = 2 + 12 * n_tags + 4
    pos = header + ifd_size

    def place(payload):
        nonlocal extra, pos
        off = pos + len(extra)
        extra += payload
        return off

    bps_value = struct.pack(e + "H" * spp, *([bps] * spp))
    bps_entry = (258, 3, spp, bps_value if spp <= 2 else struct.pack(e + "I", place(bps_value)))
    strip_offsets_payload = struct.pack(e + "I" * len(strips), *([0] * len(strips)))
    off_at = place(strip_offsets_payload) if len(strips) > 1 else None
    counts = struct.pack(e + "I" * len(strips), *[len(s) for s in strips])
    counts_at = place(counts) if len(strips) > 1 else None
    data_start = pos + len(extra)
    offsets, at = [], data_start
    for s in strips:
        offsets.append(at)
        at += len(s)
    if off_at is not None:
        start = off_at - pos
        extra = extra[:start] + struct.pack(e + "I" * len(strips), *offsets) + extra[start + 4 * len(strips) :]
    entries = [
        (256, 4, 1, struct.pack(e + "I", w)),
        (257, 4, 1, struct.pack(e + "I", h)),
        bps_entry,
        (259, 3, 1, struct.pack(e + "HH", 1, 0)),
        (262, 3, 1, struct.pack(e + "HH", photometric, 0)),
        (273, 4, len(strips), struct.pack(e + "I", offsets[0] if off_at is None else off_at)),
        (277, 3, 1, struct.pack(e + "HH", spp, 0)),
        (278, 4, 1, struct.pack(e + "I", rows_per_strip)),
        (279, 4, len(strips), struct.pack(e + "I", len(strips[0]) if counts_at is None else counts_at)),
    ]
    out = (b"II*\0" if little else b"MM\0*") + struct.pack(e + "I", 8)
    out += struct.pack(e + "H", len(entries))
    for tag, typ, count, val in entries:
        out += struct.pack(e + "HHI", tag, typ, count) + val[:4].ljust(4, b"\0")
    out += struct.pack(e + "I", 0) + extra + b"".join(strips)
    with open(path, "wb") as f:
        f.write(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    ap.add_argument("--keep", help="write the files here and keep them")
    args = ap.parse_args()
    if not features.check("webp") or not features.check("libtiff"):
        print("skip: this PIL lacks WebP or libtiff support", file=sys.stderr)
        return 77
    probe = Probe(args.probe)
    tmp = tempfile.TemporaryDirectory()
    d = args.keep or tmp.name
    os.makedirs(d, exist_ok=True)
    w, h = 37, 29
    rgb = photo(w, h, 1)
    a = alpha(w, h, 2)
    cases = {}  # name -> path that must decode exactly as PIL
    refused = {}  # name -> path that must be refused as unsupported

    base = {
        "RGB": Image.fromarray(rgb),
        "RGBA": Image.fromarray(np.dstack([rgb, a])),
        "L": Image.fromarray(rgb[..., 0]),
        "LA": Image.fromarray(np.dstack([rgb[..., 0], a]), "LA"),
        "P": Image.fromarray(rgb).convert("P", palette=Image.ADAPTIVE, colors=77),
        "1": Image.fromarray(rgb[..., 1]).convert("1"),
    }
    for mode, im in base.items():
        for comp in ["raw", "tiff_lzw", "tiff_adobe_deflate", "packbits"]:
            p = os.path.join(d, f"{mode}_{comp}.tif")
            im.save(p, compression=None if comp == "raw" else comp)
            cases[f"TIFF {mode} {comp}"] = p
    p = os.path.join(d, "RGB_predictor.tiff")
    base["RGB"].save(p, compression="tiff_lzw", tiffinfo={317: 2})
    cases["TIFF RGB lzw + horizontal predictor"] = p
    p = os.path.join(d, "multipage.tif")
    base["RGB"].save(p, save_all=True, append_images=[base["L"]])
    cases["TIFF multi-page (first page)"] = p
    for little in (True, False):
        order = "II" if little else "MM"
        p = os.path.join(d, f"minisblack_strips_{order}.tif")
        raw_tiff(p, w, h, 1, 8, 1, rgb[..., 2].tobytes(), rows_per_strip=4, little=little)
        cases[f"TIFF MinIsBlack, 4-row strips, {order}"] = p
        p = os.path.join(d, f"rgb_strips_{order}.tif")
        raw_tiff(p, w, h, 2, 8, 3, rgb.tobytes(), rows_per_strip=5, little=little)
        cases[f"TIFF RGB, 5-row strips, {order}"] = p
    p = os.path.join(d, "miniswhite8.tif")
    raw_tiff(p, w, h, 0, 8, 1, rgb[..., 0].tobytes())
    cases["TIFF MinIsWhite 8-bit"] = p
    bits = np.packbits(rgb[..., 0] > 128, axis=1)
    p = os.path.join(d, "miniswhite1.tif")
    raw_tiff(p, w, h, 0, 1, 1, bits.tobytes())
    cases["TIFF MinIsWhite 1-bit"] = p
    p = os.path.join(d, "rgb16.tif")
    raw_tiff(p, w, h, 2, 16, 3, (rgb.astype(">u2") * 257).tobytes(), little=False)
    refused["TIFF RGB 16-bit"] = p
    p = os.path.join(d, "cmyk.tif")
    Image.fromarray(rgb).convert("CMYK").save(p)
    refused["TIFF CMYK"] = p
    p = os.path.join(d, "rgb_jpeg.tif")
    base["RGB"].save(p, compression="jpeg")  # PIL writes photometric RGB, libjpeg inside libtiff
    cases["TIFF JPEG-compressed RGB"] = p

    for kind, im in [("RGB", base["RGB"]), ("RGBA", base["RGBA"])]:
        for lossless in (True, False):
            p = os.path.join(d, f"{kind}_{'lossless' if lossless else 'lossy'}.webp")
            im.save(p, lossless=lossless, quality=80, exact=True)
            cases[f"WebP {kind} {'lossless' if lossless else 'lossy q80'}"] = p
    p = os.path.join(d, "anim.webp")
    base["RGB"].save(p, save_all=True, append_images=[base["L"].convert("RGB")], duration=100)
    refused["WebP animation"] = p

    failures = 0
    for name, path in cases.items():
        out = os.path.join(d, "out.ppm")
        reply = probe.ask(f"decode {path} {out}")
        if not reply.startswith("ok"):
            print(f"FAIL {name}: ours refused: {reply}")
            failures += 1
            continue
        ours = read_ppm(out).astype(np.int16)
        theirs = pil_rgb(path)
        if ours.shape != theirs.shape:
            print(f"FAIL {name}: shape {ours.shape} vs PIL {theirs.shape}")
            failures += 1
            continue
        diff = int(np.abs(ours - theirs).max())
        print(f"{'ok  ' if diff == 0 else 'FAIL'} {name}: max |diff| {diff}")
        failures += diff != 0
    for name, path in refused.items():
        reply = probe.ask(f"decode {path} {os.path.join(d, 'out.ppm')}")
        ok = reply.startswith("error") and "unsupported" in reply
        print(f"{'ok  ' if ok else 'FAIL'} {name}: refused ({reply})")
        failures += not ok
    # Truncated and corrupted files: refused, never a crash or a hang.
    for name, path in list(cases.items())[::5]:
        with open(path, "rb") as f:
            data = f.read()
        for cut in (len(data) // 2, 40, 12):
            bad = os.path.join(d, "cut" + os.path.splitext(path)[1])
            with open(bad, "wb") as f:
                f.write(data[:cut])
            reply = probe.ask(f"decode {bad} {os.path.join(d, 'out.ppm')}")
            if not reply.startswith("error") and not reply.startswith("ok"):
                print(f"FAIL {name} cut at {cut}: {reply}")
                failures += 1
    print(f"{len(cases)} decoded, {len(refused)} refused, {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
