// One training step (forward + backward + Adam lr 1e-4, label-smoothed 0.1
// cross-entropy) of rd::ResNet on the CPU backend, timed as the median of a few
// steps after warm-up — the same step bench/pytorch_train_step.py times in
// PyTorch, so bench/train_step_vs_pytorch.sh can print the ratio.
//
//   train_step_bench [--config ARCH:SIZE:BATCH]... [--threads T] [--steps N]
//                    [--warmup N] [--head fc|mlp] [--num-classes K] [--layout nchw16c|nchw8c|nhwc|nchw]
//   train_step_bench --print-isa      (the CPU backend's ISA, defaults and bf16 support)
//
// Prints one JSON object (same keys as the PyTorch script) on stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "bench_step.h"
#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/backend/cpu_isa.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"

namespace {

using BenchConfig = rd::bench::ModelConfig;

struct Options : rd::bench::StepOptions {  // warm-up 1, 3 timed steps
  std::vector<BenchConfig> configs;
  rd::HeadKind head = rd::HeadKind::Mlp;
  int num_classes = 3;
};

Options parse_args(int argc, char** argv) {
  Options o;
  rd::FlagSet fs("", "train_step_bench");
  fs.custom("--config", "ARCH:SIZE:BATCH", "model, image size and batch (repeatable) [default: resnet34:244:16 resnet18:64:32]",
            [&](const std::string& v) { o.configs.push_back(rd::bench::parse_config(v)); });
  fs.enumeration("--head", &o.head, rd::head_names(), "classifier head");
  fs.integer("--num-classes", &o.num_classes, 1, "number of classes", 1000000);
  rd::bench::parse_step_flags(fs, o, argc, argv, "train_step_bench",
                              "usage: train_step_bench [flags]\n       train_step_bench --print-isa\n\nFlags:\n");
  if (o.configs.empty()) o.configs = {{"resnet34", 244, 16}, {"resnet18", 64, 32}};
  return o;
}

// Multiply-adds of one forward pass through torchvision's ResNet (convolutions and
// linear layers; BN, ReLU, pooling and adds are memory-bound and not counted).
double forward_macs(const std::string& arch, int64_t h, int64_t w, rd::HeadKind head, int classes) {
  double macs = 0;
  int64_t c = 3;
  auto conv = [&](int64_t out_c, int k, int stride, int pad) {
    h = rd::conv_out_size(h, k, stride, pad);
    w = rd::conv_out_size(w, k, stride, pad);
    macs += static_cast<double>(h * w) * static_cast<double>(out_c * c * k * k);
    c = out_c;
  };
  conv(64, 7, 2, 3);
  h = rd::conv_out_size(h, 3, 2, 1);
  w = rd::conv_out_size(w, 3, 2, 1);
  const bool bottleneck = arch == "resnet50";
  const std::vector<int> blocks = arch == "resnet18" ? std::vector<int>{2, 2, 2, 2} : std::vector<int>{3, 4, 6, 3};
  const int64_t widths[4] = {64, 128, 256, 512};
  for (int layer = 0; layer < 4; ++layer) {
    for (int b = 0; b < blocks[static_cast<size_t>(layer)]; ++b) {
      const int stride = (layer > 0 && b == 0) ? 2 : 1;
      const int64_t width = widths[layer];
      const int64_t out_c = bottleneck ? 4 * width : width;
      const int64_t in_c = c, in_h = h, in_w = w;
      if (bottleneck) {
        conv(width, 1, 1, 0);
        conv(width, 3, stride, 1);
        conv(out_c, 1, 1, 0);
      } else {
        conv(width, 3, stride, 1);
        conv(width, 3, 1, 1);
      }
      if (stride != 1 || in_c != out_c) {  // downsample: 1x1 conv with the block's stride
        const int64_t dh = rd::conv_out_size(in_h, 1, stride, 0), dw = rd::conv_out_size(in_w, 1, stride, 0);
        macs += static_cast<double>(dh * dw) * static_cast<double>(out_c * in_c);
      }
    }
  }
  if (head == rd::HeadKind::Mlp) macs += static_cast<double>(c * c);
  macs += static_cast<double>(c * classes);
  return macs;
}

std::string json_result(const BenchConfig& c, const Options& o, const std::vector<double>& times,
                        double step_gflop) {
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"arch\": \"%s\", \"image_size\": %d, \"batch\": %d, \"head\": \"%s\", "
                "\"num_classes\": %d, \"steps\": %d, \"warmup\": %d, \"step_ms_median\": %.2f, "
                "\"step_ms_min\": %.2f, \"step_ms_max\": %.2f, \"img_per_s\": %.3f, \"gflop_per_step\": %.3f, \"gflops\": %.2f}",
                c.arch.c_str(), c.size, c.batch, rd::head_name(o.head), o.num_classes, o.steps, o.warmup,
                median * 1e3, sorted.front() * 1e3, sorted.back() * 1e3, c.batch / median, step_gflop, step_gflop / median);
  return buf;
}

std::string run_config(rd::Backend& backend, const BenchConfig& c, const Options& o) {
  rd::bench::TrainStep step(backend, c.arch, o.head, o.num_classes, c.batch, c.size, o.optimizer);
  for (int i = 0; i < o.warmup; ++i) step();
  std::vector<double> times;
  for (int i = 0; i < o.steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // Training step = forward + backward (data and weight gradients, about 2x forward).
  const double step_gflop = 3.0 * 2.0 * c.batch * forward_macs(c.arch, c.size, c.size, o.head, o.num_classes) / 1e9;
  return json_result(c, o, times, step_gflop);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--print-isa") {
    // What the CPU backend runs natively here (after any DNNL_MAX_CPU_ISA cap): run_bench.sh
    // asks before timing bf16.
    const rd::CpuIsaDefaults d = rd::cpu_isa_defaults();
    std::printf("isa=%s avx512=%d bf16=%d fp32_layout=%s\n", d.isa.c_str(), d.avx512, d.bf16,
                rd::layout_name(d.fp32_layout));
    return 0;
  }
  const Options o = parse_args(argc, argv);
  try {
    rd::BackendOptions bo;
    bo.threads = o.threads;
    bo.precision = o.bf16 ? rd::Precision::BF16 : rd::Precision::FP32;
    bo.layout = o.layout;  // unset: the CPU backend's default for this ISA and precision
    bo.conv_algo = o.conv_algo;
    auto backend = rd::make_cpu_backend(bo);
    std::string results;
    for (const BenchConfig& c : o.configs) {
      if (!results.empty()) results += ", ";
      results += run_config(*backend, c, o);
    }
    std::printf("{\"framework\": \"resnet_ddp\", \"version\": \"%s\", \"backend\": \"%s\", \"threads\": %d, "
                "\"precision\": \"%s\", \"layout\": \"%s\", \"results\": [%s]}\n",
                RESNET_DDP_VERSION, backend->name().c_str(), o.threads, o.bf16 ? "bf16" : "fp32",
                rd::layout_name(backend->activation_layout()),
                results.c_str());
  } catch (const rd::UsageError& e) {
    std::fprintf(stderr, "train_step_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_step_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
