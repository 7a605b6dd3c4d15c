#!/usr/bin/python3
"""Convert a torchvision ResNet state_dict (.pth) into a resnet_ddp --init file (.h5).

  torch_to_h5.py resnet34-imagenet.pth init.h5 --head mlp --num-classes 3
  torch_to_h5.py --arch resnet18 --random init.h5            # random weights (tests)

The backbone comes from the .pth; the head is kept when it matches --head and
--num-classes, otherwise a fresh one is initialised the way the reference recipe
builds it (Linear(C, C) -> ReLU -> Linear(C, K) as `fc`, or a plain Linear(C, K)).
The tool reports which tensors were loaded, which are new and which were dropped.
The output follows docs/checkpoint_format.md (root attributes + /state_dict).

Needs Debian's python3-torch, python3-torchvision and python3-h5py; run it with
/usr/bin/python3 (the python3 first on PATH may lack them).
"""
import argparse
import os
import sys

from torch_reference import ARCHS, build_model, import_deps

HEAD_PREFIX = "fc."
FORMAT_VERSION = 1
DEPS = ("torch", "torchvision", "h5py", "numpy")


def head_of(state_dict):
    """(head kind, num_classes) of a torchvision-style state_dict, or (None, None)."""
    if "fc.weight" in state_dict:
        return "fc", int(state_dict["fc.weight"].shape[0])
    if "fc.2.weight" in state_dict and "fc.0.weight" in state_dict:
        return "mlp", int(state_dict["fc.2.weight"].shape[0])
    return None, None


def infer_arch(state_dict):
    """Which ResNet a state_dict belongs to, from its block structure."""
    def blocks(layer):
        return len({k.split(".")[1] for k in state_dict if k.startswith(f"layer{layer}.")})
    if "conv1.weight" not in state_dict or blocks(3) == 0:
        return None
    bottleneck = "layer1.0.conv3.weight" in state_dict
    counts = tuple(blocks(i) for i in (1, 2, 3, 4))
    known = {(False, (2, 2, 2, 2)): "resnet18", (False, (3, 4, 6, 3)): "resnet34",
             (True, (3, 4, 6, 3)): "resnet50", (True, (3, 4, 23, 3)): "resnet101",
             (True, (3, 8, 36, 3)): "resnet152"}
    arch = known.get((bottleneck, counts))
    if arch == "resnet50":
        # Same blocks; the first 3x3 conv's (out, in / groups) tells them apart: 64 x 64
        # (resnet50), 128 x 128 (wide_resnet50_2, twice the width), 128 x 4 (32 groups).
        shape = tuple(state_dict["layer1.0.conv2.weight"].shape[:2])
        arch = {(64, 64): "resnet50", (128, 128): "wide_resnet50_2", (128, 4): "resnext50_32x4d"}.get(shape)
    return arch


def torch_load(torch, path, trust_pickle):
    """torch.load of tensors and plain containers only, on every PyTorch this may meet.

    weights_only=True (since 1.13; the default from 2.6) refuses arbitrary pickled objects,
    which could run code. Passing it explicitly gives the same behaviour on Debian's 1.13
    and on current PyPI torch, and silences 2.4-2.5's FutureWarning. A whole pickled
    nn.Module (torch.save(model)) needs the full unpickler: only with --trust-pickle.
    """
    import inspect
    try:
        has_weights_only = "weights_only" in inspect.signature(torch.load).parameters
    except (TypeError, ValueError):
        has_weights_only = False
    if not has_weights_only:  # PyTorch before 1.13: no safe mode exists
        return torch.load(path, map_location="cpu")
    return torch.load(path, map_location="cpu", weights_only=not trust_pickle)


