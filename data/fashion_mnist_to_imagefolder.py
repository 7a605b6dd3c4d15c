#!/usr/bin/env python3
"""Converts Debian's dataset-fashion-mnist idx files into an ImageFolder tree.

  DIR/Train/<class>/train_<n>.png       from train-images-idx3-ubyte.gz
  DIR/Validation/<class>/test_<n>.png   from t10k-images-idx3-ubyte.gz

28x28 grayscale PNGs (the loader expands them to RGB). Standard library only.
Subset sizes are per class, taken in file order, so runs are reproducible.
"""
import argparse
import gzip
import os
import struct
import sys
import zlib

CLASSES = ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat",
           "Sandal", "Shirt", "Sneaker", "Bag", "Ankle_boot"]
DEFAULT_SRC = "/usr/share/datasets/fashion-mnist"


def read_idx(path, magic_expected):
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        sys.exit(f"fashion_mnist_to_imagefolder: {path}: {e} (install dataset-fashion-mnist)")
    magic = struct.unpack(">I", data[:4])[0]
    if magic != magic_expected:
        sys.exit(f"fashion_mnist_to_imagefolder: {path}: not an idx file (magic {magic:#x})")
    if magic == 0x803:
        n, rows, cols = struct.unpack(">III", data[4:16])
        return data[16:], n, rows, cols
    n = struct.unpack(">I", data[4:8])[0]
    return data[8:], n, 0, 0


def png_gray(width, height, pixels):
    raw = b"".join(b"\x00" + pixels[y * width:(y + 1) * width] for y in range(height))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def convert(src, out, prefix, split, per_class, classes):
    images, n, rows, cols = read_idx(os.path.join(src, f"{prefix}-images-idx3-ubyte.gz"), 0x803)
    labels, n_labels, _, _ = read_idx(os.path.join(src, f"{prefix}-labels-idx1-ubyte.gz"), 0x801)
    if n != n_labels:
        sys.exit(f"fashion_mnist_to_imagefolder: {prefix}: {n} images but {n_labels} labels")
    wanted = {CLASSES.index(c): c for c in classes}
    counts = {k: 0 for k in wanted}
    size = rows * cols
    for i in range(n):
        k = labels[i]
        if k not in wanted or (per_class and counts[k] >= per_class):
            continue
        d = os.path.join(out, split, wanted[k])
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{prefix.split('-')[0]}_{i:05d}.png"), "wb") as f:
            f.write(png_gray(cols, rows, images[i * size:(i + 1) * size]))
        counts[k] += 1
        if per_class and all(c >= per_class for c in counts.values()):
            break
    return sum(counts.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (ImageFolder root)")
    ap.add_argument("--src", default=DEFAULT_SRC, help=f"idx .gz directory (default {DEFAULT_SRC})")
    ap.add_argument("--train-per-class", type=int, default=500, help="0 = all (6000)")
    ap.add_argument("--val-per-class", type=int, default=100, help="0 = all (1000)")
    ap.add_argument("--classes", default=",".join(CLASSES),
                    help="comma-separated subset of: " + ", ".join(CLASSES))
    a = ap.parse_args()
    classes = [c for c in a.classes.split(",") if c]
    unknown = [c for c in classes if c not in CLASSES]
    if unknown or len(classes) < 2:
        ap.error(f"--classes: unknown {unknown}" if unknown else "--classes: need at least 2")
    if a.train_per_class < 0 or a.val_per_class < 0:
        ap.error("--train-per-class/--val-per-class must be >= 0")
    for split in ("Train", "Validation"):
        if os.path.exists(os.path.join(a.out, split)):
            ap.error(f"--out {a.out}: already contains {split}/")
    n_train = convert(a.src, a.out, "train", "Train", a.train_per_class, classes)
    n_val = convert(a.src, a.out, "t10k", "Validation", a.val_per_class, classes)
    print(f"fashion-mnist: wrote {n_train} train + {n_val} validation PNGs ({len(classes)} classes) to {a.out}")


if __name__ == "__main__":
    main()
