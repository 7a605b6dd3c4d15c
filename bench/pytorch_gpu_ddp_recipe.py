#!/usr/bin/python3
"""The tutorial's PyTorch DDP recipe as users run it on GPUs, timed step by step, for the
side-by-side run of bench/e2e_vs_pytorch.sh.

The recipe of bench/pytorch_reference_recipe.py (ImageFolder, AutoAugment -> Resize((S, S))
-> ToTensor, torchvision ResNet with the Linear-ReLU-Linear head, Adam 1e-4, label-smoothed
0.1 cross-entropy, DistributedSampler, one validation pass per epoch) with what a GPU user
adds: DataLoader workers with pin_memory, non_blocking copies, SyncBatchNorm, channels-last,
and a precision: fp32 (TF32 off), tf32, fp16 (autocast + GradScaler) or bf16 (autocast).
NCCL on CUDA, gloo on the CPU; there fp32 and bf16 autocast run, SyncBatchNorm is left out
(PyTorch refuses it on CPU modules) and tf32 / fp16 end with a SKIP line (exit 77).

Each training step is timed: data wait (blocked on the loader), forward (with the loss and
the batch's copy to the device), backward (with the all-reduce DDP did not hide) and
optimizer; on CUDA the three compute parts are CUDA events read after the step's
loss.item(). Step 1 (the wait for the first batch, cuDNN autotuning, NCCL's first
all-reduce) is reported apart from the median of the later steps. Rank 0 prints one line
`RESULT_JSON {...}` at the end.

Ranks come from torchrun (RANK, WORLD_SIZE, LOCAL_RANK), Open MPI's mpirun
(OMPI_COMM_WORLD_*), Slurm's srun (SLURM_PROCID, ...) or --launch N (local processes);
MASTER_ADDR defaults to 127.0.0.1 (set it for several nodes).

  bench/pytorch_gpu_ddp_recipe.py --launch 2 --data DIR --device cuda --precision fp16 --max-steps 50
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "../tools"))
sys.path.insert(0, here)
from torch_reference import ARCHS, SKIP, build_model, import_deps, launch_local_ranks  # noqa: E402
from pytorch_reference_recipe import recipe_datasets  # noqa: E402

TOOL = "pytorch_gpu_ddp_recipe.py"
PARTS = ("data", "forward", "backward", "optimizer")


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="ImageFolder root with Train/ and Validation/")
    p.add_argument("--arch", choices=ARCHS, default="resnet34")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16, help="images per rank and step")
    p.add_argument("--image-size", type=int, default=244)
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers per rank")
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: cores / ranks)")
    p.add_argument("--max-steps", type=int, default=0, help="train steps per epoch (0: all)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--precision", choices=("fp32", "tf32", "fp16", "bf16"), default="fp32")
    p.add_argument("--no-channels-last", dest="channels_last", action="store_false",
                   help="keep NCHW (default: channels-last model and inputs)")
    p.add_argument("--no-sync-bn", dest="sync_bn", action="store_false",
                   help="plain BatchNorm (default on CUDA: SyncBatchNorm)")
    p.add_argument("--launch", type=int, default=0, help="start this many local ranks")
    p.add_argument("--port", type=int, default=29547, help="MASTER_PORT unless set")
    a = p.parse_args()
    for flag, value, least in (("--epochs", a.epochs, 1), ("--batch-size", a.batch_size, 1),
                               ("--image-size", a.image_size, 32), ("--workers", a.workers, 0),
                               ("--threads", a.threads, 0), ("--max-steps", a.max_steps, 0),
                               ("--launch", a.launch, 0)):
        if value < least:
            p.error(f"{flag} {value}: expected an integer >= {least}")
    for split in ("Train", "Validation"):
        if not os.path.isdir(os.path.join(a.data, split)):
            p.error(f"--data {a.data}: no {split}/ folder (ImageFolder layout: {split}/CLASS/IMAGE)")
    return a


def rank_env():
    """(rank, world, local rank) from whichever launcher started this process."""
    for r, w, lr in (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
                     ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
                     ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
                     ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")):
        if r in os.environ and w in os.environ:
            return int(os.environ[r]), int(os.environ[w]), int(os.environ.get(lr, os.environ[r]))
    return 0, 1, 0


def skip(msg):
    print(f"{TOOL}: SKIP: {msg}", flush=True)
    sys.exit(SKIP)


def set_math_mode(torch, cuda, precision):
    """TF32 for fp32 convolutions and matmuls: off for fp32, on for tf32, PyTorch's defaults
    under autocast. Returns the settings as recorded in the summary (torch >= 2.9 has the
    per-backend fp32_precision; older ones the allow_tf32 flags, which it must not mix)."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    new_api = conv is not None and hasattr(conv, "fp32_precision")
    if cuda and precision in ("fp32", "tf32"):
        if new_api:
            conv.fp32_precision = torch.backends.cuda.matmul.fp32_precision = \
                "tf32" if precision == "tf32" else "ieee"
        else:
            torch.backends.cudnn.allow_tf32 = precision == "tf32"
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.benchmark = cuda
    if new_api:
        return {"cudnn.benchmark": torch.backends.cudnn.benchmark, "cudnn.conv.fp32_precision": conv.fp32_precision,
                "cuda.matmul.fp32_precision": torch.backends.cuda.matmul.fp32_precision}
    return {"cudnn.benchmark": torch.backends.cudnn.benchmark, "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32}


def check_cpu_precision(torch, precision):
    if precision in ("tf32", "fp16"):
        skip(f"--precision {precision} needs CUDA (on the CPU: fp32 or bf16)")
    if precision == "bf16":
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = torch.nn.functional.conv2d(torch.ones(1, 3, 8, 8), torch.ones(4, 3, 3, 3))
            if y.dtype != torch.bfloat16:
                skip(f"torch {torch.__version__} autocast on the CPU does not run convolutions in bf16")
        except (RuntimeError, AttributeError) as e:
            skip(f"torch {torch.__version__} has no bf16 autocast on the CPU ({e})")


class StepClock:
    """One training step's split. On the CPU every op has finished when it returns, so host
    clocks measure it; on CUDA events on the compute stream do, read once the step's
    loss.item() has waited for the stream."""

    def __init__(self, torch, cuda):
        self.torch, self.cuda = torch, cuda
        if cuda:
            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]

    def start(self):
        self.t0 = time.perf_counter()

    def got_batch(self):
        self.t_data = time.perf_counter()
        self.mark(0)

    def mark(self, i):
        if self.cuda:
            self.events[i].record()
        else:
            setattr(self, f"m{i}", time.perf_counter())

    def split_ms(self):
        """Milliseconds of the step (total, data, forward, backward, optimizer), after the sync."""
        total = 1e3 * (time.perf_counter() - self.t0)
        data = 1e3 * (self.t_data - self.t0)
        if self.cuda:
            e = self.events
            compute = [e[i].elapsed_time(e[i + 1]) for i in range(3)]
        else:
            m = [self.t_data, self.m1, self.m2, self.m3]
            compute = [1e3 * (m[i + 1] - m[i]) for i in range(3)]
        return dict(zip(("total",) + PARTS, [total, data] + compute))


