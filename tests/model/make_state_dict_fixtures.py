#!/usr/bin/python3
"""Regenerates the torchvision state_dict fixtures in this folder.

Run with Debian's interpreter (it has python3-torchvision): /usr/bin/python3 make_state_dict_fixtures.py
Each line is "name shape kind": shape comma-separated, kind `param` or `buffer`,
in state_dict order; num_batches_tracked is left out (the model keeps one counter).
"""
import os

import torch
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))


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


for arch in ("resnet18", "resnet34", "resnet50"):
    model = getattr(torchvision.models, arch)(weights=None)
    write(model, f"{arch}_fc1000.txt")
    # The seed recipe's head: Linear(C, C) -> ReLU -> Linear(C, 3).
    c = model.fc.in_features
    model.fc = torch.nn.Sequential(torch.nn.Linear(c, c), torch.nn.ReLU(), torch.nn.Linear(c, 3))
    write(model, f"{arch}_mlp3.txt")
