#!/usr/bin/python3
"""PyTorch reference run of the resnet_ddp recipe on an ImageFolder tree (used by
tools/parity/fashion_mnist_compare.sh for the Fashion-MNIST training parity).

  fashion_mnist_pytorch.py --data DIR [--ranks 2] [--epochs 5] [--batch-size 32] [--lr 3e-4]

Same recipe as `resnet_ddp --arch resnet18 --head mlp --augment flip`: torchvision
ResNet with the Linear-ReLU-Linear head, RandomHorizontalFlip -> Resize((S, S)) ->
ToTensor for training, Resize -> ToTensor for validation, Adam, cross-entropy with
label smoothing 0.1, ReduceLROnPlateau(val loss, factor 0.1, patience 5, min_lr 1e-8),
DistributedSampler(shuffle, seed) per epoch, DDP over gloo with one process per rank
(started here: Debian's torchrun fails with Python 3.11). Validation is sharded
without padding and summed over ranks. Prints one line per epoch and a JSON summary.
"""
import argparse
import json
import os
import shutil
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_reference import build_model, import_deps  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, args, port, result_path):
    torch, torchvision = import_deps("fashion_mnist_pytorch.py")
    import torch.distributed as dist
    from torchvision import transforms

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    size = (args.image_size, args.image_size)
    train_tf = [transforms.RandomHorizontalFlip()] if args.augment == "flip" else []
    train_set = torchvision.datasets.ImageFolder(
        os.path.join(args.data, "Train"), transforms.Compose(train_tf + [transforms.Resize(size), transforms.ToTensor()]))
    val_set = torchvision.datasets.ImageFolder(
        os.path.join(args.data, "Validation"), transforms.Compose([transforms.Resize(size), transforms.ToTensor()]))
    sampler = torch.utils.data.distributed.DistributedSampler(train_set, args.ranks, rank, shuffle=True, seed=args.seed)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=sampler,
                                               num_workers=args.workers)
    val_indices = list(range(rank, len(val_set), args.ranks))  # every image exactly once
    val_loader = torch.utils.data.DataLoader(torch.utils.data.Subset(val_set, val_indices),
                                             batch_size=args.batch_size, num_workers=args.workers)

    model = build_model(torch, torchvision, args.arch, "mlp", len(train_set.classes), seed=None)
    model = torch.nn.parallel.DistributedDataParallel(model)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.1, patience=5, min_lr=1e-8)

    epochs = []
    start = time.perf_counter()
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        sampler.set_epoch(epoch)
        model.train()
        stats = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
        for x, y in train_loader:
            opt.zero_grad(set_to_none=True)
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            opt.step()
            stats += torch.tensor([loss.item() * len(y), (out.argmax(1) == y).sum().item(), len(y)],
                                  dtype=torch.float64)
        train_time = time.perf_counter() - t0
        model.eval()
        val = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for x, y in val_loader:
                out = model(x)
                val += torch.tensor([loss_fn(out, y).item() * len(y), (out.argmax(1) == y).sum().item(), len(y)],
                                    dtype=torch.float64)
        dist.all_reduce(stats)
        dist.all_reduce(val)
        val_loss, val_acc = (val[0] / val[2]).item(), (val[1] / val[2]).item()
        sched.step(val_loss)
        row = {"epoch": epoch + 1, "train_loss": (stats[0] / stats[2]).item(),
               "train_acc": (stats[1] / stats[2]).item(), "val_loss": val_loss, "val_acc": val_acc,
               "epoch_seconds": time.perf_counter() - t0, "train_img_per_s": stats[2].item() / train_time}
        epochs.append(row)
        if rank == 0:
            print(f"(Epoch {epoch + 1}/{args.epochs}) train loss {row['train_loss']:.4f} acc {row['train_acc']:.4f} | "
                  f"val loss {val_loss:.4f} acc {val_acc:.4f} | {row['epoch_seconds']:.1f} s, "
                  f"{row['train_img_per_s']:.0f} img/s", flush=True)
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump({"framework": "pytorch", "version": torch.__version__, "ranks": args.ranks,
                       "threads_per_rank": args.threads, "wall_seconds": time.perf_counter() - start,
                       "best_val_acc": max(e["val_acc"] for e in epochs), "final_val_acc": epochs[-1]["val_acc"],
                       "epochs": epochs}, f)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="ImageFolder root with Train/ and Validation/")
    p.add_argument("--arch", choices=("resnet18", "resnet34", "resnet50"), default="resnet18")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank (default 0)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--augment", choices=("flip", "none"), default="flip")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the summary here too")
    args = p.parse_args()
    for split in ("Train", "Validation"):
        if not os.path.isdir(os.path.join(args.data, split)):
            p.error(f"--data '{args.data}' has no {split}/ folder")
    if min(args.ranks, args.threads, args.epochs, args.batch_size) < 1 or args.workers < 0:
        p.error("--ranks, --threads, --epochs and --batch-size must be >= 1, --workers >= 0")
    torch, _ = import_deps("fashion_mnist_pytorch.py")
    import tempfile
    result = os.path.join(tempfile.mkdtemp(prefix="rd_fmnist_pt_"), "result.json")
    torch.multiprocessing.spawn(worker, args=(args, free_port(), result), nprocs=args.ranks, join=True)
    with open(result) as f:
        summary = json.load(f)
    shutil.rmtree(os.path.dirname(result), ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "epochs"}))


if __name__ == "__main__":
    main()
