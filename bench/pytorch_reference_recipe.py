#!/usr/bin/python3
"""The tutorial's PyTorch DDP recipe, on CPUs (gloo), for side-by-side timing.

ImageFolder + AutoAugment + Resize((S, S)) + ToTensor, torchvision ResNet (random init:
no network here), fc -> Linear-ReLU-Linear, DDP, Adam 1e-4, CrossEntropy(label_smoothing
0.1), ReduceLROnPlateau, DistributedSampler; prints the tutorial's per-epoch lines plus a
JSON summary line. SyncBatchNorm is left out: PyTorch refuses it on CPU modules. With
--output-dir, rank 0 saves the best model (val accuracy) as the tutorial does, and at the
end every rank loads it and evaluates it ("Best model (...) has been saved to ..."), so a
whole-process time covers the same work as resnet_ddp's.

Launch N ranks yourself (Debian's torchrun fails on Python 3.11):
  bench/pytorch_reference_recipe.py --launch 2 --data DIR [--epochs 1 --arch resnet34]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../tools"))
from torch_reference import ARCHS, build_model, import_deps, launch_local_ranks  # noqa: E402


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="ImageFolder root with Train/ and Validation/")
    p.add_argument("--arch", choices=ARCHS, default="resnet34")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=244)
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: cores / ranks)")
    p.add_argument("--max-steps", type=int, default=0, help="train steps per epoch (0: all)")
    p.add_argument("--launch", type=int, default=0, help="start this many local ranks")
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--output-dir", default="", help="save best_model.pt here and evaluate it at the end")
    return p.parse_args()


def recipe_datasets(torchvision, data, image_size):
    """The tutorial's ImageFolder pair: Train/ with AutoAugment -> Resize((S, S)) -> ToTensor,
    Validation/ with Resize -> ToTensor (bench/pytorch_gpu_ddp_recipe.py uses it too)."""
    from torchvision import transforms
    size = (image_size, image_size)
    train_tf = transforms.Compose([transforms.AutoAugment(), transforms.Resize(size), transforms.ToTensor()])
    val_tf = transforms.Compose([transforms.Resize(size), transforms.ToTensor()])
    return (torchvision.datasets.ImageFolder(os.path.join(data, "Train"), train_tf),
            torchvision.datasets.ImageFolder(os.path.join(data, "Validation"), val_tf))


def evaluate(model, loader, loss_fn):
    """This rank's summed validation loss, correct count and images (the tutorial's)."""
    import torch
    model.eval()
    v_loss, v_correct, v_seen = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            v_loss += loss_fn(out, y).item() * len(y)
            v_correct += (out.argmax(1) == y).sum().item()
            v_seen += len(y)
    return v_loss, v_correct, v_seen


def main():
    args = parse()
    if args.launch:
        return launch_local_ranks(__file__, args.launch, args.port)
    torch, torchvision = import_deps("pytorch_reference_recipe.py")
    import torch.distributed as dist
    import torch.nn as nn

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    threads = args.threads or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    train_set, val_set = recipe_datasets(torchvision, args.data, args.image_size)
    if rank == 0:
        print(f"Train set size: {len(train_set)}, Validation set size: {len(val_set)}", flush=True)
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_set, shuffle=True)
    val_sampler = torch.utils.data.distributed.DistributedSampler(val_set, shuffle=False)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler,
                                               num_workers=args.workers)
    val_loader = torch.utils.data.DataLoader(val_set, batch_size=args.batch_size, sampler=val_sampler,
                                             num_workers=args.workers)

    model = build_model(torch, torchvision, args.arch, "mlp", len(train_set.classes), seed=None)
    model = nn.parallel.DistributedDataParallel(model)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, "min", factor=0.1, patience=5, min_lr=1e-8)

    summary = {"arch": args.arch, "ranks": world, "threads_per_rank": threads, "epochs": []}
    best_acc, best_path = -1.0, os.path.join(args.output_dir, "best_model.pt")
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        t0 = time.time()
        data_wait = 0.0
        loss_sum, correct, seen = 0.0, 0, 0
        t_data = time.time()
        for step, (x, y) in enumerate(train_loader):
            data_wait += time.time() - t_data
            if args.max_steps and step >= args.max_steps:
                break
            opt.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(y)
            correct += (out.argmax(1) == y).sum().item()
            seen += len(y)
            t_data = time.time()
        t_train = time.time() - t0
        t1 = time.time()
        v_loss, v_correct, v_seen = evaluate(model, val_loader, loss_fn)
        t_val = time.time() - t1
        sched.step(v_loss / max(v_seen, 1))
        elapsed = time.time() - t0
        if rank == 0:
            e = f"(Epoch {epoch + 1}/{args.epochs})"
            print(f"{e} Time: {elapsed:.0f}s")
            print(f"{e} Average train loss: {loss_sum / max(seen, 1)}, Average train accuracy: {correct / max(seen, 1)}")
            print(f"{e} Val loss: {v_loss / max(v_seen, 1)}, Val accuracy: {v_correct / max(v_seen, 1)}", flush=True)
        summary["epochs"].append({"epoch_s": elapsed, "train_s": t_train, "val_s": t_val, "data_wait_s": data_wait,
                                  "train_images": seen, "val_images": v_seen})
        v_acc = v_correct / max(v_seen, 1)
        if args.output_dir and v_acc > best_acc:
            best_acc = v_acc
            if rank == 0:  # the tutorial's checkpoint: rank 0 only
                os.makedirs(args.output_dir, exist_ok=True)
                torch.save({"epoch": epoch, "machine": rank, "model_state_dict": model.module.state_dict(),
                            "accuracy": v_acc, "loss": v_loss / max(v_seen, 1)}, best_path)
    if args.output_dir and best_acc >= 0:
        t2 = time.time()
        dist.barrier()  # rank 0 has written the file
        state = torch.load(best_path, weights_only=True)
        model.module.load_state_dict(state["model_state_dict"])
        v_loss, v_correct, v_seen = evaluate(model, val_loader, loss_fn)
        if rank == 0:
            print(f"Best model (val loss: {v_loss / max(v_seen, 1)}, val accuracy: {v_correct / max(v_seen, 1)}) "
                  f"has been saved to {os.path.abspath(best_path)}", flush=True)
        summary["final_eval_s"] = time.time() - t2
    if rank == 0:
        print("RESULT_JSON " + json.dumps(summary), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
