#!/usr/bin/python3
"""Regenerates the torchvision state_dict fixtures in this folder.

Run with Debian's interpreter (it has python3-torchvision): /usr/bin/python3 make_state_dict_fixtures.py
Each line is "name shape kind": shape comma-separated, kind `param` or `buffer`,
in state_dict order; num_batches_tracked is left out (the model keeps one counter).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../../tools"))
from torch_reference import ARCHS, build_model, import_deps  # noqa: E402

torch, torchvision = import_deps("make_state_dict_fixtures.py")


def write(model, filename):
    params = {name for name, _ in model.named_parameters()}
    with open(os.path.join(HERE, filename), "w") as out:
        for name, tensor in model.state_dict().items():
            if name.endswith("num_batches_tracked"):
                continue
            kind = "param" if name in params else "buffer"
            out.write(f"{name} {','.join(str(d) for d in tensor.shape)} {kind}\n")
    total = sum(p.numel() for p in model.parameters())
    print(f"{filename}: {total} parameters")


for arch in ARCHS:
    write(build_model(torch, torchvision, arch, "fc", 1000), f"{arch}_fc1000.txt")
    write(build_model(torch, torchvision, arch, "mlp", 3), f"{arch}_mlp3.txt")  # the seed recipe's head
