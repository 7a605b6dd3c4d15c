#!/usr/bin/python3
"""Numerical parity of resnet_ddp's ResNet with torchvision (ctest label `parity`).

  run_parity.py --driver build/tests/parity/parity_driver --arch resnet18 --head mlp \
                --height 160 --width 200 --batch 3 [--round-trip] [--workdir DIR]

1. builds a torchvision model with random weights (BN affine parameters and running
   statistics randomised too, so they are exercised) and saves it as a .pth;
2. converts it with tools/torch_to_h5.py (the user's path) and writes an input batch;
3. runs parity_driver (rd::ResNet on the CPU backend) and compares its results with
   PyTorch computed in float64 (the exact reference; the float32 error model's error
   is printed alongside; the train step replays resnet_ddp's ReLU and max-pool
   decisions, see tests/parity/recording_backend.h):
     eval / train logits    1e-5 relative (max-norm)     loss            1e-6 relative
     every parameter grad   1e-4 relative                BN running stats 1e-5 relative
     Adam step (lr 1e-4)    1e-6 relative: torch.optim.Adam applied to the same
                            gradients gives the same parameters
4. --round-trip: the driver trains 2 steps and writes a checkpoint; tools/h5_to_torch.py
   turns it into a .pth that a fresh torchvision model loads with strict=True, and
   PyTorch's eval logits must equal the driver's.

Relative error of a tensor = max|got - ref| / max|ref| (max-norm). Where float32
arithmetic itself cannot reach a tolerance, the limit is derived from our own numerics,
not from another program's error on the day (marked *): the float64 reference is run a
second time with every operation's result perturbed the way resnet_ddp's float32
arithmetic perturbs it (RoundingModel below), and the limit becomes SAFETY times that
model's error. The model is computed in float64 from a fixed seed, so the limits are the
same on every machine. One line per tensor with its worst error, so a failure points at
the layer. Exit 0 on success, 1 on a mismatch, 77 (ctest skip) when torch/torchvision/
h5py are missing.
"""
import argparse
import math
import os
import shutil
import subprocess
import sys
import time

TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOL_LOGITS = 1e-5
TOL_LOSS = 1e-6
TOL_GRAD = 1e-4
TOL_BN_STATS = 1e-5
TOL_ADAM = 1e-6
# The float32 error model (RoundingModel). Each operation resnet_ddp runs in float32
# returns its exact result times (1 + e), where e ~ s * sqrt(K) * growth * N(0, 1):
#   s = u / sqrt(3), the standard deviation of one float32 rounding: round to nearest
#       leaves a relative error spread evenly over [-u, u], u = 2^-24;
#   K = the operation's accumulation depth, i.e. how many products its sums add up:
#       convolution forward C_in*k*k, backward-data C_out*k*k, backward-weights
#       N*H_out*W_out; linear forward in_features, backward-data out_features,
#       backward-weights N; batch norm statistics and their gradients N*H*W;
#       rounding errors of a K-term sum grow like sqrt(K) when they are independent (the
#       worst case is K, reached only by adversarial data; the blocked sums of oneDNN and
#       of our BN loops do better than either);
#   growth = 1 for direct convolutions, WINOGRAD_GROWTH for 3x3 stride-1 layers computed
#       with Winograd F(4x4, 3x3): its input and output transforms multiply by constants
#       up to 8 and add up to 6x6 terms, so each output's rounding error is larger than
#       a direct sum's by about a factor 4 per spatial dimension (Lavin & Gray 2016;
#       Barabasz et al. 2020 measure F(4x4,3x3) fp32 errors ~10-20x direct's);
#       WINOGRAD_F2_GROWTH for the AVX2 backend's own F(2x2, 3x3): constants 0, +-1 and
#       1/2, sums of at most 4x4 terms, so a factor 2 per spatial dimension (Barabasz
#       et al. measure F(2x2,3x3) errors ~2-4x direct's);
#       WINOGRAD_OWN_F4_GROWTH for the AVX2 backend's own F(4x4, 3x3) (the layers with
#       an output side >= OWN_F4_MIN_SIZE, CpuBackend's rule), from its matrices
#       (Lavin & Gray's points 0, +-1, +-2, infinity; winograd_f2x3.cpp): output i's
#       error is the transformed products' errors carried through A^T, each product as
#       large as its rows of G and B^T make it, so relative to a direct 3-term sum it
#       grows by r_i = sqrt(sum_j A^T[i,j]^2 |G[j,:]|^2 |B^T[j,:]|^2 / 3) per spatial
#       dimension (2-norms). F(2x2,3x3): r = 1.29 for both outputs, 1.67 in 2-D, so
#       WINOGRAD_F2_GROWTH = 4 is 2.4x that. F(4x4,3x3): r = 1.73, 1.69, 2.40, 5.61
#       (the last row and column take the +-8s and the point at infinity), 10.8 in 2-D
#       as the root-mean-square over the tile and 31.4 at its worst output; the
#       same 2.4x margin over the mean gives 26, and the model takes the worst
#       output's 32 (2x what oneDNN's F(4x4,3x3) is given above: oneDNN's is measured,
#       ours follows from the matrices). test_backend_winograd measures F(4x4,3x3)'s
#       max error 10-20x F(2x2,3x3)'s, in line with 31.4 / 1.67 = 19.
# The perturbations then travel through the float64 network exactly as rounding errors
# do, amplified wherever the model amplifies them (train-mode BN over few values per
# channel amplifies a lot: ResNet-50 at 160x200 batch 3), so the model's error in each
# tensor is the error float32 arithmetic should produce there. SAFETY allows for the
# model being a typical rather than a worst case (errors of neighbouring outputs are
# correlated; the max-norm picks the worst element).
# How tight it is (measured with direct convolutions on an AVX2 machine, u-scaled model):
# resnet_ddp's error is at most 0.15x the model's in every gradient and logit of
# ResNet-18 and ResNet-50, 1.4x in a running variance, and 0.001x in the loss (rounding
# errors common to all logits cancel in the softmax; the model's independent ones do
# not). So where float32 cannot meet the strict tolerance, these limits catch defects
# that change results by more than float32's own spread (a wrong index, a missed term, a
# wrong scale), not subtle ones; the strict tolerances hold wherever float32 meets them.
U32 = 2.0 ** -24
ROUNDING_SIGMA = U32 / math.sqrt(3.0)
WINOGRAD_GROWTH = 16.0
WINOGRAD_F2_GROWTH = 4.0
WINOGRAD_OWN_F4_GROWTH = 32.0
OWN_F4_MIN_SIZE = 7  # kOwnWinogradF4MinSize in src/backend/cpu/conv.cpp
SAFETY = 4.0
# A ReLU/max-pool decision may differ from float64 only this close to the kink (relative
# to the tensor's max), or within SAFETY x the error model's own error of that ReLU's input
# (deep stages accumulate more: ResNet-101/152's last blocks exceed 1e-4).
TOL_KINK = 1e-4
LABEL_SMOOTHING = 0.1
LR = 1e-4


sys.path.insert(0, TOOLS)
from torch_reference import ARCHS, build_model, import_deps  # noqa: E402

torch, torchvision, h5py, numpy = import_deps("run_parity.py", ("torch", "torchvision", "h5py", "numpy"), skip=True)


def rel_err(got, ref):
    """max|got - ref| / max|ref| in float64 (absolute when ref is all zero)."""
    got = torch.as_tensor(numpy.asarray(got)).double()
    ref = torch.as_tensor(ref).detach().double()
    if tuple(got.shape) != tuple(ref.shape):
        return float("inf")
    scale = ref.abs().max().item() if ref.numel() else 0.0
    diff = (got - ref).abs().max().item() if ref.numel() else 0.0
    return diff / scale if scale > 0 else diff


class Report:
    """Collects comparisons and prints one line per tensor."""

    def __init__(self):
        self.failures = []
        self.count = 0
        self.relaxed = 0

    def section(self, title):
        print(f"\n== {title}")
        print(f"   {'tensor':<40} {'shape':<20} {'resnet_ddp':>11} {'fp32 model':>11} {'limit':>9}")

    def check(self, name, got, ref64, model=None, tol=1e-5):
        """Passes when resnet_ddp's error is within `tol`, or within SAFETY times the
        float32 error model's (where float32 arithmetic itself cannot reach `tol`)."""
        err = rel_err(got, ref64)
        err_model = rel_err(model, ref64) if model is not None else None
        limit = tol if err_model is None else max(tol, SAFETY * err_model)
        ok = err <= limit
        self.count += 1
        shape = str(list(numpy.asarray(got).shape))
        em = f"{err_model:11.2e}" if err_model is not None else f"{'-':>11}"
        relaxed = "*" if err > tol else " "  # passed (or failed) only on the model-derived limit
        print(f"{'  ' if ok else '!!'} {name:<40} {shape:<20} {err:11.2e} {em} {limit:8.1e}{relaxed}"
              + ("" if ok else "  FAIL"))
        if err > tol and ok:
            self.relaxed += 1
        if not ok:
            self.failures.append((name, err, limit))
        return ok


