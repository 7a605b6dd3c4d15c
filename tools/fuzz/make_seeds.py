#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (docs/hardening.md) into OUT/<target>/.

fuzz_image: small images in every format the loader reads (PIL writes them;
  binary PNM is written by hand, 8- and 16-bit). fuzz_flags: command lines, one
  argument per NUL-separated field. fuzz_packed / fuzz_checkpoint: their inputs are
  edit scripts (tests/fuzz/h5_edit.h), so the seeds are fixed pseudo-random byte strings.
fuzz_pth: hand-written torch.save pickles and zips (and a real torch.save with torch).
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
    # A config file after a 0x01 byte, named by the argument @cfg (tests/fuzz/fuzz_flags.cpp).
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


def pth_seeds(out):
    """fuzz_pth: mode byte 1 + a data.pkl over fuzz_pth's fixed storages (data/0: 16
    float32, data/1: one int64, data/2: 8 float16), and mode byte 0 + whole torch.save
    zip files. Pickles are written opcode by opcode as torch.save does (protocol 2,
    BINPUT/BINGET memo, the state_dict's _metadata BUILD); with torch installed, a real
    torch.save of the same layout is added."""
    import struct
    import zipfile

    def text(s):
        b = s.encode()
        return b"X" + struct.pack("<I", len(b)) + b

    def integer(v):
        return b"J" + struct.pack("<i", v)

    def tup(items):
        return b"(" + b"".join(items) + b"t"

    def tensor(key, stype, numel, offset, size, stride, memo):
        pid = tup([text("storage"), b"ctorch\n" + stype + b"\n", text(key), text("cpu"), integer(numel)]) + b"Q"
        func = b"h\x01" if memo > 3 else b"ctorch._utils\n_rebuild_tensor_v2\nq\x01"  # memoized after the first
        return (func + b"(" + pid + integer(offset) + tup([integer(x) for x in size]) +
                tup([integer(x) for x in stride]) + b"\x89h\x00)Rt" + b"R" + b"q" + bytes([memo]))

    def state_dict(entries):
        body = b"".join(text(k) + t for k, t in entries)
        return (b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x02(" + body + b"u}" + text("_metadata") + b"h\x00)R" + text("") + b"}" + text("version") +
                b"K\x01sssb.")

    pickles = {
        "flat": state_dict([("conv1.weight", tensor("0", b"FloatStorage", 16, 0, [2, 2, 2, 2], [8, 4, 2, 1], 3)),
                            ("bn1.num_batches_tracked", tensor("1", b"LongStorage", 1, 0, [], [], 4)),
                            ("half", tensor("2", b"HalfStorage", 8, 0, [8], [1], 5))]),
        "views": state_dict([("t", tensor("0", b"FloatStorage", 16, 0, [4, 4], [1, 4], 3)),
                             ("strided", tensor("0", b"FloatStorage", 16, 3, [2, 3], [6, 2], 4)),
                             ("empty", tensor("2", b"HalfStorage", 8, 8, [0, 5], [5, 1], 5))]),
    }
    four = struct.pack("<16f", *[0.25 * i - 1 for i in range(16)])
    storages = {"0": four, "1": struct.pack("<q", 7), "2": struct.pack("<8H", *range(0x3C00, 0x3C08))}
    for name, pkl in pickles.items():
        write(os.path.join(out, "pickle_" + name), b"\x01" + pkl)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr("archive/data.pkl", pkl)
            for key, data in storages.items():
                z.writestr("archive/data/" + key, data)
            z.writestr("archive/version", "3\n")
        write(os.path.join(out, "zip_" + name), b"\x00" + buf.getvalue())
    try:
        import torch
    except ImportError:
        return
    from collections import OrderedDict
    sd = OrderedDict([("conv1.weight", torch.arange(16, dtype=torch.float32).reshape(2, 2, 2, 2)),
                      ("bn1.num_batches_tracked", torch.tensor(7)),
                      ("half", torch.ones(8, dtype=torch.float16))])
    buf = io.BytesIO()
    torch.save(sd, buf)
    write(os.path.join(out, "torch_save"), b"\x00" + buf.getvalue())
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        write(os.path.join(out, "torch_save_pickle"),
              b"\x01" + z.read([n for n in z.namelist() if n.endswith("/data.pkl")][0]))


def main():
    root = sys.argv[1]
    for t in ("fuzz_image", "fuzz_flags", "fuzz_packed", "fuzz_checkpoint", "fuzz_safetensors", "fuzz_pth"):
        os.makedirs(os.path.join(root, t), exist_ok=True)
    image_seeds(os.path.join(root, "fuzz_image"))
    flag_seeds(os.path.join(root, "fuzz_flags"))
    edit_seeds(os.path.join(root, "fuzz_packed"), 24)
    edit_seeds(os.path.join(root, "fuzz_checkpoint"), 24)
    safetensors_seeds(os.path.join(root, "fuzz_safetensors"))
    pth_seeds(os.path.join(root, "fuzz_pth"))


if __name__ == "__main__":
    main()
