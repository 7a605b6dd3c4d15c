"""The GPU scaling model of docs/performance.md: ResNet shapes (gradient bytes,
FLOPs), the clusters' published figures and a ring all-reduce estimate.
"""



def resnet_shapes(arch, size, head="mlp", classes=3):
    """Trainable parameters and forward multiply-adds per image of torchvision's
    ResNet with the reference head (Linear(C,C)-ReLU-Linear(C,K))."""
    blocks = {"resnet18": ("basic", [2, 2, 2, 2]), "resnet34": ("basic", [3, 4, 6, 3]),
              "resnet50": ("bottleneck", [3, 4, 6, 3])}[arch]
    kind, counts = blocks
    params, macs = 0, 0

    def conv(cin, cout, k, stride, pad, hw):
        nonlocal params, macs
        out = (hw + 2 * pad - k) // stride + 1
        params += cin * cout * k * k
        macs += out * out * cin * cout * k * k
        return out

    def bn(c):
        nonlocal params
        params += 2 * c

    hw = conv(3, 64, 7, 2, 3, size)
    bn(64)
    hw = (hw + 2 - 3) // 2 + 1  # max pool 3x3/2
    cin = 64
    for stage, n in enumerate(counts):
        planes = 64 * 2 ** stage
        for b in range(n):
            stride = 2 if stage > 0 and b == 0 else 1
            if kind == "basic":
                out = conv(cin, planes, 3, stride, 1, hw)
                bn(planes)
                conv(planes, planes, 3, 1, 1, out)
                bn(planes)
                cout = planes
            else:
                conv(cin, planes, 1, 1, 0, hw)
                bn(planes)
                out = conv(planes, planes, 3, stride, 1, hw)
                bn(planes)
                conv(planes, planes * 4, 1, 1, 0, out)
                bn(planes * 4)
                cout = planes * 4
            if stride != 1 or cin != cout:
                conv(cin, cout, 1, stride, 0, hw)
                bn(cout)
            cin, hw = cout, out
    c = cin
    if head == "mlp":
        params += c * c + c
        macs += c * c
    params += c * classes + classes
    macs += c * classes
    return params, macs


# Scaling-model assumptions: every number here is an input, not a measurement.
CLUSTERS = {
    "frontera_rtx": {
        "label": "Frontera rtx: 2 nodes x 4 Quadro RTX 5000, FDR InfiniBand",
        "gpus_per_node": 4, "nodes": 2,
        "inter_node_GBps": 6.8,   # FDR 4x: 56 Gb/s signalling, ~6.8 GB/s data
        "intra_node_GBps": 10.0,  # PCIe 3.0 x16 through the host (no NVLink), practical
        # ResNet-50 @224 training img/s per GPU, large batch: V100 FP32 367 img/s (NVIDIA
        # DeepLearningExamples, DGX-1) scaled by FP32 peak 11.2 / 15.7 TFLOPS.
        "r50_img_s": {"fp32": 367 * 11.2 / 15.7, "fp16": 1200 * 89.2 / 125.0},
    },
    "lonestar6_a100": {
        "label": "Lonestar6: 2 nodes x 3 A100 40GB, HDR InfiniBand",
        "gpus_per_node": 3, "nodes": 2,
        "inter_node_GBps": 25.0,  # HDR 200 Gb/s
        "intra_node_GBps": 20.0,  # PCIe 4.0 x16, practical
        # NVIDIA DeepLearningExamples ResNet-50 v1.5, 1x A100 80GB: TF32 938, AMP 2470 img/s.
        "r50_img_s": {"tf32": 938.0, "bf16": 2470.0},
    },
}
NCCL_BUS_EFFICIENCY = 0.8     # achieved busbw / link bandwidth for large messages
SMALL_BATCH_FACTOR = 0.7      # batch 16 per GPU runs below the published large-batch img/s
BACKWARD_SHARE = 2.0 / 3.0    # backward = 2x forward, so 2/3 of the compute time
BUCKET_MB = 25.0              # resnet_ddp --bucket-mb default (as PyTorch DDP)


def ring_allreduce_s(nbytes, n, gbps):
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / (gbps * 1e9 * NCCL_BUS_EFFICIENCY)


def scaling_model():
    r50_params, r50_macs = resnet_shapes("resnet50", 224)
    models = {"resnet34@244": resnet_shapes("resnet34", 244), "resnet50@224": resnet_shapes("resnet50", 224)}
    batch = 16
    out = {"assumptions": {
        "nccl_bus_efficiency": NCCL_BUS_EFFICIENCY, "small_batch_factor": SMALL_BATCH_FACTOR,
        "backward_share_of_compute": BACKWARD_SHARE, "bucket_mb": BUCKET_MB, "per_gpu_batch": batch,
        "gradient_dtype": "fp32 (4 bytes per parameter, also with AMP: the gradients all-reduced are fp32)",
        "step_time": "t_compute = batch / (published ResNet-50 img/s x small_batch_factor x FLOP ratio)",
        "allreduce": "ring: 2(n-1)/n * bytes / (bandwidth * nccl_bus_efficiency); bandwidth = intra-node "
                     "PCIe within one node, the InfiniBand link once the ring spans 2 nodes",
        "no_overlap": "t_step = t_compute + t_allreduce",
        "overlap": "t_step = t_compute + max(t_allreduce(last 25 MB bucket), t_allreduce - t_backward)",
    }, "clusters": {}}
    for cname, c in CLUSTERS.items():
        cl = {"label": c["label"], "inter_node_GBps": c["inter_node_GBps"], "intra_node_GBps": c["intra_node_GBps"],
              "r50_img_s_published_or_scaled": c["r50_img_s"], "rows": []}
        max_gpus = c["gpus_per_node"] * c["nodes"]
        for mname, (params, macs) in models.items():
            nbytes = params * 4
            for prec, r50_rate in c["r50_img_s"].items():
                rate = r50_rate * SMALL_BATCH_FACTOR * (r50_macs / macs)
                t_c = batch / rate
                for n in range(1, max_gpus + 1):
                    bw = c["intra_node_GBps"] if n <= c["gpus_per_node"] else min(c["inter_node_GBps"],
                                                                                 c["intra_node_GBps"])
                    t_ar = ring_allreduce_s(nbytes, n, bw)
                    t_last = ring_allreduce_s(min(nbytes, BUCKET_MB * 2 ** 20), n, bw)
                    t_no = t_c + t_ar
                    t_ov = t_c + (max(t_last, t_ar - BACKWARD_SHARE * t_c) if n > 1 else 0.0)
                    cl["rows"].append({"model": mname, "precision": prec, "gpus": n, "grad_MB": nbytes / 2 ** 20,
                                       "t_compute_ms": t_c * 1e3, "t_allreduce_ms": t_ar * 1e3,
                                       "t_step_no_overlap_ms": t_no * 1e3, "t_step_overlap_ms": t_ov * 1e3,
                                       "eff_no_overlap": t_c / t_no, "eff_overlap": t_c / t_ov,
                                       "img_s_overlap": n * batch / t_ov})
        out["clusters"][cname] = cl
    return out
