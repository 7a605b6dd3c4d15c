// GPU training-step benchmark (not a test): rd::ResNet on the CUDA backend,
// one step = uint8 batch -> device conversion, then the trainer's TrainStep:
// forward, label-smoothed cross-entropy, backward, Adam over the flat arena (fp16:
// the trainer's dynamic loss scaling, a skipped step on overflow).
//
//   gpu_train_bench [--arch resnet34] [--size 244] [--batch 16] [--precision fp32|tf32|fp16|bf16]
//                   [--layout nhwc|nchw] [--steps 20] [--warmup 5] [--head mlp|fc] [--classes 3]
//
// Prints one JSON object on stdout (keys as bench/torch_gpu_bench.py).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "resnet_ddp/backend/names.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/flags.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/train/optimizer.h"
#include "resnet_ddp/train/train_step.h"

int main(int argc, char** argv) {
  std::string arch = "resnet34";
  rd::HeadKind head = rd::HeadKind::Mlp;
  int size = 244, batch = 16, steps = 20, warmup = 5, classes = 3;
  rd::BackendOptions o;
  try {
    rd::FlagSet fs("", "gpu_train_bench");
    fs.text("--arch", &arch, "ARCH", "resnet18 | resnet34 | resnet50 | resnet_tiny");
    fs.integer("--size", &size, 32, "square image size", 100000);
    fs.integer("--batch", &batch, 1, "images per step", 100000);
    fs.enumeration("--precision", &o.precision, rd::precision_names(), "compute precision (fp16: loss scaling)");
    fs.enumeration("--layout", &o.layout, {{"nhwc", rd::Layout::NHWC}, {"nchw", rd::Layout::NCHW}},
                   "activation layout");
    fs.integer("--steps", &steps, 1, "timed steps", 100000);
    fs.integer("--warmup", &warmup, 0, "untimed steps first", 100000);
    fs.enumeration("--head", &head, rd::head_names(), "classifier head");
    fs.integer("--classes", &classes, 1, "number of classes", 100000);
    fs.parse_or_help(argc, argv, "Usage: gpu_train_bench [flags]\n\nFlags:\n");
  } catch (const rd::UsageError& e) {
    std::fprintf(stderr, "gpu_train_bench: %s\n", e.what());
    return 2;
  }
  const std::string precision = rd::name_of(rd::precision_names(), o.precision);
  const std::string layout = o.layout == rd::Layout::NCHW ? "nchw" : "nhwc";
  if (rd::cuda_device_count() == 0) {
    std::fprintf(stderr, "gpu_train_bench: no CUDA device visible\n");
    return 77;
  }
  try {
    rd::validate_arch(arch);
    rd::cuda::CudaBackend be(o);
    size_t free0 = 0, total = 0;
    cudaMemGetInfo(&free0, &total);
    rd::ResNetConfig cfg;
    cfg.arch = arch;
    cfg.head = head;
    cfg.num_classes = classes;
    rd::ResNet model(be, cfg);
    model.init_parameters(1);
    model.train(true);
    rd::train::Optimizer adam(be, model.params(), model.grads(), rd::train::OptimizerConfig{});  // lr 1e-4
    rd::train::TrainStep train_step(model, adam, nullptr, 0.1f, o.precision == rd::Precision::FP16);
    std::vector<uint8_t> images(static_cast<size_t>(batch) * size * size * 3);
    std::mt19937 rng(7);
    for (auto& px : images) px = static_cast<uint8_t>(rng() & 255);
    std::vector<int32_t> labels(static_cast<size_t>(batch));
    for (int i = 0; i < batch; ++i) labels[static_cast<size_t>(i)] = i % classes;
    const float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};
    double last_loss = 0.0;
    auto step = [&]() {
      rd::Tensor& input = model.input_buffer(batch, size, size);
      be.images_u8_to_activation(images.data(), input, mean, stdv);
      last_loss = train_step.forward(input, labels.data()) / batch;
      train_step.backward_and_reduce();
      train_step.update();  // fp16 overflow: skipped on the device, as PyTorch's GradScaler does
    };
    for (int i = 0; i < warmup; ++i) step();
    be.synchronize();
    std::vector<double> times;
    for (int i = 0; i < steps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      step();
      be.synchronize();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    size_t free1 = 0;
    cudaMemGetInfo(&free1, &total);
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    std::printf("{\"framework\": \"resnet_ddp\", \"device\": \"%s\", \"arch\": \"%s\", \"image_size\": %d, "
                "\"batch\": %d, \"precision\": \"%s\", \"layout\": \"%s\", \"steps\": %d, "
                "\"step_ms_median\": %.3f, \"step_ms_min\": %.3f, \"img_per_s\": %.1f, "
                "\"memory_used_mib\": %.0f, \"conv_plans\": %zu, \"workspace_mib\": %.1f, "
                "\"skipped_steps\": %lld, \"loss\": %.5f}\n",
                be.name().c_str(), arch.c_str(), size, batch, precision.c_str(), layout.c_str(), steps,
                median * 1e3, times.front() * 1e3, batch / median,
                static_cast<double>(free0 - std::min(free0, free1)) / 1048576.0, be.conv_plans(),
                static_cast<double>(be.workspace_bytes()) / 1048576.0, static_cast<long long>(train_step.skipped_steps()),
                last_loss);
  } catch (const rd::Error& e) {
    std::fprintf(stderr, "gpu_train_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
