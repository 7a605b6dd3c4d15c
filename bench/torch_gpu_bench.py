#!/usr/bin/env python3
"""PyTorch GPU reference for bench/gpu_train_bench: the same training step
(uint8 batch -> normalized float on the GPU, torchvision ResNet with the
Linear-ReLU-Linear head, label-smoothed 0.1 cross-entropy, Adam lr 1e-4) in
fp32 / tf32 / fp16 (autocast + GradScaler) / bf16 (autocast), optionally
channels-last, cudnn.benchmark on. Prints one JSON object per line.

  torch_gpu_bench.py [--arch resnet34] [--size 244] [--batch 16]
                     [--precision fp32 tf32 fp16 bf16] [--channels-last] [--steps 20] [--warmup 5]
"""
import argparse
import json
import os
import sys
import time

# tools/ of the source tree; the GPU bundle ships torch_reference.py next to this script.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from torch_reference import ARCHS, build_model  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="resnet34", choices=ARCHS)
    p.add_argument("--size", type=int, default=244)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--classes", type=int, default=3)
    p.add_argument("--precision", nargs="+", default=["fp32", "tf32", "fp16", "bf16"],
                   choices=("fp32", "tf32", "fp16", "bf16"))
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    if a.size < 32 or a.batch < 1 or a.steps < 1 or a.warmup < 0:
        p.error("--size >= 32, --batch >= 1, --steps >= 1, --warmup >= 0")
    try:
        import torch
        import torchvision
    except ImportError as e:
        sys.exit(f"torch_gpu_bench.py: cannot import {e.name}: run with a Python that has torch + torchvision")
    if not torch.cuda.is_available():
        sys.exit("torch_gpu_bench.py: torch sees no CUDA device")
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    for prec in a.precision:
        torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
        torch.backends.cudnn.allow_tf32 = prec == "tf32"
        model = build_model(torch, torchvision, a.arch, "mlp", a.classes, seed=0).to(dev).train()
        fmt = torch.channels_last if a.channels_last else torch.contiguous_format
        model = model.to(memory_format=fmt)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
        scaler = torch.cuda.amp.GradScaler(enabled=prec == "fp16")
        amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(prec)
        images = torch.randint(0, 256, (a.batch, a.size, a.size, 3), dtype=torch.uint8).pin_memory()
        labels = (torch.arange(a.batch) % a.classes).to(dev)
        mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1)
        std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1)

        def step():
            x = images.to(dev, non_blocking=True).permute(0, 3, 1, 2).float().div(255)
            x = ((x - mean) / std).contiguous(memory_format=fmt)
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                loss = loss_fn(model(x), labels)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            return loss.item()

        torch.cuda.reset_peak_memory_stats()
        for _ in range(a.warmup):
            step()
        torch.cuda.synchronize()
        times = []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        times.sort()
        med = times[len(times) // 2]
        print(json.dumps({"framework": "pytorch", "version": torch.__version__,
                          "device": torch.cuda.get_device_name(), "arch": a.arch, "image_size": a.size,
                          "batch": a.batch, "precision": prec, "channels_last": a.channels_last,
                          "steps": a.steps, "step_ms_median": round(med * 1e3, 3),
                          "step_ms_min": round(times[0] * 1e3, 3), "img_per_s": round(a.batch / med, 1),
                          "peak_memory_mib": round(torch.cuda.max_memory_allocated() / 2**20)}), flush=True)
        del model, opt


if __name__ == "__main__":
    main()
