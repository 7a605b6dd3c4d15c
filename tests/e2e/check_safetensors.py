"""PyTorch's half of tests/e2e/safetensors_export.sh: what a PyTorch user does with a file
from `resnet_ddp export`, using only the `safetensors` package and torchvision.

  check_safetensors.py torchvision MODEL.safetensors CKPT.h5 PREDICT.json
      load into torchvision's model with strict=True (built by running the metadata's
      torchvision_model snippet), compare every tensor with the .h5 bit for bit, and the
      model's log-probabilities on the images of PREDICT.json with `resnet_ddp predict`'s
  check_safetensors.py same A.safetensors B.safetensors
      same names, order, dtypes and values, bit for bit
  check_safetensors.py lowp IN.safetensors OUT.safetensors F16|BF16 [--no-metadata]
      write IN's float tensors in a 16-bit dtype (as a user's save_file would)
  check_safetensors.py widened OUT.safetensors LOWP.safetensors
      OUT holds LOWP's values widened to float32 exactly
Exits non-zero with a message on any difference.
"""
import json
import sys

import torch
import torchvision
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def fail(msg):
    sys.exit(f"check_safetensors.py: FAIL: {msg}")


def tensors_in_file_order(path):
    """(name -> tensor, names in data-offset order, metadata)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    with safe_open(path, "pt") as f:
        metadata = f.metadata() or {}
    return load_file(path), names, metadata


def torchvision_model(md):
    """The model the metadata's `torchvision_model` snippet builds, run as a user would
    paste it (it must be Python that leaves the model in `model`)."""
    scope = {}
    try:
        exec(md["torchvision_model"], scope)  # noqa: S102 - our own export's metadata
    except Exception as e:  # noqa: BLE001 - any failure of the snippet is the finding
        fail(f"the torchvision_model snippet {md['torchvision_model']!r} does not run: {e!r}")
    if not isinstance(scope.get("model"), torch.nn.Module):
        fail(f"the torchvision_model snippet {md['torchvision_model']!r} leaves no model in `model`")
    return scope["model"]


def cmd_torchvision(st_path, h5_path, predict_json):
    import h5py
    import numpy
    from PIL import Image

    sd, names, md = tensors_in_file_order(st_path)
    for key in ("format", "arch", "head", "num_classes", "class_names", "image_size", "normalize_mean",
                "normalize_std", "torchvision_model"):
        if key not in md:
            fail(f"metadata lacks '{key}': {md}")
    if md["format"] != "resnet_ddp":
        fail(f"metadata format {md['format']!r}")
    model = torchvision_model(md)
    model.load_state_dict(sd, strict=True)  # raises on any missing/unexpected/mis-shaped key
    if names != list(model.state_dict()):
        fail("tensors are not in torchvision's state_dict order")
    for name, t in sd.items():
        want = torch.int64 if name.endswith("num_batches_tracked") else torch.float32
        if t.dtype != want:
            fail(f"{name}: dtype {t.dtype}, expected {want}")

    with h5py.File(h5_path, "r") as f:
        h5_names = list(f["state_dict"])
        if h5_names != names:
            fail("the .h5 and the .safetensors list different tensors")
        for name in names:
            ref = f["state_dict"][name][()]
            got = sd[name].numpy()
            if ref.shape != got.shape or not numpy.array_equal(numpy.asarray(ref, dtype=got.dtype), got):
                fail(f"{name}: differs from the .h5")
        classes_h5 = [c.decode() if isinstance(c, bytes) else c for c in f["class_names"][()]]
    classes = json.loads(md["class_names"])
    if classes != classes_h5:
        fail(f"class names {classes} != the checkpoint's {classes_h5}")

    # The preprocessing the metadata describes: Resize((S, S)), ToTensor, Normalize.
    size = int(md["image_size"])
    mean = torch.tensor(json.loads(md["normalize_mean"])).view(3, 1, 1)
    std = torch.tensor(json.loads(md["normalize_std"])).view(3, 1, 1)
    with open(predict_json) as f:
        pred = json.load(f)
    if pred["classes"] != classes:
        fail("predict's classes differ from the metadata's")
    model.eval()
    worst = 0.0
    for p in pred["predictions"]:
        img = Image.open(p["image"]).convert("RGB")
        if img.size != (size, size):
            fail(f"{p['image']}: the test expects images already at {size}x{size} (resize is not what it checks)")
        x = torch.from_numpy(numpy.asarray(img, dtype=numpy.float32) / 255.0).permute(2, 0, 1)
        x = ((x - mean) / std).unsqueeze(0)
        with torch.no_grad():
            logp = torch.log_softmax(model(x).double(), dim=1)[0]
        ours = torch.tensor([p["probabilities"][c] for c in classes], dtype=torch.float64).log()
        # log-probabilities are the logits up to a per-image constant
        worst = max(worst, (logp - ours).abs().max().item())
        if classes[int(logp.argmax())] != p["class"]:
            fail(f"{p['image']}: torchvision predicts {classes[int(logp.argmax())]}, resnet_ddp {p['class']}")
    print(f"torchvision (strict=True) vs resnet_ddp predict on {len(pred['predictions'])} images: "
          f"max |log-prob diff| = {worst:.3g}; {len(names)} tensors bit-identical to the .h5")
    if worst > 1e-4:
        fail(f"log-probabilities differ by {worst} (limit 1e-4)")


def cmd_same(a, b):
    sa, na, _ = tensors_in_file_order(a)
    sb, nb, _ = tensors_in_file_order(b)
    if na != nb:
        fail(f"{a} and {b} list different tensors or orders")
    for n in na:
        if sa[n].dtype != sb[n].dtype or sa[n].shape != sb[n].shape or not torch.equal(sa[n], sb[n]):
            fail(f"{n}: differs between {a} and {b}")
    print(f"{len(na)} tensors identical in {a} and {b}")


def cmd_lowp(src, dst, dtype, keep_metadata):
    sd, names, md = tensors_in_file_order(src)
    t = {"F16": torch.float16, "BF16": torch.bfloat16}[dtype]
    out = {n: (v if v.dtype == torch.int64 else v.to(t)) for n, v in sd.items()}
    save_file(out, dst, metadata=md if keep_metadata else None)


def cmd_widened(out_path, lowp_path):
    so, no, _ = tensors_in_file_order(out_path)
    sl, _, _ = tensors_in_file_order(lowp_path)
    if sorted(no) != sorted(sl):
        fail("different tensor names")
    for n in no:
        want = sl[n] if sl[n].dtype == torch.int64 else sl[n].float()
        if so[n].dtype != want.dtype or not torch.equal(so[n], want):
            fail(f"{n}: not the exact float32 widening of the {sl[n].dtype} value")
    print(f"{len(no)} tensors are the exact float32 widening of {lowp_path}")


def main():
    a = sys.argv[1:]
    if a[:1] == ["torchvision"] and len(a) == 4:
        cmd_torchvision(*a[1:])
    elif a[:1] == ["same"] and len(a) == 3:
        cmd_same(*a[1:])
    elif a[:1] == ["lowp"] and len(a) in (4, 5):
        cmd_lowp(a[1], a[2], a[3], "--no-metadata" not in a[4:])
    elif a[:1] == ["widened"] and len(a) == 3:
        cmd_widened(*a[1:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
