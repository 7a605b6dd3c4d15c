#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (docs/hardening.md) into OUT/<target>/.

fuzz_image: small images in every format the loader reads (PIL writes them;
  binary PNM is written by hand, 8- and 16-bit). fuzz_flags: command lines, one
  argument per NUL-separated field. fuzz_packed / fuzz_checkpoint: their inputs are
  edit scripts (fuzz/h5_edit.h), so the seeds are fixed pseudo-random byte strings.
"""
import io
import os
import random
import sys


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def image_seeds(out):
    def pnm(magic, w, h, maxval, samples):
        head = b"%s\n%d %d\n%d\n" % (magic, w, h, maxval)
        if maxval > 255:
            return head + b"".join(s.to_bytes(2, "big") for s in samples)
        return head + bytes(samples)

    write(os.path.join(out, "p6_8bit.ppm"), pnm(b"P6", 3, 2, 255, range(18)))
    write(os.path.join(out, "p5_8bit.pgm"), pnm(b"P5", 2, 2, 255, [0, 85, 170, 255]))
    write(os.path.join(out, "p5_16bit.pgm"), pnm(b"P5", 1, 1, 65535, [0x1234]))
    write(os.path.join(out, "p6_16bit.ppm"), pnm(b"P6", 2, 1, 1000, [1, 2, 3, 400, 500, 600]))
    write(os.path.join(out, "p6_comment.ppm"), b"P6\n# comment\n1 1\n255\n\x01\x02\x03")
    try:
        from PIL import Image
    except ImportError:
        print("make_seeds: PIL missing (python3-pil): only PNM image seeds", file=sys.stderr)
        return
    rgb = Image.new("RGB", (7, 5))
    rgb.putdata([(x * 30 % 256, y * 50 % 256, (x * y * 9) % 256) for y in range(5) for x in range(7)])

    def save(name, img, fmt, **kw):
        buf = io.BytesIO()
        img.save(buf, fmt, **kw)
        write(os.path.join(out, name), buf.getvalue())

    save("rgb.jpg", rgb, "JPEG", quality=90)
    save("progressive.jpg", rgb, "JPEG", progressive=True)
    save("gray.jpg", rgb.convert("L"), "JPEG")
    save("subsampled.jpg", rgb.resize((17, 9)), "JPEG", subsampling=2)
    save("422_optimised.jpg", rgb, "JPEG", subsampling=1, optimize=True)
    save("cmyk.jpg", rgb.convert("CMYK"), "JPEG")
    save("cmyk_progressive.jpg", rgb.convert("CMYK"), "JPEG", progressive=True)
    save("rgb.png", rgb, "PNG")
    save("gray.png", rgb.convert("L"), "PNG")
    save("rgba.png", rgb.convert("RGBA"), "PNG")
    save("palette.png", rgb.convert("P"), "PNG")
    save("gray16.png", rgb.convert("I").point(lambda v: v * 200).convert("I;16"), "PNG")
    save("interlaced.png", rgb, "PNG", interlace=1)
    save("rgb.bmp", rgb, "BMP")
    save("palette.bmp", rgb.convert("P"), "BMP")
    save("still.gif", rgb.convert("P"), "GIF")
    frames = [rgb.convert("P"), rgb.transpose(Image.FLIP_LEFT_RIGHT).convert("P")]
    save("animated.gif", frames[0], "GIF", save_all=True, append_images=frames[1:], duration=10)
    save("rgb.tga", rgb, "TGA")
    save("rle.tga", rgb, "TGA", compression="tga_rle")


def flag_seeds(out):
    lines = [
        ["--data", "d", "--arch", "resnet18", "--epochs", "2", "--batch-size", "8", "--lr", "1e-3"],
        ["train", "--data", "x.h5", "--optimizer", "sgd", "--momentum", "0.9", "--nesterov",
         "--scheduler", "cosine", "--resume", "none", "--init", "w.h5", "--max-steps", "3"],
        ["--data=d", "--layout", "nhwc", "--conv-algo", "direct", "--precision", "bf16", "--device", "cpu",
         "--workers", "0", "--threads", "2", "--seed", "7", "--accum-steps", "2", "--progress", "lines"],
        ["predict", "--checkpoint", "c.h5", "--json", "a.png", "b.jpg"],
        ["predict", "--checkpoint", "c.h5", "--split", "Test", "data"],
        ["info", "c.h5", "--tensors", "--json"],
        ["pack", "--image-size", "64", "in", "out.h5"],
        ["synth", "--classes", "3", "out"],
        ["--help"], ["train", "--help"], ["--version"],
        ["--data", "d", "--eval-only", "--resume", "auto", "--bucket-mb", "0.5", "--label-smoothing", "0"],
        ["--data", "d", "-b", "8", "-j", "2", "--model", "resnet50", "--opt", "sgd", "--sched", "cosine",
         "--output", "o", "--amp", "--precision", "fp32", "--train-split", "train", "--val-split", "val"],
        ["predict", "--checkpoint", "c.h5", "-b", "4", "--val-split", "val", "data"],
    ]
    for i, args in enumerate(lines):
        write(os.path.join(out, "args%02d" % i), b"\0".join(a.encode() for a in args))
    # A config file after a 0x01 byte, named by the argument @cfg (fuzz/fuzz_flags.cpp).
    configs = [
        b"# recipe\n--arch resnet18\nlr = 0.01\nbatch_size = 32  # per rank\nnesterov\n"
        b"output-dir = 'a #b'\n-j 3\r\n--seed = 5\nb = 4\namp = true\n",
        b"bacth = 3\n",
        b"config = x\n",
    ]
    for i, text in enumerate(configs):
        write(os.path.join(out, "config%02d" % i), b"--data\0d\0--config\0@cfg\x01" + text)


def edit_seeds(out, n):
    rng = random.Random(20)
    for i in range(n):
        write(os.path.join(out, "edits%02d" % i), bytes(rng.randrange(256) for _ in range(rng.randrange(16, 512))))


def safetensors_seeds(out):
    """Small valid safetensors files: every dtype the reader knows, metadata with escapes,
    a zero-size tensor, and names of resnet_tiny's so the model path is reached."""
    import json
    import struct

    def st(name, tensors, metadata=None, pad=True):
        header, data = {}, b""
        if metadata is not None:
            header["__metadata__"] = metadata
        for tname, dtype, shape, blob in tensors:
            header[tname] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
            data += blob
        text = json.dumps(header).encode()
        if pad:
            text += b" " * (-(8 + len(text)) % 8)
        write(os.path.join(out, name), struct.pack("<Q", len(text)) + text + data)

    f32 = lambda *v: struct.pack("<%df" % len(v), *v)
    st("f32.safetensors", [("conv1.weight", "F32", [2, 2], f32(1, -2, 0.5, 3)), ("bn1.weight", "F32", [2], f32(1, 1))],
       {"format": "resnet_ddp", "arch": "resnet_tiny", "head": "mlp", "num_classes": "3",
        "class_names": json.dumps(["a", "b\u00e9", "c\n\"q\""]), "image_size": "32"})
    st("f16_bf16.safetensors", [("a", "F16", [3], struct.pack("<3H", 0x3C00, 0x0001, 0xFC00)),
                                ("b", "BF16", [2], struct.pack("<2H", 0x3F80, 0x7FC0)),
                                ("empty", "F32", [0, 4], b"")])
    st("ints.safetensors", [("bn1.num_batches_tracked", "I64", [], struct.pack("<q", 7)),
                            ("x.num_batches_tracked", "I32", [1], struct.pack("<i", 3))], {}, pad=False)


def main():
    root = sys.argv[1]
    for t in ("fuzz_image", "fuzz_flags", "fuzz_packed", "fuzz_checkpoint", "fuzz_safetensors"):
        os.makedirs(os.path.join(root, t), exist_ok=True)
    image_seeds(os.path.join(root, "fuzz_image"))
    flag_seeds(os.path.join(root, "fuzz_flags"))
    edit_seeds(os.path.join(root, "fuzz_packed"), 24)
    edit_seeds(os.path.join(root, "fuzz_checkpoint"), 24)
    safetensors_seeds(os.path.join(root, "fuzz_safetensors"))


if __name__ == "__main__":
    main()
