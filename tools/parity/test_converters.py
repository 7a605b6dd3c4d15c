#!/usr/bin/python3
"""Checks of tools/torch_to_h5.py and tools/h5_to_torch.py as users run them (ctest
`parity_converters`): an ImageNet-style .pth (1000-class fc, no num_batches_tracked)
becomes an --init file with the reference head, a DDP-saved file ('module.' prefix)
converts, the head kept/replaced/dropped is reported, h5 -> .pth loads strictly into
torchvision with identical tensors, and every bad input exits non-zero with a message
naming the file. With --resnet-ddp BIN also the trainer's path: --init from
torch_to_h5, one step, last.h5 back to torchvision. Exit 77 (ctest skip) when torch/torchvision/h5py are missing.
"""
import os
import shutil
import subprocess
import sys
import tempfile

TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TOOLS)
from torch_reference import ARCHS, import_deps  # noqa: E402
from torch_to_h5 import infer_arch  # noqa: E402

h5py, torch, torchvision = import_deps("test_converters.py", ("h5py", "torch", "torchvision"), skip=True)
FAILURES = []


def tool(name, *args):
    proc = subprocess.run([sys.executable, os.path.join(TOOLS, name), *args],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc.returncode, proc.stdout


def expect(cond, what, output=""):
    print(f"{'ok  ' if cond else 'FAIL'} {what}")
    if not cond:
        FAILURES.append(what)
        if output:
            print("     " + output.strip().replace("\n", "\n     "))


def mlp_resnet18(num_classes):
    m = torchvision.models.resnet18(weights=None)
    m.fc = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, num_classes))
    return m


