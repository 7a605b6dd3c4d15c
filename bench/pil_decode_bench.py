#!/usr/bin/python3
"""Decoding throughput of PIL (what torchvision's ImageFolder does per image:
Image.open(path).convert("RGB")) and of torchvision.io.decode_jpeg, on one thread,
best of --passes passes over every image under --data. The counterpart of
build/bench/decode_bench (docs/data.md, "Decoding throughput")."""
import argparse
import os
import sys
import time

from PIL import Image

EXT = {".jpg", ".jpeg", ".png", ".bmp", ".tga", ".gif", ".ppm", ".pgm"}


def best_of(passes, fn, files):
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        for p in files:
            fn(p)
        best = min(best, time.perf_counter() - t0)
    return len(files) / best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(args.data) for f in fs
                   if os.path.splitext(f)[1].lower() in EXT)
    if not files:
        sys.exit(f"{args.data}: no image files")

    def pil(p):
        with Image.open(p) as im:
            im.convert("RGB")

    for p in files:  # warm-up
        pil(p)
    print(f"PIL {Image.__version__} open + convert('RGB'): {best_of(args.passes, pil, files):.1f} img/s")
    try:
        import torch
        import torchvision
        from torchvision.io import decode_jpeg, read_file
        torch.set_num_threads(1)

        def tv(p):
            decode_jpeg(read_file(p))

        print(f"torchvision {torchvision.__version__} io.decode_jpeg(read_file): "
              f"{best_of(args.passes, tv, files):.1f} img/s")
    except Exception as e:  # noqa: BLE001 - optional
        print(f"torchvision.io: not measured ({e})")


if __name__ == "__main__":
    main()