class PerturbGrad(torch.autograd.Function):
    """Identity forward; the gradient passing back through it gets `noise` applied."""

    @staticmethod
    def forward(ctx, x, noise):
        ctx.noise = noise
        return x.clone()  # a fresh tensor: torchvision adds the residual in place

    @staticmethod
    def backward(ctx, grad):
        return ctx.noise(grad), None


class RoundingModel:
    """resnet_ddp's float32 rounding, modelled in float64 (see the constants above):
    every convolution, linear and batch-norm layer's output, the gradient it passes back
    to its input, and its parameter gradients are multiplied by (1 + s*sqrt(K)*growth*r),
    r ~ N(0, 1) from a fixed seed."""

    def __init__(self, seed, winograd, f2x3=False):
        self.gen = torch.Generator().manual_seed(seed)
        self.winograd = winograd  # "none", "auto" (the backend's rule) or "all"
        self.f2x3 = f2x3  # the AVX2 backend's own F(2x2,3x3)/F(4x4,3x3) rather than oneDNN's F(4x4,3x3)
        self.param_depth = {}
        self.bn_depth = {}

    def noise(self, t, depth, growth=1.0):
        r = torch.randn(t.shape, generator=self.gen, dtype=torch.float64).to(t.dtype)
        return t * (1 + ROUNDING_SIGMA * math.sqrt(depth) * growth * r)

    def _growth(self, conv, x, y):
        if self.winograd == "none" or conv.kernel_size != (3, 3) or conv.stride != (1, 1) or conv.groups != 1:
            return 1.0
        min_size = 4 if self.f2x3 else 8  # CpuBackend::use_own_winograd / use_winograd
        if self.winograd == "auto" and not (x.shape[1] % 16 == 0 and y.shape[1] % 16 == 0
                                             and y.shape[2] >= min_size and y.shape[3] >= min_size):
            return 1.0  # the backend's rule: direct for these
        if not self.f2x3:
            return WINOGRAD_GROWTH
        return WINOGRAD_OWN_F4_GROWTH if min(y.shape[2], y.shape[3]) >= OWN_F4_MIN_SIZE else WINOGRAD_F2_GROWTH

    def install(self, model):
        kinds = (torch.nn.Conv2d, torch.nn.Linear, torch.nn.BatchNorm2d)
        for mod in model.modules():
            if isinstance(mod, kinds):
                mod.register_forward_hook(self._hook)

    def _hook(self, mod, inputs, y):
        x = inputs[0]
        if isinstance(mod, torch.nn.Conv2d):
            kk = mod.kernel_size[0] * mod.kernel_size[1]
            growth = self._growth(mod, x, y)
            # A grouped convolution's sums run over one group's channels.
            fwd, bwd = mod.in_channels // mod.groups * kk, mod.out_channels // mod.groups * kk
            self.param_depth[mod.weight] = (x.shape[0] * y.shape[2] * y.shape[3], growth)
        elif isinstance(mod, torch.nn.Linear):
            growth, fwd, bwd = 1.0, mod.in_features, mod.out_features
            self.param_depth[mod.weight] = self.param_depth[mod.bias] = (x.shape[0], 1.0)
        else:  # batch norm: statistics and their gradients sum over N*H*W values per channel
            growth = 1.0
            fwd = bwd = x.shape[0] * x.shape[2] * x.shape[3]
            self.param_depth[mod.weight] = self.param_depth[mod.bias] = (fwd, 1.0)
            self.bn_depth[mod] = fwd
        y = self.noise(y, fwd, growth)
        return PerturbGrad.apply(y, lambda g: self.noise(g, bwd, growth))

    def perturb_step(self, model):
        """The parameter gradients, and the running statistics (whose batch statistics
        are N*H*W-term sums of their own)."""
        for p in model.parameters():
            depth, growth = self.param_depth[p]
            p.grad = self.noise(p.grad, depth, growth)
        with torch.no_grad():
            for mod, depth in self.bn_depth.items():
                if mod.training:
                    mod.running_mean.copy_(self.noise(mod.running_mean, depth))
                    mod.running_var.copy_(self.noise(mod.running_var, depth))


