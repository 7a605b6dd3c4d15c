// GPU training-step benchmark (not a test): rd::ResNet on the CUDA backend,
// one step = uint8 batch -> device conversion, forward, label-smoothed
// cross-entropy, backward, Adam over the flat arena (fp16: static loss scale
// with the fused unscale + overflow check, a skipped step on overflow).
//
//   gpu_train_bench [--arch resnet34] [--size 244] [--batch 16] [--precision fp32|tf32|fp16|bf16]
//                   [--layout nhwc|nchw] [--steps 20] [--warmup 5] [--head mlp|fc] [--classes 3]
//
// Prints one JSON object on stdout (keys as tests/gpu/torch_gpu_bench.py).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"

namespace {

[[noreturn]] void usage(const std::string& msg) {
  std::fprintf(stderr, "gpu_train_bench: %s (see tests/gpu/gpu_train_bench.cpp)\n", msg.c_str());
  std::exit(2);
}

int to_int(const std::string& flag, const std::string& v, int lo) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || x < lo || x > 100000) usage(flag + " '" + v + "': expected an integer >= " + std::to_string(lo));
  return static_cast<int>(x);
}

}  // namespace

int main(int argc, char** argv) {
  std::string arch = "resnet34", precision = "fp32", layout = "nhwc", head = "mlp";
  int size = 244, batch = 16, steps = 20, warmup = 5, classes = 3;
  for (int i = 1; i < argc; i += 2) {
    const std::string f = argv[i];
    if (i + 1 >= argc) usage("flag " + f + " needs a value (or is unknown)");
    const std::string v = argv[i + 1];
    if (f == "--arch") arch = v;
    else if (f == "--size") size = to_int(f, v, 32);
    else if (f == "--batch") batch = to_int(f, v, 1);
    else if (f == "--precision") precision = v;
    else if (f == "--layout") layout = v;
    else if (f == "--steps") steps = to_int(f, v, 1);
    else if (f == "--warmup") warmup = to_int(f, v, 0);
    else if (f == "--head") head = v;
    else if (f == "--classes") classes = to_int(f, v, 1);
    else usage("unknown flag " + f);
  }
  rd::BackendOptions o;
  if (precision == "fp32") o.precision = rd::Precision::FP32;
  else if (precision == "tf32") o.precision = rd::Precision::TF32;
  else if (precision == "fp16") o.precision = rd::Precision::FP16;
  else if (precision == "bf16") o.precision = rd::Precision::BF16;
  else usage("--precision '" + precision + "': expected fp32, tf32, fp16 or bf16");
  if (layout == "nhwc") o.layout = rd::Layout::NHWC;
  else if (layout == "nchw") o.layout = rd::Layout::NCHW;
  else usage("--layout '" + layout + "': expected nhwc or nchw");
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
    cfg.head = rd::parse_head(head);
    cfg.num_classes = classes;
    rd::ResNet model(be, cfg);
    model.init_parameters(1);
    model.train(true);
    const size_t P = model.params().size();
    auto m = be.allocate(P * sizeof(float)), v = be.allocate(P * sizeof(float));
    std::vector<uint8_t> images(static_cast<size_t>(batch) * size * size * 3);
    std::mt19937 rng(7);
    for (auto& px : images) px = static_cast<uint8_t>(rng() & 255);
    std::vector<int32_t> labels(static_cast<size_t>(batch));
    for (int i = 0; i < batch; ++i) labels[static_cast<size_t>(i)] = i % classes;
    const float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};
    rd::Tensor dlogits = be.matrix(batch, classes);
    const float loss_scale = precision == "fp16" ? 1024.f : 1.f;
    int64_t adam_steps = 0, skipped = 0;
    double last_loss = 0.0;
    auto step = [&]() {
      rd::Tensor& input = model.input_buffer(batch, size, size);
      be.images_u8_to_activation(images.data(), input, mean, stdv);
      const rd::Tensor& logits = model.forward(input);
      last_loss = be.softmax_xent(logits, labels.data(), 0.1f, loss_scale, &dlogits, nullptr) / batch;
      model.backward(dlogits, false);
      float* g = model.grads().data();
      if (!be.unscale_and_check(g, 1.f / loss_scale, P)) {
        ++skipped;  // overflow: PyTorch's GradScaler would skip the step too
        return;
      }
      be.adam_step(model.params().data(), g, static_cast<float*>(m.get()), static_cast<float*>(v.get()), P,
                   rd::math::AdamArgs{.lr = 1e-4f, .step = ++adam_steps});
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
                static_cast<double>(be.workspace_bytes()) / 1048576.0, static_cast<long long>(skipped),
                last_loss);
  } catch (const rd::Error& e) {
    std::fprintf(stderr, "gpu_train_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