def load_pth(torch, path, tool, trust_pickle=False):
    """A state_dict from a .pth: a plain state_dict, a {'state_dict'|'model': ...} wrapper,
    or (with trust_pickle) a pickled nn.Module; DDP's 'module.' prefix is removed."""
    if not os.path.isfile(path):
        sys.exit(f"{tool}: input file '{path}' does not exist")
    try:
        obj = torch_load(torch, path, trust_pickle)
    except Exception as e:  # torch raises many types for a bad file
        msg = str(e)
        if not trust_pickle and ("weights only" in msg.lower() or "weights_only" in msg or "Unsupported" in msg):
            # torch's own text runs to a page; the reason and our flag are what matter.
            sys.exit(f"{tool}: cannot read '{path}' with torch.load(weights_only=True): it holds more than "
                     f"tensors (e.g. a whole pickled nn.Module). If you trust the file, rerun with "
                     f"--trust-pickle (unpickling can run code).")
        sys.exit(f"{tool}: cannot read '{path}' as a PyTorch file: {msg}")
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if isinstance(obj, dict):
        for key in ("state_dict", "model", "model_state_dict"):
            if key in obj and isinstance(obj[key], dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not all(torch.is_tensor(v) for v in obj.values()):
        sys.exit(f"{tool}: '{path}' does not hold a state_dict (a dict of tensors)")
    if obj and all(k.startswith("module.") for k in obj):
        obj = {k[len("module."):]: v for k, v in obj.items()}
    return dict(obj)


def write_string_attr(h5py, numpy, obj, name, value):
    """Variable-length UTF-8 string attribute, as resnet_ddp writes them: h5py reads it
    back as str (docs/checkpoint_format.md)."""
    obj.attrs.create(name, value, dtype=h5py.string_dtype("utf-8"))


def write_state_dict_h5(path, state_dict, arch, head, num_classes, created_by, extra_attrs=None):
    """Write an --init file: root attributes and /state_dict in state_dict order."""
    torch, _, h5py, numpy = import_deps("torch_to_h5.py", DEPS)
    tmp = f"{path}.tmp.{os.getpid()}"
    with h5py.File(tmp, "w", track_order=True) as f:
        write_string_attr(h5py, numpy, f, "format", "resnet_ddp")
        f.attrs.create("format_version", FORMAT_VERSION, dtype="int64")
        write_string_attr(h5py, numpy, f, "arch", arch)
        write_string_attr(h5py, numpy, f, "head", head)
        f.attrs.create("num_classes", num_classes, dtype="int64")
        write_string_attr(h5py, numpy, f, "created_by", created_by)
        for key, value in (extra_attrs or {}).items():
            write_string_attr(h5py, numpy, f, key, value)
        group = f.create_group("state_dict", track_order=True)
        for name, tensor in state_dict.items():
            t = tensor.detach().cpu()
            if name.endswith("num_batches_tracked"):
                group.create_dataset(name, data=numpy.int64(t.item()))
            else:
                group.create_dataset(name, data=t.to(torch.float32).contiguous().numpy())
    os.replace(tmp, path)


def convert(source, arch, head, num_classes, seed, tool="torch_to_h5.py", log=print):
    """Merge a source state_dict (or None for --random) into a fresh model of the
    requested arch/head; returns (state_dict, report lines). Exits on a bad source."""
    torch, torchvision, _, _ = import_deps(tool, DEPS)
    model = build_model(torch, torchvision, arch, head, num_classes, seed)
    target = model.state_dict()
    if source is None:
        log(f"{tool}: random {arch} weights (seed {seed}), head {head} with {num_classes} classes")
        return target, {"loaded": [], "new": list(target), "dropped": [], "zero_tracked": []}
    src_head, src_classes = head_of(source)
    keep_head = (src_head == head and src_classes == num_classes)
    loaded, new, dropped, missing, mismatched, zero_tracked = [], [], [], [], [], []
    merged = {}
    for name, fresh in target.items():
        is_head = name.startswith(HEAD_PREFIX)
        if is_head and not keep_head:
            merged[name] = fresh
            new.append(name)
        elif name in source:
            if tuple(source[name].shape) != tuple(fresh.shape):
                mismatched.append(f"{name}: file {list(source[name].shape)}, {arch} needs {list(fresh.shape)}")
                continue
            merged[name] = source[name].to(fresh.dtype)
            loaded.append(name)
        elif name.endswith("num_batches_tracked"):
            # Older torchvision checkpoints (the ImageNet zoo files) predate this buffer.
            merged[name] = torch.zeros((), dtype=torch.int64)
            zero_tracked.append(name)
        else:
            missing.append(name)
    unexpected = [k for k in source if k not in target and not k.startswith(HEAD_PREFIX)]
    dropped = [k for k in source if k.startswith(HEAD_PREFIX) and (not keep_head or k not in target)]
    if missing or mismatched or unexpected:
        problems = []
        if mismatched:
            problems.append("shape mismatch:\n  " + "\n  ".join(mismatched))
        if missing:
            problems.append(f"missing from the file ({len(missing)}): " + ", ".join(missing[:8])
                            + (" ..." if len(missing) > 8 else ""))
        if unexpected:
            problems.append(f"not part of {arch} ({len(unexpected)}): " + ", ".join(unexpected[:8])
                            + (" ..." if len(unexpected) > 8 else ""))
        sys.exit(f"{tool}: the file is not a torchvision {arch} backbone:\n" + "\n".join(problems))
    return merged, {"loaded": loaded, "new": new, "dropped": dropped, "zero_tracked": zero_tracked}


def main():
    tool = "torch_to_h5.py"
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="INPUT.pth OUTPUT.h5, or only OUTPUT.h5 with --random")
    p.add_argument("--arch", choices=ARCHS, help="model (default: inferred from the .pth)")
    p.add_argument("--random", action="store_true", help="no input file: random torchvision weights")
    p.add_argument("--head", choices=("fc", "mlp"),
                   help="head of the output (default: the file's head; mlp with --random)")
    p.add_argument("--num-classes", type=int,
                   help="classes of the output head (default: the file's; 3 with --random)")
    p.add_argument("--seed", type=int, default=0, help="seed for freshly initialised tensors (default 0)")
    p.add_argument("--quiet", action="store_true", help="print only the summary line")
    p.add_argument("--trust-pickle", action="store_true",
                   help="load with torch.load(weights_only=False): needed for a whole pickled nn.Module; "
                        "only for files you trust (unpickling can run code)")
    args = p.parse_args()
    if args.num_classes is not None and args.num_classes < 1:
        p.error("--num-classes must be >= 1")

    torch, _, _, _ = import_deps(tool, DEPS)
    if args.random:
        if len(args.paths) != 1:
            p.error("with --random give only OUTPUT.h5")
        if not args.arch:
            p.error("--random needs --arch")
        source, output = None, args.paths[0]
        arch = args.arch
        head = args.head or "mlp"
        num_classes = args.num_classes or 3
    else:
        if len(args.paths) != 2:
            p.error("expected INPUT.pth OUTPUT.h5 (or --arch X --random OUTPUT.h5)")
        source = load_pth(torch, args.paths[0], tool, args.trust_pickle)
        output = args.paths[1]
        arch = infer_arch(source)
        if args.arch and arch and args.arch != arch:
            sys.exit(f"{tool}: '{args.paths[0]}' holds a {arch}, not the requested --arch {args.arch}")
        arch = args.arch or arch
        if not arch:
            sys.exit(f"{tool}: cannot tell which ResNet '{args.paths[0]}' holds; pass --arch")
        src_head, src_classes = head_of(source)
        head = args.head or src_head or "mlp"
        num_classes = args.num_classes or (src_classes if head == src_head else None) or 3
    if not output.endswith((".h5", ".hdf5")):
        p.error(f"output '{output}' should end in .h5")
    out_dir = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(out_dir):
        sys.exit(f"{tool}: output directory '{out_dir}' does not exist")

    log = (lambda *a: None) if args.quiet else print
    state_dict, report = convert(source, arch, head, num_classes, args.seed, tool, log)
    if source is not None:
        log(f"{tool}: loaded {len(report['loaded'])} tensors from '{args.paths[0]}'")
        if report["new"]:
            log(f"  new (freshly initialised, seed {args.seed}): " + ", ".join(report["new"]))
        if report["zero_tracked"]:
            log(f"  num_batches_tracked absent from the file (older torchvision): set to 0 "
                f"for {len(report['zero_tracked'])} BN layers")
        if report["dropped"]:
            log("  dropped (head of the file): " + ", ".join(
                f"{k} {list(source[k].shape)}" for k in report["dropped"]))
    n_params = sum(v.numel() for k, v in state_dict.items()
                   if not k.endswith(("running_mean", "running_var", "num_batches_tracked")))
    write_state_dict_h5(output, state_dict, arch, head, num_classes,
                        f"torch_to_h5.py (torch {torch.__version__})",
                        {"source": os.path.abspath(args.paths[0]) if source is not None else "random"})
    print(f"{tool}: wrote '{output}': {arch}, head {head}, {num_classes} classes, "
          f"{n_params:,} parameters, {len(state_dict)} tensors")


if __name__ == "__main__":
    main()