def randomise_bn(model, gen):
    """Non-trivial BN affine parameters, running statistics and counters."""
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                c = mod.num_features
                mod.weight.copy_(0.5 + torch.rand(c, generator=gen))
                mod.bias.copy_(0.1 * torch.randn(c, generator=gen))
                mod.running_mean.copy_(0.1 * torch.randn(c, generator=gen))
                mod.running_var.copy_(0.5 + torch.rand(c, generator=gen))
                mod.num_batches_tracked.fill_(7)


def run(cmd, what):
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(f"-- {what} ({time.perf_counter() - t0:.1f} s): {' '.join(cmd)}")
    if proc.stdout.strip():
        print("   " + proc.stdout.strip().replace("\n", "\n   "))
    if proc.returncode != 0:
        print(f"run_parity.py: FAIL: {what} exited with status {proc.returncode}")
        sys.exit(1)


class Replay:
    """resnet_ddp's ReLU and max-pool decisions (recorded by parity_driver in forward
    order), replayed in a PyTorch model. Counts where they differ from the model's own
    decisions and how close to the kink (or tie) those elements were."""

    def __init__(self, masks, maxpool_input, keep_inputs=()):
        self.masks = masks
        self.maxpool_input = maxpool_input
        self.next = 0
        self.relu_flips = 0
        self.relu_flip_margin = 0.0  # largest |x| / max|x| among differing ReLU decisions
        self.pool_flips = 0
        self.pool_flip_gap = 0.0     # largest (own max - replayed value) / max|x| among them
        self.relu_margins = {}       # ReLU index -> largest |x| / max|x| among its differing decisions
        # ReLU index -> its input, kept (for the error model's error there) where a decision
        # differs by more than TOL_KINK, and at the indices `keep_inputs` asks for.
        self.keep_inputs = set(keep_inputs)
        self.relu_inputs = {}

    def relu(self, x):
        if self.next >= len(self.masks):
            raise RuntimeError(f"PyTorch applies more ReLUs than resnet_ddp recorded ({len(self.masks)})")
        kind, mask = self.masks[self.next]
        if tuple(mask.shape) != tuple(x.shape):
            raise RuntimeError(f"ReLU #{self.next} ({kind}): resnet_ddp recorded {list(mask.shape)}, "
                               f"PyTorch applies it to {list(x.shape)} (layer order differs)")
        index = self.next
        self.next += 1
        keep = torch.from_numpy(mask).bool()
        differ = keep != (x > 0)
        if differ.any():
            xa = x.detach().abs()
            self.relu_flips += int(differ.sum())
            margin = (xa[differ].max() / xa.max()).item()
            self.relu_flip_margin = max(self.relu_flip_margin, margin)
            self.relu_margins[index] = margin
            if margin > TOL_KINK:
                self.keep_inputs.add(index)
        if index in self.keep_inputs:
            self.relu_inputs[index] = x.detach().clone()
        return torch.where(keep, x, torch.zeros_like(x))

    def maxpool(self, x):
        rd_in = torch.from_numpy(self.maxpool_input)
        if tuple(rd_in.shape) != tuple(x.shape):
            raise RuntimeError(f"max pool: resnet_ddp input {list(rd_in.shape)}, PyTorch {list(x.shape)}")
        _, idx = torch.nn.functional.max_pool2d(rd_in, 3, 2, 1, return_indices=True)
        replayed = x.flatten(2).gather(2, idx.flatten(2)).view(idx.shape)
        own = torch.nn.functional.max_pool2d(x.detach(), 3, 2, 1)
        gap = (own - replayed.detach()).abs()
        differ = gap > 0
        if differ.any():
            self.pool_flips += int(differ.sum())
            self.pool_flip_gap = max(self.pool_flip_gap, (gap.max() / x.detach().abs().max()).item())
        return replayed

    def install(self, model):
        """Replace every nn.ReLU and the stem max pool of a torchvision ResNet."""
        replay = self

        class ReplayReLU(torch.nn.Module):
            def forward(self, x):
                return replay.relu(x)

        class ReplayMaxPool(torch.nn.Module):
            def forward(self, x):
                return replay.maxpool(x)

        for parent in list(model.modules()):
            for child_name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.ReLU):
                    setattr(parent, child_name, ReplayReLU())
        model.maxpool = ReplayMaxPool()

    def check_consumed(self):
        if self.next != len(self.masks):
            raise RuntimeError(f"resnet_ddp recorded {len(self.masks)} ReLUs, PyTorch applied {self.next}")


