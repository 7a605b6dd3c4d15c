#!/usr/bin/env python3
"""The weight EMA of resnet_ddp (Backend::ema_update on the CPU backend,
ModelEma::average_count; tests/train/ema_driver) against torch's AveragedModel with
torchvision's ema_avg and use_buffers=True (parameters, BN running stats and
num_batches_tracked averaged), including n_averaged resets as in warmup epochs.
Every float must be equal up to 1e-6 relative (measured maximum printed) and
num_batches_tracked exactly. Exit 77 (skipped) without torch."""
import subprocess
import sys

try:
    import torch
    from torch.optim.swa_utils import AveragedModel
except ImportError:
    print("torch not available: skipped")
    sys.exit(77)


def float_state(m):
    return [t for t in list(m.parameters()) + list(m.buffers()) if t.dtype == torch.float32]


def run(driver, decay, updates, resets):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 5), torch.nn.BatchNorm1d(5))

    def ema_avg(avg, cur, num_averaged):  # torchvision's ExponentialMovingAverage
        return decay * avg + (1 - decay) * cur

    ema = AveragedModel(model, avg_fn=ema_avg, use_buffers=True)
    count = sum(t.numel() for t in float_state(model))
    lines = [f"{decay!r} {count} {updates}"]
    for u in range(updates):
        with torch.no_grad():
            model.train()
            model(torch.randn(8, 3, 8, 8))  # running stats and num_batches_tracked move
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        ema.update_parameters(model)
        reset = u in resets
        if reset:
            ema.n_averaged.fill_(0)
        flat = torch.cat([t.detach().reshape(-1) for t in float_state(model)])
        lines.append(f"{int(reset)} {int(model[1].num_batches_tracked)}")
        lines.append(" ".join(repr(float(v)) for v in flat))
    out = subprocess.run([driver], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True).stdout
    got = [float(x) for x in out.split()]
    # %.9g identifies a float32 exactly once read back as float32.
    ours, ours_nbt = torch.tensor(got[:-1], dtype=torch.float32), int(got[-1])
    ref = torch.cat([t.detach().reshape(-1) for t in float_state(ema.module)])
    rel = ((ours.double() - ref.double()).abs() / ref.double().abs().clamp_min(1e-30)).max().item()
    exact = int((ours == ref).sum())
    ref_nbt = int(ema.module[1].num_batches_tracked)
    print(f"decay {decay}, {updates} updates, resets {sorted(resets)}: max relative error {rel:.3g} "
          f"({exact}/{count} bit-equal), num_batches_tracked ours {ours_nbt} torch {ref_nbt}")
    return rel <= 1e-6 and ours_nbt == ref_nbt


def main():
    driver = sys.argv[1]
    ok = True
    ok &= run(driver, 0.9, 12, set())
    ok &= run(driver, 0.99998, 5, set())
    ok &= run(driver, 0.5, 10, {0, 1, 2})  # warmup epochs: the average restarts each time
    ok &= run(driver, 0.7, 40, {3})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