def trainer_round_trip(resnet_ddp, d, init_h5):
    """The user's path through the trainer: --init from torch_to_h5, one training step,
    last.h5 -> h5_to_torch -> strict torchvision load."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

    def run(*args):
        proc = subprocess.run([resnet_ddp, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env)
        return proc.returncode, proc.stdout

    data, out_dir = os.path.join(d, "synth"), os.path.join(d, "trained")
    rc, out = run("synth", "--out", data, "--train", "16", "--val", "4", "--size", "40x40")
    expect(rc == 0, "resnet_ddp synth (3 classes)", out)
    rc, out = run("train", "--data", data, "--arch", "resnet18", "--head", "mlp", "--image-size", "32",
                  "--batch-size", "8", "--epochs", "1", "--max-steps", "1", "--init", init_h5,
                  "--output-dir", out_dir, "--threads", "1", "--workers", "1", "--augment", "none",
                  "--device", "cpu", "--progress", "none", "--resume", "none")
    expect(rc == 0, "resnet_ddp train --init <torch_to_h5 output>, 1 step", out)
    pth = os.path.join(d, "trained.pth")
    rc, out = tool("h5_to_torch.py", os.path.join(out_dir, "last.h5"), pth)
    expect(rc == 0 and "class names (label order): C0, C2, C4" in out,
           "h5_to_torch: the trainer's last.h5 -> .pth, class names printed", out)
    if rc != 0:
        return
    model = mlp_resnet18(3)
    model.load_state_dict(torch.load(pth), strict=True)
    with h5py.File(init_h5, "r") as f:
        init_conv1 = torch.from_numpy(f["state_dict"]["conv1.weight"][()])
    trained = model.state_dict()
    moved = (trained["conv1.weight"] - init_conv1).abs().max().item()
    expect(0 < moved < 1e-2 and int(trained["bn1.num_batches_tracked"]) == 1,
           f"trained weights start from the --init file (conv1 moved {moved:.1e}, 1 batch tracked)")


def main():
    torch.set_num_threads(1)
    d = tempfile.mkdtemp(prefix="rd_converters_")
    torch.manual_seed(1)
    imagenet = torchvision.models.resnet18(weights=None)
    zoo = {k: v for k, v in imagenet.state_dict().items() if not k.endswith("num_batches_tracked")}
    zoo_pth = os.path.join(d, "resnet18_zoo.pth")
    torch.save(zoo, zoo_pth)

    # ImageNet weights -> reference head for 3 classes.
    init_h5 = os.path.join(d, "init.h5")
    rc, out = tool("torch_to_h5.py", zoo_pth, init_h5, "--head", "mlp", "--num-classes", "3")
    expect(rc == 0, "torch_to_h5: zoo .pth -> mlp head", out)
    expect("loaded 100 tensors" in out and "fc.0.weight, fc.0.bias, fc.2.weight, fc.2.bias" in out
           and "dropped (head of the file): fc.weight [1000, 512], fc.bias [1000]" in out
           and "set to 0 for 20 BN layers" in out, "torch_to_h5 reports loaded / new / dropped keys", out)
    with h5py.File(init_h5, "r") as f:
        attrs = {k: (v.decode() if hasattr(v, "decode") else v) for k, v in f.attrs.items()}
        expect(attrs.get("format") == "resnet_ddp" and attrs.get("format_version") == 1
               and attrs.get("arch") == "resnet18" and attrs.get("head") == "mlp"
               and attrs.get("num_classes") == 3, f"init file root attributes ({attrs})")
        sd = f["state_dict"]
        expect(sd["conv1.weight"].dtype == "float32" and sd["conv1.weight"].shape == (64, 3, 7, 7)
               and sd["bn1.num_batches_tracked"].dtype == "int64" and sd["bn1.num_batches_tracked"].shape == ()
               and sd["fc.2.weight"].shape == (3, 512), "init file dataset types and PyTorch shapes")
        expect(list(sd)[:3] == ["conv1.weight", "bn1.weight", "bn1.bias"], "datasets in state_dict order")
        expect(all(torch.equal(torch.from_numpy(sd[k][()]), v) for k, v in zoo.items() if not k.startswith("fc.")),
               "backbone tensors copied bit-exactly")

    # h5 -> .pth loads strictly into torchvision with the same head; tensors identical.
    back_pth = os.path.join(d, "back.pth")
    rc, out = tool("h5_to_torch.py", init_h5, back_pth)
    expect(rc == 0 and "loads with strict=True" in out, "h5_to_torch: init file -> .pth", out)
    if rc == 0:
        model = mlp_resnet18(3)
        model.load_state_dict(torch.load(back_pth), strict=True)
        with h5py.File(init_h5, "r") as f:
            same = all(torch.equal(v, torch.as_tensor(f["state_dict"][k][()]))
                       for k, v in model.state_dict().items())
        expect(same, "torchvision model loaded from .pth equals the h5 tensors")

    # A DDP-saved wrapper {'state_dict': {'module.<name>': ...}} with its own fc head kept.
    ddp_pth = os.path.join(d, "ddp.pth")
    fc10 = torchvision.models.resnet18(weights=None, num_classes=10)
    torch.save({"state_dict": {"module." + k: v for k, v in fc10.state_dict().items()}}, ddp_pth)
    fc_h5 = os.path.join(d, "fc10.h5")
    rc, out = tool("torch_to_h5.py", ddp_pth, fc_h5)
    expect(rc == 0 and "resnet18, head fc, 10 classes" in out and "dropped" not in out,
           "torch_to_h5: DDP 'module.' wrapper, head kept (arch and head inferred)", out)

    # --random for every arch and head.
    for arch, head in (("resnet34", "fc"), ("resnet50", "mlp")):
        rc, out = tool("torch_to_h5.py", "--arch", arch, "--random", os.path.join(d, f"{arch}.h5"),
                       "--head", head, "--num-classes", "4")
        expect(rc == 0 and f"{arch}, head {head}, 4 classes" in out, f"torch_to_h5 --random {arch} {head}", out)

    # Bad inputs: non-zero exit and a message naming the problem.
    junk = os.path.join(d, "junk.pth")
    with open(junk, "w") as f:
        f.write("not a pickle")
    r50 = torchvision.models.resnet50(weights=None).state_dict()
    r50_pth = os.path.join(d, "r50.pth")
    torch.save(r50, r50_pth)
    partial_pth = os.path.join(d, "partial.pth")
    torch.save({k: v for k, v in zoo.items() if not k.startswith("layer4")}, partial_pth)
    bad_h5 = os.path.join(d, "bad.h5")
    with h5py.File(bad_h5, "w") as f:
        f.attrs["format"] = "something_else"
    cases = [
        (("torch_to_h5.py", os.path.join(d, "missing.pth"), init_h5), "does not exist"),
        (("torch_to_h5.py", junk, os.path.join(d, "x.h5")), "cannot read"),
        (("torch_to_h5.py", r50_pth, os.path.join(d, "x.h5"), "--arch", "resnet18"), "holds a resnet50"),
        (("torch_to_h5.py", partial_pth, os.path.join(d, "x.h5"), "--arch", "resnet18"), "missing from the file"),
        (("torch_to_h5.py", zoo_pth, os.path.join(d, "nodir", "x.h5")), "does not exist"),
        (("torch_to_h5.py", "--random", os.path.join(d, "x.h5")), "--random needs --arch"),
        (("h5_to_torch.py", os.path.join(d, "missing.h5"), back_pth), "does not exist"),
        (("h5_to_torch.py", zoo_pth, back_pth), "not an HDF5 file"),
        (("h5_to_torch.py", bad_h5, back_pth), "not a resnet_ddp checkpoint"),
    ]
    for args, message in cases:
        rc, out = tool(*args)
        expect(rc != 0 and message in out, f"{args[0]} rejects: {message}", out)

    # A whole pickled nn.Module: refused by the weights_only=True load (PyTorch >= 2.6's
    # default, passed explicitly on 1.13 too), read with --trust-pickle.
    module_pth = os.path.join(d, "module.pth")
    module_h5 = os.path.join(d, "module.h5")
    torch.save(torchvision.models.resnet18(num_classes=4), module_pth)
    rc, out = tool("torch_to_h5.py", module_pth, module_h5)
    expect(rc != 0 and "--trust-pickle" in out and not os.path.exists(module_h5),
           "torch_to_h5 rejects a pickled nn.Module without --trust-pickle", out)
    rc, out = tool("torch_to_h5.py", module_pth, module_h5, "--trust-pickle")
    expect(rc == 0 and "resnet18, head fc, 4 classes" in out, "torch_to_h5 --trust-pickle: pickled nn.Module", out)
    with h5py.File(module_h5, "r") as f:
        attrs = {k: f.attrs[k] for k in f.attrs}
    expect(all(isinstance(attrs[k], str) for k in ("format", "arch", "head", "created_by", "source")),
           "torch_to_h5's string attributes read back as str in h5py", repr(attrs))

    # Every model torch_to_h5 knows is told from its state_dict alone (resnet50,
    # wide_resnet50_2 and resnext50_32x4d share their block counts).
    for arch in ARCHS:
        got = infer_arch(getattr(torchvision.models, arch)(weights=None).state_dict())
        expect(got == arch, f"torch_to_h5 infers {arch} from its state_dict (got {got})")

    if len(sys.argv) > 2 and sys.argv[1] == "--resnet-ddp":
        trainer_round_trip(sys.argv[2], d, init_h5)

    if FAILURES:
        print(f"\n{len(FAILURES)} converter check(s) failed: {', '.join(FAILURES)}; files in {d}")
        sys.exit(1)
    shutil.rmtree(d, ignore_errors=True)  # ~150 MB of weights; kept above on failure
    print("\nall converter checks passed")


if __name__ == "__main__":
    main()
