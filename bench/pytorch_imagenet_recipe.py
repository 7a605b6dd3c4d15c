#!/usr/bin/python3
"""torchvision's reference ImageNet recipe (references/classification/train.py), the parts
resnet_ddp implements, on CPUs (gloo), for the accuracy and speed comparison of
bench/recipe_accuracy_vs_pytorch.sh. Our own rendition of the reference's training loop,
using torchvision's own transforms, MixUp/CutMix (transforms.v2) and torch's schedulers.

Train: RandomResizedCrop(crop, bilinear, antialias) -> RandomHorizontalFlip -> TrivialAugmentWide
(bilinear, as the reference's preset passes its interpolation) -> PILToTensor -> float ->
Normalize(ImageNet) -> RandomErasing(p). Eval: Resize(resize) -> CenterCrop(crop). MixUp or
CutMix per batch (RandomChoice), CrossEntropy(label_smoothing), SGD with momentum and
norm-weight-decay, LinearLR warmup then CosineAnnealingLR(T_max = epochs - warmup, eta_min),
EMA (AveragedModel over parameters and buffers, every --model-ema-steps steps, the reference's
decay adjustment, reset during warmup), repeated-augmentation sampler. Needs torchvision >= 0.16
(the PyPI venv of bench/torch_pypi_venv.sh).

  bench/pytorch_imagenet_recipe.py --launch 2 --data DIR --arch resnet18 --epochs 10 ...
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../tools"))
from torch_reference import ARCHS, build_model, import_deps, launch_local_ranks  # noqa: E402


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="ImageFolder root with Train/ and Validation/")
    p.add_argument("--arch", choices=ARCHS, default="resnet18")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("-b", "--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--norm-weight-decay", type=float, default=None)
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--mixup-alpha", type=float, default=0.0)
    p.add_argument("--cutmix-alpha", type=float, default=0.0)
    p.add_argument("--lr-warmup-epochs", type=int, default=0)
    p.add_argument("--lr-warmup-decay", type=float, default=0.01)
    p.add_argument("--lr-min", type=float, default=0.0)
    p.add_argument("--train-crop-size", type=int, default=224)
    p.add_argument("--val-resize-size", type=int, default=256)
    p.add_argument("--val-crop-size", type=int, default=224)
    p.add_argument("--auto-augment", default="ta_wide", choices=["ta_wide", "none"])
    p.add_argument("--random-erase", type=float, default=0.0)
    p.add_argument("--model-ema", action="store_true")
    p.add_argument("--model-ema-steps", type=int, default=32)
    p.add_argument("--model-ema-decay", type=float, default=0.99998)
    p.add_argument("--ra-sampler", action="store_true")
    p.add_argument("--ra-reps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: cores / ranks)")
    p.add_argument("--launch", type=int, default=0, help="start this many local ranks")
    p.add_argument("--port", type=int, default=29541)
    return p.parse_args()


def ra_indices(n, world, rank, reps, seed, epoch, torch):
    """The reference's RASampler: each index repeated `reps` times over a seeded
    permutation, split over ranks, the first floor(n // 256 * 256 / world) taken per rank."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    order = torch.randperm(n, generator=g).tolist()
    per_rank = int(math.ceil(n * reps / world))
    idx = [i for i in order for _ in range(reps)]
    idx += idx[:per_rank * world - len(idx)]
    mine = idx[rank:per_rank * world:world]
    return mine[:int(math.floor(n // 256 * 256 / world))]


class EpochIndices:
    """A sampler over `indices_of(epoch)`, set_epoch as torchvision's RASampler, so one
    DataLoader with persistent workers serves every epoch."""

    def __init__(self, indices_of):
        self.indices_of, self.epoch = indices_of, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        return iter(self.indices_of(self.epoch))

    def __len__(self):
        return len(self.indices_of(self.epoch))


def transforms_for(args, torchvision):
    from torchvision import transforms as T
    bil = T.InterpolationMode.BILINEAR
    norm = T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    train = [T.RandomResizedCrop(args.train_crop_size, interpolation=bil, antialias=True), T.RandomHorizontalFlip()]
    if args.auto_augment == "ta_wide":
        train.append(T.TrivialAugmentWide(interpolation=bil))
    train += [T.PILToTensor(), T.ConvertImageDtype(__import__("torch").float), norm]
    if args.random_erase > 0:
        train.append(T.RandomErasing(p=args.random_erase))
    val = [T.Resize(args.val_resize_size, interpolation=bil, antialias=True), T.CenterCrop(args.val_crop_size),
           T.PILToTensor(), T.ConvertImageDtype(__import__("torch").float), norm]
    return T.Compose(train), T.Compose(val)


def evaluate(model, loader, loss_fn, torch, dist):
    """Global loss sum, top-1 and top-5 counts and images (all-reduced: exact)."""
    model.eval()
    t = torch.zeros(4, dtype=torch.float64)
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            t[0] += loss_fn(out, y).item() * len(y)
            top = out.topk(min(5, out.shape[1]), 1).indices
            t[1] += (top[:, 0] == y).sum().item()
            t[2] += (top == y[:, None]).any(1).sum().item()
            t[3] += len(y)
    dist.all_reduce(t)
    return t[0].item() / t[3].item(), 100 * t[1].item() / t[3].item(), 100 * t[2].item() / t[3].item()


def param_groups(model, wd, norm_wd, torch):
    if norm_wd is None:
        return [{"params": list(model.parameters()), "weight_decay": wd}]
    norm_types = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.GroupNorm, torch.nn.LayerNorm)
    norm, other = [], []
    for m in model.modules():
        for p in m.parameters(recurse=False):
            (norm if isinstance(m, norm_types) else other).append(p)
    return [{"params": other, "weight_decay": wd}, {"params": norm, "weight_decay": norm_wd}]


def main():
    args = parse()
    if args.launch:
        return launch_local_ranks(__file__, args.launch, args.port)
    torch, torchvision = import_deps("pytorch_imagenet_recipe.py")
    import torch.distributed as dist
    from torchvision.transforms import v2
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed * 1000 + rank)

    train_tf, val_tf = transforms_for(args, torchvision)
    train_set = torchvision.datasets.ImageFolder(os.path.join(args.data, "Train"), train_tf)
    val_set = torchvision.datasets.ImageFolder(os.path.join(args.data, "Validation"), val_tf)
    classes = len(train_set.classes)
    mixers = ([v2.MixUp(alpha=args.mixup_alpha, num_classes=classes)] if args.mixup_alpha > 0 else []) + \
             ([v2.CutMix(alpha=args.cutmix_alpha, num_classes=classes)] if args.cutmix_alpha > 0 else [])
    mix = v2.RandomChoice(mixers) if mixers else None
    collate = torch.utils.data.default_collate
    collate_fn = (lambda batch: mix(*collate(batch))) if mix else collate
    val_sampler = torch.utils.data.distributed.DistributedSampler(val_set, shuffle=False)
    # Persistent workers, forked once per loader: the reference's DataLoader forks its workers
    # every epoch, and under CPython 3.11 a fork while the last epoch's queue threads exit can
    # deadlock in the child (PyOS_AfterFork_Child; seen here at epoch 10 of a run). It also
    # makes this side a little faster than the reference, so the comparison is conservative.
    persist = {"num_workers": args.workers, "persistent_workers": args.workers > 0}
    val_loader = torch.utils.data.DataLoader(val_set, batch_size=args.batch_size, sampler=val_sampler, **persist)
    if args.ra_sampler:  # in the reference's order
        sampler = EpochIndices(lambda e: ra_indices(len(train_set), world, rank, args.ra_reps, args.seed, e, torch))
    else:
        sampler = torch.utils.data.distributed.DistributedSampler(train_set, shuffle=True, seed=args.seed)
    loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=sampler,
                                         collate_fn=collate_fn, drop_last=False, **persist)

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = build_model(torch, torchvision, args.arch, "fc", classes, seed=None)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    opt = torch.optim.SGD(param_groups(model, args.weight_decay, args.norm_weight_decay, torch), lr=args.lr,
                          momentum=args.momentum)
    main_s = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs - args.lr_warmup_epochs,
                                                        eta_min=args.lr_min)
    if args.lr_warmup_epochs > 0:
        warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=args.lr_warmup_decay,
                                                 total_iters=args.lr_warmup_epochs)
        sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, main_s], milestones=[args.lr_warmup_epochs])
    else:
        sched = main_s
    ema = None
    if args.model_ema:
        adjust = world * args.batch_size * args.model_ema_steps / args.epochs
        alpha = min(1.0, (1.0 - args.model_ema_decay) * adjust)
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(1.0 - alpha), use_buffers=True)

    summary = {"arch": args.arch, "ranks": world, "seed": args.seed, "epochs": []}
    t_start, step = time.time(), 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        ddp.train()
        t0, loss_sum, seen = time.time(), 0.0, 0
        for x, y in loader:
            out = ddp(x)
            loss = loss_fn(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            loss_sum += loss.item() * len(x)
            seen += len(x)
            if ema is not None and step % args.model_ema_steps == 0:
                ema.update_parameters(model)
                if epoch < args.lr_warmup_epochs:
                    ema.n_averaged.fill_(0)  # the reference: the EMA follows the model during warmup
        sched.step()
        v_loss, acc1, acc5 = evaluate(ddp, val_loader, loss_fn, torch, dist)
        row = {"epoch": epoch + 1, "train_loss": loss_sum / max(seen, 1), "val_loss": v_loss, "acc1": acc1,
               "acc5": acc5, "epoch_s": time.time() - t0}
        if ema is not None:
            _, e1, e5 = evaluate(ema, val_loader, loss_fn, torch, dist)
            row.update(ema_acc1=e1, ema_acc5=e5)
        summary["epochs"].append(row)
        if rank == 0:
            print(f"(Epoch {epoch + 1}/{args.epochs}) Test: Acc@1 {acc1:.3f} Acc@5 {acc5:.3f}"
                  + (f"  EMA Acc@1 {row['ema_acc1']:.3f}" if ema is not None else ""), flush=True)
    summary["total_s"] = time.time() - t_start
    if rank == 0:
        print("RESULT_JSON " + json.dumps(summary), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