class Recipe:
    """One rank's share of the recipe: device, loaders, DDP model, optimizer and loss scaler."""

    def __init__(self, args, torch, torchvision, rank, world, local_rank):
        import torch.distributed as dist
        import torch.nn as nn
        self.args, self.torch, self.rank, self.world = args, torch, rank, world
        if args.device == "cuda" and not torch.cuda.is_available():
            sys.exit(f"{TOOL}: --device cuda: torch {torch.__version__} sees no CUDA device")
        self.cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        if self.cuda:
            torch.cuda.set_device(local_rank % torch.cuda.device_count())
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
            check_cpu_precision(torch, args.precision)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        self.threads = args.threads or max(1, (os.cpu_count() or 1) // world)
        torch.set_num_threads(self.threads)
        self.backend = "nccl" if self.cuda else "gloo"
        dist.init_process_group(self.backend, rank=rank, world_size=world)
        self.math_mode = set_math_mode(torch, self.cuda, args.precision)

        train_set, val_set = recipe_datasets(torchvision, args.data, args.image_size)
        self.train_sampler = torch.utils.data.distributed.DistributedSampler(train_set, shuffle=True)
        val_sampler = torch.utils.data.distributed.DistributedSampler(val_set, shuffle=False)
        loader_args = dict(batch_size=args.batch_size, num_workers=args.workers, pin_memory=self.cuda)
        self.train_loader = torch.utils.data.DataLoader(train_set, sampler=self.train_sampler, **loader_args)
        self.val_loader = torch.utils.data.DataLoader(val_set, sampler=val_sampler, **loader_args)

        model = build_model(torch, torchvision, args.arch, "mlp", len(train_set.classes), seed=None)
        self.sync_bn = args.sync_bn and self.cuda  # SyncBatchNorm refuses CPU modules
        if self.sync_bn:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        self.fmt = torch.channels_last if args.channels_last else torch.contiguous_format
        model = model.to(self.device, memory_format=self.fmt)
        self.model = nn.parallel.DistributedDataParallel(model, device_ids=[self.device.index] if self.cuda else None)
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.precision)
        fp16 = args.precision == "fp16"  # torch >= 2.3 names the device; 1.13 has only torch.cuda.amp's
        self.scaler = torch.amp.GradScaler("cuda", enabled=fp16) if hasattr(torch.amp, "GradScaler") else \
            torch.cuda.amp.GradScaler(enabled=fp16)
        self.clock = StepClock(torch, self.cuda)
        self.steps = []  # every training step's split_ms(), in order

    def autocast(self):  # torch 1.13 refuses a float32 autocast on the CPU even when disabled
        return self.torch.autocast(self.device.type, dtype=self.amp_dtype) if self.amp_dtype \
            else contextlib.nullcontext()

    def to_device(self, x, y):
        return x.to(self.device, non_blocking=True, memory_format=self.fmt), y.to(self.device, non_blocking=True)

    def train_epoch(self, epoch):
        """(summed loss, correct, images) of this rank's training steps, each timed into self.steps."""
        self.train_sampler.set_epoch(epoch)
        self.model.train()
        loss_sum, correct, seen = 0.0, 0, 0
        batches = iter(self.train_loader)  # starts the workers: in the epoch's time, not step 1's
        clock = self.clock
        clock.start()
        for step, (x, y) in enumerate(batches):
            if self.args.max_steps and step >= self.args.max_steps:
                break
            clock.got_batch()
            x, y = self.to_device(x, y)
            self.opt.zero_grad(set_to_none=True)
            with self.autocast():
                out = self.model(x)
                loss = self.loss_fn(out, y)
            clock.mark(1)
            self.scaler.scale(loss).backward()
            clock.mark(2)
            self.scaler.step(self.opt)
            self.scaler.update()
            clock.mark(3)
            loss_sum += loss.item() * len(y)  # the recipe's running loss and accuracy: wait for the step
            correct += (out.argmax(1) == y).sum().item()
            seen += len(y)
            self.steps.append(clock.split_ms())
            clock.start()
        return loss_sum, correct, seen

    def validate(self):
        """(summed loss, correct, images) over this rank's shard of the validation set."""
        self.model.eval()
        v_loss, v_correct, v_seen = 0.0, 0, 0
        with self.torch.no_grad(), self.autocast():
            for x, y in self.val_loader:
                x, y = self.to_device(x, y)
                out = self.model(x)
                v_loss += self.loss_fn(out, y).item() * len(y)
                v_correct += (out.argmax(1) == y).sum().item()
                v_seen += len(y)
        return v_loss, v_correct, v_seen

    def summary(self, epochs):
        a, steady = self.args, self.steps[1:]
        median = {k: statistics.median(s[k] for s in steady) if steady else math.nan for k in ("total",) + PARTS}
        return {
            "framework": "pytorch", "torch": self.torch.__version__,
            "device": self.torch.cuda.get_device_name() if self.cuda else "cpu", "backend": self.backend,
            "arch": a.arch, "image_size": a.image_size, "ranks": self.world, "batch_per_rank": a.batch_size,
            "workers": a.workers, "pin_memory": self.cuda, "threads_per_rank": self.threads,
            "precision": a.precision, "channels_last": a.channels_last, "sync_bn": self.sync_bn,
            "math": self.math_mode, "steps": len(self.steps), "step1_ms": self.steps[0] if self.steps else None,
            "steady_ms": median,
            "steady_img_per_s": a.batch_size * self.world * 1e3 / median["total"] if steady else math.nan,
            "epochs": epochs}


