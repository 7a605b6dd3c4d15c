#!/usr/bin/python3
"""torchvision counterpart of loader_bench: ImageFolder + DataLoader with
AutoAugment -> Resize((S, S)) -> ToTensor, the reference recipe's train
transforms. Prints a human line and `IMG_PER_S <rate>` for loader_bench."""
import argparse
import time

import torch
from torch.utils.data import DataLoader, Subset
from torchvision import datasets, transforms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=244)
    ap.add_argument("--batch-size", type=int, default=32)
    a = ap.parse_args()
    torch.set_num_threads(1)
    tf = transforms.Compose([transforms.AutoAugment(), transforms.Resize((a.image_size, a.image_size)),
                             transforms.ToTensor()])
    ds = datasets.ImageFolder(a.data + "/Train", transform=tf)
    idx = [i % len(ds) for i in range(a.images)]
    loader = DataLoader(Subset(ds, idx), batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                        persistent_workers=False)
    it = iter(loader)
    first = next(it)  # worker start-up is not counted
    t0 = time.perf_counter()
    n = 0
    for x, _ in it:
        n += x.shape[0]
    rate = n / (time.perf_counter() - t0)
    print(f"  (torchvision {a.workers} worker(s), {n} images after the first batch of {first[0].shape[0]})")
    print(f"IMG_PER_S {rate:.3f}")


if __name__ == "__main__":
    main()
