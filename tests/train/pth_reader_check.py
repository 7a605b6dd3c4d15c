#!/usr/bin/env python3
"""resnet_ddp's .pth reader (src/io/torch_pth.cpp) against torch.load, tensor for tensor.

Usage: pth_reader_check.py PTH_DUMP   (tests/train/pth_dump.cpp, built next to the tests)

torch.saves torchvision ResNet-18 state_dicts (random init, no download) and other
state_dicts, runs pth_dump on each and requires every float tensor to equal torch's
float32 values bit for bit (float16/bfloat16 widen exactly, float64 rounds as
Tensor.float() does), counters to equal, non-contiguous views to read as their
.contiguous() values; and damaged, legacy, compressed, lying or hostile files to be
refused with a message naming the file and the problem. Exit 77 without torch.
"""
import hashlib
import io
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections import OrderedDict

try:
    import numpy as np
    import torch
    import torchvision
except ImportError as e:
    print(f"SKIP: {e} (needs Debian's python3-torch, python3-torchvision)", file=sys.stderr)
    sys.exit(77)

DUMP = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="rd_pth_")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run_dump(path):
    out = os.path.join(TMP, "dump.bin")
    r = subprocess.run([DUMP, path, out], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stderr, out


def read_dump(out):
    tensors = OrderedDict()
    with open(out, "rb") as f:
        while True:
            line = f.readline()
            if not line:
                return tensors
            parts = line.decode().split()
            if parts[0] == "counter":
                tensors[parts[1]] = int(parts[2])
                continue
            rank = int(parts[2])
            shape = [int(x) for x in parts[3:3 + rank]]
            n = int(np.prod(shape)) if shape else 1
            tensors[parts[1]] = np.frombuffer(f.read(4 * n), dtype="<f4").reshape(shape)


def expect_equal(path, sd, what):
    """pth_dump reads `path` (saved from `sd`) exactly as torch's float32 values."""
    rc, err, out = run_dump(path)
    if rc != 0:
        check(False, f"{what}: pth_dump exit {rc}: {err.strip()}")
        return
    got = read_dump(out)
    check(list(got) == list(sd), f"{what}: names in state_dict order ({len(sd)} tensors)")
    worst = 0
    counters = [(name, got.get(name), int(t)) for name, t in sd.items() if name.endswith("num_batches_tracked")]
    if counters:
        check(all(g == w for _, g, w in counters), f"{what}: {len(counters)} num_batches_tracked equal ({counters[:2]})")
    for name, t in sd.items():
        g = got.get(name)
        if name.endswith("num_batches_tracked"):
            continue
        want = t.contiguous().float().numpy()
        if g is None or g.shape != want.shape:
            check(False, f"{what}: {name} shape {None if g is None else g.shape}, torch {want.shape}")
            continue
        # Bit for bit: the same float32 words (NaN-free inputs, so view as integers).
        differ = int(np.count_nonzero(g.view(np.uint32) != want.view(np.uint32)))
        worst = max(worst, differ)
    check(worst == 0, f"{what}: every float tensor bit-identical to torch's float32 (worst: {worst} words differ)")


def expect_refused(path, *needles, what):
    rc, err, _ = run_dump(path)
    ok = rc == 2 and path in err and all(n in err for n in needles)
    check(ok, f"{what}: refused (exit {rc}) naming the file and {needles}" + ("" if ok else f"; got: {err.strip()}"))


def resnet18_state_dict(seed):
    torch.manual_seed(seed)
    model = torchvision.models.resnet18(num_classes=10)
    sd = model.state_dict()
    for name, t in sd.items():  # buffers away from their init, so a mix-up shows
        if name.endswith("running_mean"):
            t.normal_()
        elif name.endswith("running_var"):
            t.uniform_(0.5, 2.0)
        elif name.endswith("num_batches_tracked"):
            t.fill_(1234)
    return sd


def save(obj, name, **kw):
    path = os.path.join(TMP, name)
    torch.save(obj, path, **kw)
    return path


def zip_with_pickle(name, pickle_bytes, storages=(), compress=zipfile.ZIP_STORED):
    """A torch.save-shaped zip around hand-written pickle bytes."""
    path = os.path.join(TMP, name)
    with zipfile.ZipFile(path, "w", compression=compress) as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        for key, data in storages:
            z.writestr(f"archive/data/{key}", data)
        z.writestr("archive/version", "3\n")
    return path


def main():
    sd = resnet18_state_dict(0)
    zip_path = save(sd, "resnet18.pth")
    expect_equal(zip_path, sd, "resnet18 float32 (zip)")

    for dtype, tag in ((torch.float16, "float16"), (torch.bfloat16, "bfloat16"), (torch.float64, "float64")):
        low = OrderedDict((k, v.to(dtype) if v.is_floating_point() else v) for k, v in sd.items())
        expect_equal(save(low, f"resnet18_{tag}.pth"), low, f"resnet18 {tag} (widened/rounded like .float())")

    # Views: transposed, strided, with a storage offset, sharing one storage; int32 counter.
    base = torch.randn(6, 8)
    views = OrderedDict(
        [("t", base.t()), ("strided", base[:, ::3]), ("offset", base[2:, 1:5]), ("whole", base),
         ("scalar", torch.tensor(2.5)), ("empty", torch.zeros(0, 3)), ("bn.num_batches_tracked", torch.tensor(9, dtype=torch.int32))])
    expect_equal(save(views, "views.pth"), views, "non-contiguous views and offsets")

    # Wrapped and DDP-prefixed state_dicts (what tools/torch_to_h5.py accepts).
    small = OrderedDict([("conv1.weight", torch.randn(4, 3, 3, 3)), ("bn1.num_batches_tracked", torch.tensor(3))])
    expect_equal(save({"model": small, "epoch": 3, "note": [1.5, None, True]}, "wrapped.pth"), small,
                 "a checkpoint dict wrapping it under 'model'")
    ddp = OrderedDict(("module." + k, v) for k, v in small.items())
    expect_equal(save(ddp, "ddp.pth"), small, "a DDP save (every key 'module.'-prefixed)")

    # torch.hub's checksum-in-name rule: the right prefix passes, a wrong one is refused.
    digest = hashlib.sha256(open(zip_path, "rb").read()).hexdigest()
    good = os.path.join(TMP, f"resnet18-{digest[:8]}.pth")
    shutil.copy(zip_path, good)
    expect_equal(good, sd, "name-<sha256 prefix>.pth verified")
    bad_name = os.path.join(TMP, "resnet18-0123abcd.pth" if not digest.startswith("0123abcd") else "resnet18-fedcba98.pth")
    shutil.copy(zip_path, bad_name)
    expect_refused(bad_name, "SHA-256", digest, what="checksum in the name does not match")

    legacy = save(small, "legacy.pth", _use_new_zipfile_serialization=False)
    expect_refused(legacy, "legacy format", "weights_only=True", what="legacy (pre-1.6) format")

    data = open(zip_path, "rb").read()
    for n in (len(data) // 2, len(data) - 10, 100):
        cut = os.path.join(TMP, f"truncated_{n}.pth")
        open(cut, "wb").write(data[:n])
        expect_refused(cut, what=f"truncated to {n} of {len(data)} bytes")
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    open(os.path.join(TMP, "flipped.pth"), "wb").write(flipped)
    expect_refused(os.path.join(TMP, "flipped.pth"), "CRC-32", what="one flipped bit in a storage")

    deflated = os.path.join(TMP, "deflated.pth")
    with zipfile.ZipFile(zip_path) as src, zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    expect_refused(deflated, "compressed", "deflate", what="entries re-zipped with deflate")

    # Hostile pickles: a forbidden global is refused before anything is built or called.
    evil = b"\x80\x02cposix\nsystem\nq\x00X\x0b\x00\x00\x00touch pwnedq\x01\x85q\x02Rq\x03."
    expect_refused(zip_with_pickle("evil.pth", evil), "refused", "'posix.system'", what="GLOBAL posix.system")
    evil2 = b"\x80\x02cbuiltins\neval\nq\x00."
    expect_refused(zip_with_pickle("eval.pth", evil2), "'builtins.eval'", what="GLOBAL builtins.eval")
    check(not os.path.exists("pwned") and not os.path.exists(os.path.join(TMP, "pwned")), "nothing was executed")
    sparse = b"\x80\x02ctorch._utils\n_rebuild_sparse_tensor\nq\x00."
    expect_refused(zip_with_pickle("sparse.pth", sparse), "does not read", what="an allowed but unsupported global")
    expect_refused(zip_with_pickle("opcode.pth", b"\x80\x02i"), "opcode 0x69", what="an unknown opcode (INST)")
    expect_refused(zip_with_pickle("load.pth", b"\x80\x02ctorch\nload\n."), "refused: its pickle names the global 'torch.load'",
                   what="GLOBAL torch.load (a torch name, still not allowed)")
    expect_refused(zip_with_pickle("many.pth", b"\x80\x02" + b"N" * 2_100_000 + b"."), "pickled objects",
                   what="a pickle of 2.1 million objects (memory bound)")

    # A view reaching past its storage (4 floats; offset 2 + 3 elements).
    def tensor_pickle(offset, size, stride, numel=4):
        return (b"\x80\x02ccollections\nOrderedDict\n)R(X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n("
                b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpu"
                + struct.pack("<BI", ord("J"), numel) + b"tQ"
                + struct.pack("<BI", ord("J"), offset) + b"(" + struct.pack("<BI", ord("J"), size) + b"t("
                + struct.pack("<BI", ord("J"), stride) + b"t\x89ccollections\nOrderedDict\n)RtRu.")
    four = struct.pack("<4f", 1, 2, 3, 4)
    ok_path = zip_with_pickle("handmade.pth", tensor_pickle(1, 3, 1), [("0", four)])
    # The same key twice: the last value wins, as in Python's dict.
    twice = tensor_pickle(0, 2, 1)[:-2] + tensor_pickle(2, 2, 1)[
        tensor_pickle(0, 2, 1).index(b")R(") + 3:-2] + b"u."
    rc, err, out = run_dump(zip_with_pickle("twice.pth", twice, [("0", four)]))
    got = read_dump(out) if rc == 0 else {}
    check(rc == 0 and list(got) == ["w"] and list(got["w"]) == [3, 4], f"a repeated key: the last wins ({err.strip()})")
    rc, err, out = run_dump(ok_path)
    check(rc == 0 and list(read_dump(out)["w"]) == [2, 3, 4], f"a hand-written in-bounds view reads [2, 3, 4] ({err.strip()})")
    expect_refused(zip_with_pickle("past.pth", tensor_pickle(2, 3, 1), [("0", four)]), "reaches past its storage",
                   what="a view past the end of its storage")
    expect_refused(zip_with_pickle("stride.pth", tensor_pickle(0, 3, 2), [("0", four)]), "reaches past its storage",
                   what="strides past the end of its storage")
    expect_refused(zip_with_pickle("short.pth", tensor_pickle(0, 4, 1, numel=5), [("0", four)]), "truncated",
                   what="a storage larger than its zip entry")
    expect_refused(zip_with_pickle("nostorage.pth", tensor_pickle(0, 4, 1), []), "no entry data/0",
                   what="a storage with no zip entry")

    shutil.rmtree(TMP)
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