def main():
    args = parse()
    if args.launch:
        return launch_local_ranks(__file__, args.launch, args.port)
    torch, torchvision = import_deps(TOOL)
    import torch.distributed as dist

    recipe = Recipe(args, torch, torchvision, *rank_env())
    epochs = []
    for epoch in range(args.epochs):
        t_epoch = time.perf_counter()
        loss_sum, correct, seen = recipe.train_epoch(epoch)
        t_val = time.perf_counter()
        v_loss, v_correct, v_seen = recipe.validate()
        end = time.perf_counter()
        epochs.append({"epoch_s": end - t_epoch, "train_s": t_val - t_epoch, "val_s": end - t_val,
                       "train_images": seen, "train_loss": loss_sum / max(seen, 1),
                       "train_acc": correct / max(seen, 1), "val_images": v_seen,
                       "val_loss": v_loss / max(v_seen, 1), "val_acc": v_correct / max(v_seen, 1)})
        if recipe.rank == 0:
            print(f"(Epoch {epoch + 1}/{args.epochs}) Time: {epochs[-1]['epoch_s']:.1f}s, "
                  f"train loss {epochs[-1]['train_loss']:.4f}, val loss {epochs[-1]['val_loss']:.4f}", flush=True)
    if recipe.rank == 0:
        print("RESULT_JSON " + json.dumps(recipe.summary(epochs)), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
