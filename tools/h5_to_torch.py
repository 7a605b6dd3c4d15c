#!/usr/bin/python3
"""Convert a resnet_ddp checkpoint (.h5) into a PyTorch state_dict (.pth).

  h5_to_torch.py output_model/best_model.h5 model.pth
  h5_to_torch.py --ema output_model/last.h5 model_ema.pth   # the weight EMA (--model-ema runs)

The .pth loads with strict=True into torchvision's model with the same head:

  model = torchvision.models.resnet34(num_classes=K)                        # head fc
  model.fc = nn.Sequential(nn.Linear(C, C), nn.ReLU(), nn.Linear(C, K))     # head mlp
  model.load_state_dict(torch.load("model.pth"))

The tool builds that model itself and loads the result strictly before saving, so a
file it writes is known to load. Needs Debian's python3-torch, python3-torchvision
and python3-h5py; run it with /usr/bin/python3.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import ARCHS, build_model, import_deps  # noqa: E402
from torch_to_h5 import DEPS, FORMAT_VERSION  # noqa: E402

TOOL = "h5_to_torch.py"


def attr_str(value):
    """h5py returns fixed-length strings as bytes (numpy.bytes_) and variable-length as str."""
    if hasattr(value, "decode"):
        return value.decode("utf-8")
    return str(value)


def read_checkpoint(path, tool=TOOL, group="state_dict"):
    """(attrs dict, state_dict of torch tensors in file order, class_names or None).
    group: "state_dict" (the model) or "model_ema" (the weight EMA, same names and shapes)."""
    torch, _, h5py, numpy = import_deps(tool, DEPS)
    if not os.path.isfile(path):
        sys.exit(f"{tool}: checkpoint '{path}' does not exist")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        sys.exit(f"{tool}: '{path}' is not an HDF5 file: {e}")
    with f:
        attrs = {k: f.attrs[k] for k in f.attrs}
        fmt = attr_str(attrs.get("format", b""))
        if fmt != "resnet_ddp":
            sys.exit(f"{tool}: '{path}' is not a resnet_ddp checkpoint (root attribute format="
                     f"'{fmt}', expected 'resnet_ddp'; see docs/checkpoint_format.md)")
        version = int(attrs.get("format_version", -1))
        if version < 1 or version > FORMAT_VERSION:
            sys.exit(f"{tool}: '{path}' has format_version {version}; this tool reads 1..{FORMAT_VERSION}")
        for key in ("arch", "head", "num_classes"):
            if key not in attrs:
                sys.exit(f"{tool}: '{path}' lacks the root attribute '{key}'")
        if group == "model_ema" and "model_ema" not in f:
            sys.exit(f"{tool}: '{path}' has no weight EMA (/model_ema): only a run with --model-ema writes one, "
                     f"in its last.h5 (best_model.h5 holds the model's weights only)")
        if group not in f or not isinstance(f[group], h5py.Group):
            sys.exit(f"{tool}: '{path}' has no /{group} group")
        state_dict = {}
        for name, ds in f[group].items():
            value = ds[()]
            if name.endswith("num_batches_tracked"):
                state_dict[name] = torch.tensor(int(value), dtype=torch.int64)
            else:
                state_dict[name] = torch.from_numpy(numpy.ascontiguousarray(value, dtype=numpy.float32))
        class_names = None
        if "class_names" in f:
            class_names = [attr_str(s) for s in f["class_names"][()]]
    info = {"arch": attr_str(attrs["arch"]), "head": attr_str(attrs["head"]),
            "num_classes": int(attrs["num_classes"])}
    for key in ("epoch", "global_step", "best_val_acc", "val_acc"):
        if key in attrs:
            info[key] = attrs[key].item() if hasattr(attrs[key], "item") else attrs[key]
    return info, state_dict, class_names


def to_torchvision(info, state_dict, path, tool=TOOL):
    """Load the checkpoint strictly into a torchvision model; exits naming what differs."""
    torch, torchvision, _, _ = import_deps(tool, DEPS)
    if info["arch"] not in ARCHS:
        sys.exit(f"{tool}: '{path}': arch '{info['arch']}' has no torchvision counterpart "
                 f"(expected one of {', '.join(ARCHS)})")
    if info["head"] not in ("fc", "mlp"):
        sys.exit(f"{tool}: '{path}': unknown head '{info['head']}' (expected fc or mlp)")
    model = build_model(torch, torchvision, info["arch"], info["head"], info["num_classes"])
    target = model.state_dict()
    missing = [k for k in target if k not in state_dict]
    unexpected = [k for k in state_dict if k not in target]
    mismatched = [f"{k}: file {list(state_dict[k].shape)}, torchvision {list(target[k].shape)}"
                  for k in target if k in state_dict and tuple(state_dict[k].shape) != tuple(target[k].shape)]
    if missing or unexpected or mismatched:
        msg = [f"{tool}: '{path}' does not match torchvision {info['arch']} with head "
               f"{info['head']} ({info['num_classes']} classes):"]
        if missing:
            msg.append(f"  missing ({len(missing)}): " + ", ".join(missing[:8]))
        if unexpected:
            msg.append(f"  unexpected ({len(unexpected)}): " + ", ".join(unexpected[:8]))
        msg += ["  " + m for m in mismatched[:8]]
        sys.exit("\n".join(msg))
    # Keys in torchvision's order so the .pth looks like model.state_dict().
    ordered = {k: state_dict[k] for k in target}
    model.load_state_dict(ordered, strict=True)
    return model, ordered


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="resnet_ddp checkpoint or --init file (.h5)")
    p.add_argument("output", help="PyTorch state_dict to write (.pth)")
    p.add_argument("--ema", action="store_true",
                   help="convert the checkpoint's weight EMA (/model_ema of a --model-ema run) instead of its model")
    args = p.parse_args()
    torch, _, _, _ = import_deps(TOOL, DEPS)
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        sys.exit(f"{TOOL}: output directory '{out_dir}' does not exist")

    info, state_dict, class_names = read_checkpoint(args.checkpoint,
                                                    group="model_ema" if args.ema else "state_dict")
    _, ordered = to_torchvision(info, state_dict, args.checkpoint)
    tmp = f"{args.output}.tmp.{os.getpid()}"
    torch.save(ordered, tmp)
    os.replace(tmp, args.output)
    extra = "".join(f", {k} {info[k]}" for k in ("epoch", "global_step", "val_acc") if k in info)
    what = " (the weight EMA, /model_ema)" if args.ema else ""
    print(f"{TOOL}: wrote '{args.output}'{what}: torchvision {info['arch']}, head {info['head']}, "
          f"{info['num_classes']} classes, {len(ordered)} tensors{extra}; loads with strict=True")
    if class_names:
        print(f"  class names (label order): {', '.join(class_names)}")
    if info["head"] == "mlp":
        print("  build the model with: model.fc = nn.Sequential(nn.Linear(C, C), nn.ReLU(), "
              "nn.Linear(C, num_classes)) before load_state_dict")


if __name__ == "__main__":
    main()