def pytorch_reference(model32, x32, labels, replay, rounding=None):
    """Eval logits, and with resnet_ddp's ReLU/max-pool decisions replayed: train logits,
    loss, grads, BN buffers after one train step — all in float64, exact or (with a
    RoundingModel) with float32's rounding errors modelled."""
    def fresh():
        m = build_model(torch, torchvision, ARGS.arch, ARGS.head, ARGS.num_classes)
        m.load_state_dict(model32.state_dict())
        m = m.to(torch.float64)
        if rounding is not None:
            rounding.install(m)
        return m
    x = x32.to(torch.float64)
    out = {}
    model = fresh().eval()
    with torch.no_grad():
        out["eval_logits"] = model(x)
    model = fresh().train()
    replay.install(model)
    logits = model(x)
    replay.check_consumed()
    loss = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=LABEL_SMOOTHING)
    loss.backward()
    if rounding is not None:
        rounding.perturb_step(model)
    out["train_logits"] = logits.detach()
    out["loss"] = loss.detach()
    out["grads"] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    out["buffers"] = {n: b.detach().clone() for n, b in model.named_buffers()}
    return out


def main():
    start = time.perf_counter()
    torch.set_num_threads(ARGS.threads)
    workdir = ARGS.workdir or os.path.join(os.getcwd(), f"parity_{ARGS.arch}_{ARGS.head}")
    os.makedirs(workdir, exist_ok=True)
    pth, init_h5 = os.path.join(workdir, "model.pth"), os.path.join(workdir, "init.h5")
    input_h5, out_h5 = os.path.join(workdir, "input.h5"), os.path.join(workdir, "driver_out.h5")
    ckpt_h5, back_pth = os.path.join(workdir, "trained.h5"), os.path.join(workdir, "trained.pth")

    gen = torch.Generator().manual_seed(ARGS.seed)
    model = build_model(torch, torchvision, ARGS.arch, ARGS.head, ARGS.num_classes, seed=ARGS.seed)
    randomise_bn(model, gen)
    torch.save(model.state_dict(), pth)
    x = torch.randn(ARGS.batch, 3, ARGS.height, ARGS.width, generator=gen)
    labels = torch.arange(ARGS.batch) % ARGS.num_classes
    with h5py.File(input_h5, "w") as f:
        f.create_dataset("input", data=x.numpy())
        f.create_dataset("labels", data=labels.numpy().astype("int32"))
        f.attrs["label_smoothing"] = LABEL_SMOOTHING
        f.attrs["lr"] = LR

    py = sys.executable
    run([py, os.path.join(TOOLS, "torch_to_h5.py"), pth, init_h5, "--quiet"], "convert .pth -> .h5")
    driver_cmd = [ARGS.driver, "--init", init_h5, "--input", input_h5, "--out", out_h5,
                  "--threads", str(ARGS.threads), "--layout", ARGS.layout, "--conv-algo", ARGS.conv_algo, "--train-steps", "2" if ARGS.round_trip else "1"]
    if ARGS.round_trip:
        driver_cmd += ["--checkpoint", ckpt_h5]
    run(driver_cmd, "parity_driver")

    rep = Report()
    with h5py.File(out_h5, "r") as f:
        masks = [(ds.attrs["kind"], ds[()]) for _, ds in sorted(f["relu_masks"].items())]
        replay64 = Replay(masks, f["maxpool_input"][()])
        backend = f.attrs["backend"]
        backend = backend.decode() if hasattr(backend, "decode") else str(backend)
        # Which convolutions the driver ran as Winograd (its backend line says whether
        # this CPU runs Winograd at all).
        f2x3 = "own Winograd" in backend  # F(4x4,3x3) or F(2x2,3x3) per layer (_growth)
        winograd = ("none" if ARGS.conv_algo == "direct" or ("Winograd 3x3" not in backend and not f2x3)
                    else "all" if ARGS.conv_algo == "winograd" else "auto")
        ref64 = pytorch_reference(model, x, labels, replay64)
        replay_model = Replay(masks, f["maxpool_input"][()], keep_inputs=replay64.relu_inputs)
        ref_model = pytorch_reference(model, x, labels, replay_model, RoundingModel(ARGS.seed + 1000, winograd, f2x3))
        print(f"\n{ARGS.arch} head {ARGS.head} ({ARGS.num_classes} classes), input "
              f"{ARGS.batch}x3x{ARGS.height}x{ARGS.width}; driver backend: {backend}; "
              f"float32 error model: Winograd {winograd}{' own F(4x4,3x3)/F(2x2,3x3)' if f2x3 else ''}, limit = max(tolerance, {SAFETY:g} x model)")
        rep.section("logits and loss (vs PyTorch float64)")
        rep.check("eval_logits", f["eval_logits"][()], ref64["eval_logits"], ref_model["eval_logits"], TOL_LOGITS)
        rep.check("train_logits", f["train_logits"][()], ref64["train_logits"], ref_model["train_logits"], TOL_LOGITS)
        rep.check("loss", f["loss"][()], ref64["loss"], ref_model["loss"], TOL_LOSS)

        print(f"\n   resnet_ddp's ReLU decisions differing from float64's own: {replay64.relu_flips} of "
              f"{sum(m.size for _, m in masks):,} (|x| <= {replay64.relu_flip_margin:.1e} max|x|); "
              f"max-pool windows: {replay64.pool_flips} (gap <= {replay64.pool_flip_gap:.1e} max|x|)")
        print("   the float64 reference below replays resnet_ddp's decisions: at those kinks either "
              "choice is right")
        for i, exact in sorted(replay64.relu_inputs.items()):  # the decisions beyond TOL_KINK
            margin = replay64.relu_margins[i]
            model_error = ((replay_model.relu_inputs[i] - exact).abs().max() / exact.abs().max()).item()
            limit = max(TOL_KINK, SAFETY * model_error)
            print(f"{'  ' if margin <= limit else '!!'} ReLU #{i}: decisions differ up to {margin:.1e} of the "
                  f"tensor's scale; the error model's error of its input is {model_error:.1e} (limit {limit:.1e})")
            if margin > limit:
                print(f"!! a ReLU decision differs from float64 at {margin:.1e} of the tensor's scale "
                      f"(> {limit:.1e}): not rounding  FAIL")
                rep.failures.append((f"ReLU #{i} decisions", margin, limit))
        if replay64.pool_flip_gap > TOL_KINK:
            print(f"!! a max-pool decision differs from float64 at {replay64.pool_flip_gap:.1e} of the tensor's "
                  f"scale (> {TOL_KINK:g}): not rounding  FAIL")
            rep.failures.append(("max-pool decisions", replay64.pool_flip_gap, TOL_KINK))

        rep.section("parameter gradients, one train step (vs PyTorch float64, same ReLU decisions)")
        names = list(ref64["grads"])
        missing = [n for n in names if n not in f["grads"]]
        if missing:
            print(f"!! driver wrote no gradient for: {', '.join(missing)}")
            rep.failures.append(("grads missing", len(missing), 0))
        for n in names:
            if n in f["grads"]:
                rep.check(n, f["grads"][n][()], ref64["grads"][n], ref_model["grads"][n], TOL_GRAD)

        rep.section("BN running statistics after one train step")
        for n, ref in ref64["buffers"].items():
            if n.endswith("num_batches_tracked"):
                continue
            rep.check(n, f["buffers"][n][()], ref, ref_model["buffers"][n], TOL_BN_STATS)
        tracked = int(f.attrs["num_batches_tracked_after_step1"])
        expected = int(ref64["buffers"]["bn1.num_batches_tracked"])
        print(f"{'  ' if tracked == expected else '!!'} num_batches_tracked: {tracked} (PyTorch {expected})")
        if tracked != expected:
            rep.failures.append(("num_batches_tracked", tracked, expected))

        # Adam on the driver's own gradients, so this isolates the optimizer from
        # gradient rounding (Adam's first step is ~lr * sign(grad), which flips for
        # gradients within rounding of zero).
        rep.section(f"one Adam step (lr {LR:g}) from the driver's gradients vs torch.optim.Adam")
        params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
        opt = torch.optim.Adam(params.values(), lr=LR)
        for n, p in params.items():
            p.grad = torch.from_numpy(f["grads"][n][()])
        opt.step()
        for n, p in params.items():
            rep.check(n, f["params_adam1"][n][()], p.detach(), None, TOL_ADAM)
        final_eval = f["final_eval_logits"][()]

    if ARGS.round_trip:
        rep.section("round trip: torchvision -> h5 -> 2 steps in resnet_ddp -> .pth -> PyTorch eval")
        run([py, os.path.join(TOOLS, "h5_to_torch.py"), ckpt_h5, back_pth], "convert checkpoint -> .pth")
        fresh = build_model(torch, torchvision, ARGS.arch, ARGS.head, ARGS.num_classes, seed=ARGS.seed + 1)
        fresh.load_state_dict(torch.load(back_pth), strict=True)
        fresh.eval()
        fresh.double()
        with torch.no_grad():
            back64 = fresh(x.double())
            RoundingModel(ARGS.seed + 2000, winograd, f2x3).install(fresh)
            back_model = fresh(x.double())
        rep.check("final_eval_logits", final_eval, back64, back_model, TOL_LOGITS)

    elapsed = time.perf_counter() - start
    if rep.failures:
        worst = max(rep.failures, key=lambda t: t[1] / t[2] if t[2] else float("inf"))
        print(f"\nFAIL: {len(rep.failures)} of {rep.count} tensors outside tolerance; first: "
              f"{rep.failures[0][0]} ({rep.failures[0][1]:.2e} > {rep.failures[0][2]:.0e}); "
              f"worst: {worst[0]} ({worst[1]:.2e}); {elapsed:.1f} s")
        print(f"intermediate files kept in {workdir}")
        sys.exit(1)
    if not ARGS.keep:
        # ResNet-50 leaves ~0.5 GB (weights, gradients, masks): only worth keeping on failure.
        shutil.rmtree(workdir, ignore_errors=True)
    relaxed = (f"; {rep.relaxed} (marked *) exceed the tolerance but are within {SAFETY:g}x "
               f"the float32 error model's" if rep.relaxed else "")
    print(f"\nPASS: {rep.count} tensors within tolerance ({elapsed:.1f} s){relaxed}")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--driver", required=True, help="path of the parity_driver program")
    p.add_argument("--arch", choices=ARCHS, default="resnet18")
    p.add_argument("--head", choices=("fc", "mlp"), default="mlp")
    p.add_argument("--num-classes", type=int, default=3)
    p.add_argument("--batch", type=int, default=3)
    p.add_argument("--height", type=int, default=160)
    p.add_argument("--width", type=int, default=200)
    p.add_argument("--threads", type=int, default=1, help="threads for PyTorch and the driver (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layout", choices=("nhwc", "nchw", "nchw16c", "nchw8c", "default"), default="nhwc",
                   help="activation layout of resnet_ddp's CPU backend (default nhwc; 'default' is "
                        "the trainer's choice for this CPU: nChw16c on AVX-512, NHWC on AVX2)")
    p.add_argument("--conv-algo", choices=("auto", "direct", "winograd"), default="auto",
                   help="resnet_ddp's CPU 3x3 convolution algorithm (default auto, as the trainer); "
                        "the float32 error model gives Winograd layers a larger rounding error")
    p.add_argument("--round-trip", action="store_true", help="also train 2 steps and compare via .pth")
    p.add_argument("--workdir", help="where the intermediate files go (default ./parity_ARCH_HEAD); "
                                     "removed after a pass unless --keep")
    p.add_argument("--keep", action="store_true", help="keep the intermediate files after a pass")
    a = p.parse_args()
    if not os.access(a.driver, os.X_OK):
        p.error(f"--driver '{a.driver}' is not an executable file")
    if a.batch < 2:
        p.error("--batch must be >= 2 (train-mode batch norm needs more than one value per channel)")
    if min(a.height, a.width) < 32 or a.num_classes < 2 or a.threads < 1:
        p.error("--height/--width must be >= 32, --num-classes >= 2, --threads >= 1")
    return a


if __name__ == "__main__":
    ARGS = parse_args()
    main()
