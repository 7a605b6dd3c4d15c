"""The torchvision reference model and the import checks shared by the converters
(tools/), the parity tests (tools/parity/) and the PyTorch benchmarks (bench/).

Scripts outside tools/ find it from their own location, so they run from any cwd:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "<...>/tools"))
"""
import os
import subprocess
import sys

ARCHS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "wide_resnet50_2", "resnext50_32x4d")
SKIP = 77  # ctest's "skipped" exit status
DEBIAN_PACKAGE = {"torch": "python3-torch", "torchvision": "python3-torchvision",
                  "h5py": "python3-h5py", "numpy": "python3-numpy"}


def import_deps(tool, names=("torch", "torchvision"), skip=False):
    """The modules `names`, in that order, or exit with a message naming the Debian
    package to install: with status 77 (a ctest skip) when `skip`, else 1."""
    mods = []
    for name in names:
        try:
            mods.append(__import__(name))
        except ImportError as e:
            msg = (f"{tool}: {'SKIP: ' if skip else ''}cannot import {name} ({e}); install Debian's "
                   f"{DEBIAN_PACKAGE.get(name, name)} (make deps) and run this with /usr/bin/python3")
            if skip:
                print(msg)
                sys.exit(SKIP)
            sys.exit(msg)
    return mods


def build_model(torch, torchvision, arch, head, num_classes, seed=0):
    """A torchvision ResNet with random weights and the requested head: "fc"
    (torchvision's Linear(C, K)) or "mlp" (the reference recipe's Linear(C, C) -> ReLU ->
    Linear(C, K)). Seeds torch's RNG with `seed` first unless it is None."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch '{arch}' (expected one of {', '.join(ARCHS)})")
    if seed is not None:
        torch.manual_seed(seed)
    model = getattr(torchvision.models, arch)(weights=None)
    features = model.fc.in_features
    if head == "mlp":
        model.fc = torch.nn.Sequential(torch.nn.Linear(features, features), torch.nn.ReLU(),
                                       torch.nn.Linear(features, num_classes))
    elif head == "fc":
        model.fc = torch.nn.Linear(features, num_classes)
    else:
        raise ValueError(f"unknown head '{head}' (expected fc or mlp)")
    return model


def launch_local_ranks(script, ranks, port):
    """Runs `script` (this process's own argv less `--launch N`) as `ranks` local
    processes with torch.distributed's environment (torchrun without torchrun: Debian's
    fails on Python 3.11); returns their exit statuses or-ed."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(ranks))
    argv = list(sys.argv[1:])
    i = argv.index("--launch")
    del argv[i:i + 2]
    procs = [subprocess.Popen([sys.executable, os.path.abspath(script)] + argv,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(ranks)]
    rc = 0
    for p in procs:
        rc |= p.wait()
    return rc
