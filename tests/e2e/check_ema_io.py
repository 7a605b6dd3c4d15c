"""The Python half of tests/e2e/ema_io.sh (Debian's python3: torch, h5py, numpy; the
safetensors files are read from their documented layout, without the safetensors package).

  check_ema_io.py exported CKPT.h5 MODEL.safetensors EMA.safetensors
      MODEL holds the checkpoint's /state_dict and EMA its /model_ema, bit for bit (the
      EMA's num_batches_tracked: the group's attribute); the two differ; metadata says which
  check_ema_io.py pth MODEL.safetensors EMA.safetensors OUTDIR
      writes OUTDIR/torchvision.pth (torchvision's train.py checkpoint: "model", "model_ema"
      as an AveragedModel's state_dict with "module." names and "n_averaged", "args" an
      argparse.Namespace), OUTDIR/timm.pth ("state_dict", "state_dict_ema", "args") and
      OUTDIR/plain.pth (no EMA)
Exits non-zero with a message on any difference.
"""
import argparse
import json
import struct
import sys
from collections import OrderedDict

import numpy


def fail(msg):
    sys.exit(f"check_ema_io.py: FAIL: {msg}")


def read_safetensors(path):
    """(name -> numpy array in file order, metadata)."""
    dtypes = {"F32": numpy.float32, "I64": numpy.int64}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    md = header.pop("__metadata__", {})
    out = OrderedDict()
    for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
        h = header[name]
        a, b = h["data_offsets"]
        out[name] = numpy.frombuffer(data[a:b], dtype=dtypes[h["dtype"]]).reshape(h["shape"])
    return out, md


def cmd_exported(h5_path, model_path, ema_path):
    import h5py

    model, model_md = read_safetensors(model_path)
    ema, ema_md = read_safetensors(ema_path)
    if model_md.get("weights") != "model" or ema_md.get("weights") != "model_ema":
        fail(f"metadata 'weights': {model_md.get('weights')!r} and {ema_md.get('weights')!r}")
    if list(model) != list(ema):
        fail("the two exports list different tensors")
    with h5py.File(h5_path, "r") as f:
        for group, tensors in (("state_dict", model), ("model_ema", ema)):
            g = f[group]
            for name, got in tensors.items():
                if name.endswith("num_batches_tracked"):
                    want = g[name][()] if name in g else g.attrs["num_batches_tracked"]
                    if int(got) != int(want):
                        fail(f"{group} {name}: {int(got)}, the checkpoint has {int(want)}")
                    continue
                want = g[name][()]
                if want.shape != got.shape or not numpy.array_equal(want, got):
                    fail(f"{name}: the export differs from the checkpoint's /{group}")
    differ = [n for n in model if not n.endswith("num_batches_tracked") and not numpy.array_equal(model[n], ema[n])]
    if not differ:
        fail("the EMA export equals the model export: the EMA was not exported")
    print(f"{len(model)} tensors each: the model's equal /state_dict, the EMA's equal /model_ema; "
          f"{len(differ)} differ between them")


def cmd_pth(model_path, ema_path, out):
    import torch

    model, _ = read_safetensors(model_path)
    ema, _ = read_safetensors(ema_path)
    as_torch = lambda d, prefix="": OrderedDict((prefix + k, torch.from_numpy(v.copy())) for k, v in d.items())
    averaged = OrderedDict([("n_averaged", torch.tensor(7))])
    averaged.update(as_torch(ema, "module."))
    # Both train.py scripts save their argparse.Namespace as "args".
    args = argparse.Namespace(model="resnet18", lr=0.5, lr_warmup_epochs=0, model_ema=True, weights=None,
                              resume="", data_path="/data", mixup_alpha=0.2, milestones=[16, 22])
    torch.save({"model": as_torch(model), "optimizer": {"state": {}, "param_groups": [{"lr": 0.5, "params": [0]}]},
                "lr_scheduler": {"last_epoch": 1}, "epoch": 1, "args": args, "model_ema": averaged},
               f"{out}/torchvision.pth")
    torch.save({"epoch": 1, "arch": "resnet18", "state_dict": as_torch(model), "optimizer": {"state": {}},
                "version": 2, "args": args, "metric": 0.5, "state_dict_ema": as_torch(ema)}, f"{out}/timm.pth")
    torch.save({"model": as_torch(model), "epoch": 1}, f"{out}/plain.pth")


def main():
    a = sys.argv[1:]
    if a[:1] == ["exported"] and len(a) == 4:
        cmd_exported(*a[1:])
    elif a[:1] == ["pth"] and len(a) == 4:
        cmd_pth(*a[1:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
