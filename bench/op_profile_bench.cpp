// Per-op-type time split of one training step (forward + backward + the optimizer, Adam
// lr 1e-4 or with --optimizer sgd torchvision's SGD recipe; label-smoothed 0.1
// cross-entropy, reference Linear-ReLU-Linear head, 3 classes) of
// rd::ResNet on the CPU backend: every Backend call is timed (wall clock around the
// call; the CPU backend is synchronous, so that is the op's time) and summed per
// category over N steps after warm-up. bench/pytorch_op_profile.py splits PyTorch's
// step into the same categories; bench/op_profile.sh prints both side by side.
//
//   op_profile_bench --config ARCH:SIZE:BATCH [--threads T] [--steps N] [--warmup N]
//                    [--precision fp32|bf16] [--conv-algo auto|direct|winograd]
//                    [--layout nchw16c|nchw8c|nhwc|nchw] [--json PATH]   (defaults: the trainer's)
//
// Prints a table (ms/step, %, calls/step per category) on stdout; --json also writes
// it as JSON. "outside backend calls" is the step's wall time not spent in any
// Backend call (the model's own code between ops).
#include <algorithm>
#include <array>
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
#include "backend/forwarding_backend.h"
#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"

namespace {

using Clock = std::chrono::steady_clock;

// Categories shared with bench/pytorch_op_profile.py (same keys, same order). The
// first fifteen are the `kind` column of the op list (resnet_ddp/backend/ops.def).
enum Category : int {
  conv_fwd, conv_bwd_data, conv_bwd_weights, bn_fwd, bn_bwd, eltwise_fwd, eltwise_bwd, pool_fwd, pool_bwd,
  linear_fwd, linear_bwd, loss, optimizer, copy, other, outside, kNumCategories
};
constexpr std::array<const char*, kNumCategories> kKeys = {
    "conv_fwd", "conv_bwd_data", "conv_bwd_weights", "bn_fwd", "bn_bwd", "eltwise_fwd", "eltwise_bwd",
    "pool_fwd", "pool_bwd", "linear_fwd", "linear_bwd", "loss", "optimizer", "copy", "other", "outside"};
constexpr std::array<const char*, kNumCategories> kNames = {
    "conv forward", "conv backward-data", "conv backward-weights", "batch norm forward (+ReLU)",
    "batch norm backward (+ReLU)", "relu / add(+relu) forward", "relu / add backward, grad accumulate",
    "pooling forward (max, avg)", "pooling backward", "linear forward", "linear backward",
    "loss (softmax xent, fwd+bwd)", "optimizer", "layout conversions / copies / fills",
    "other backend calls", "outside backend calls"};

// Each op's category, in BackendOp order.
constexpr Category kCategoryOf[] = {
#define RD_BACKEND_OP(name, ret, params, args, kind) kind,
#define RD_BACKEND_VIRTUAL(name, ret, params, args, kind) kind,
#include "resnet_ddp/backend/ops.def"
};
static_assert(std::size(kCategoryOf) == static_cast<size_t>(rd::BackendOp::count_));

Category category_of(rd::BackendOp op) { return kCategoryOf[static_cast<size_t>(op)]; }

// Times every operation of the inner backend while `enabled`.
class ProfilingBackend final : public rd::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  static constexpr size_t kOps = static_cast<size_t>(rd::BackendOp::count_);

  bool enabled = false;
  std::array<double, kOps> seconds{};
  std::array<int64_t, kOps> calls{};

 protected:
  // Backend calls do not nest (the inner backend calls itself directly), so one start time suffices.
  void on_enter(rd::BackendOp) override { start_ = Clock::now(); }
  void on_exit(rd::BackendOp op) override {
    if (!enabled) return;
    const auto i = static_cast<size_t>(op);
    seconds[i] += std::chrono::duration<double>(Clock::now() - start_).count();
    ++calls[i];
  }

 private:
  Clock::time_point start_;
};

struct Options : rd::bench::StepOptions {
  Options() {
    warmup = 2;
    steps = 5;
  }
  std::string arch;
  int size = 0;
  int batch = 0;
  std::string json_path;
};

Options parse_args(int argc, char** argv) {
  Options o;
  bool have_config = false;
  rd::FlagSet fs("", "op_profile_bench");
  fs.custom("--config", "ARCH:SIZE:BATCH", "model, image size and batch, e.g. resnet34:244:16 (required)",
            [&](const std::string& v) {
              const rd::bench::ModelConfig c = rd::bench::parse_config(v);
              o.arch = c.arch;
              o.size = c.size;
              o.batch = c.batch;
              have_config = true;
            });
  fs.path("--json", &o.json_path, "PATH", "also write the profile as JSON");
  rd::bench::parse_step_flags(fs, o, argc, argv, "op_profile_bench",
                              "usage: op_profile_bench --config ARCH:SIZE:BATCH [flags]\n\nFlags:\n");
  if (!have_config) {
    std::fprintf(stderr, "op_profile_bench: --config ARCH:SIZE:BATCH is required (see --help)\n");
    std::exit(2);
  }
  return o;
}

struct Profile {
  std::array<double, kNumCategories> ms{};     // per step
  std::array<double, kNumCategories> calls{};  // per step
  double step_ms = 0;                          // mean wall time of a step
  double step_ms_min = 0;
  std::string backend_name;
};

Profile run(const Options& o) {
  rd::BackendOptions bo;
  bo.threads = o.threads;
  bo.precision = o.bf16 ? rd::Precision::BF16 : rd::Precision::FP32;
  bo.conv_algo = o.conv_algo;
  bo.layout = o.layout;  // unset: the CPU backend's default for this ISA and precision (the trainer's)
  auto cpu = rd::make_cpu_backend(bo);
  ProfilingBackend backend(*cpu);

  rd::bench::TrainStep step(backend, o.arch, rd::HeadKind::Mlp, 3, o.batch, o.size, o.optimizer);
  for (int i = 0; i < o.warmup; ++i) step();

  backend.enabled = true;
  double total = 0, best = 1e300;
  for (int i = 0; i < o.steps; ++i) {
    const auto t0 = Clock::now();
    step();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    total += s;
    best = std::min(best, s);
  }
  backend.enabled = false;

  Profile p;
  p.backend_name = backend.name();
  double in_ops = 0;
  for (size_t i = 0; i < ProfilingBackend::kOps; ++i) {
    const Category c = category_of(static_cast<rd::BackendOp>(i));
    p.ms[c] += backend.seconds[i] * 1e3 / o.steps;
    p.calls[c] += static_cast<double>(backend.calls[i]) / o.steps;
    in_ops += backend.seconds[i];
  }
  p.ms[outside] = (total - in_ops) * 1e3 / o.steps;
  p.step_ms = total * 1e3 / o.steps;
  p.step_ms_min = best * 1e3;
  return p;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out;
}

void write_json(const Options& o, const Profile& p) {
  std::FILE* f = std::fopen(o.json_path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "op_profile_bench: --json '%s': cannot open for writing\n", o.json_path.c_str());
    std::exit(1);
  }
  std::fprintf(f,
               "{\"framework\": \"resnet_ddp\", \"version\": \"%s\", \"backend\": \"%s\", \"arch\": \"%s\", "
               "\"image_size\": %d, \"batch\": %d, \"threads\": %d, \"precision\": \"%s\", \"steps\": %d, "
               "\"warmup\": %d, \"step_ms\": %.3f, \"step_ms_min\": %.3f, \"categories\": [",
               RESNET_DDP_VERSION, json_escape(p.backend_name).c_str(), o.arch.c_str(), o.size, o.batch, o.threads,
               o.bf16 ? "bf16" : "fp32", o.steps, o.warmup, p.step_ms, p.step_ms_min);
  for (int c = 0; c < kNumCategories; ++c)
    std::fprintf(f, "%s{\"key\": \"%s\", \"name\": \"%s\", \"ms\": %.3f, \"calls\": %.1f}", c ? ", " : "", kKeys[c],
                 kNames[c], p.ms[c], p.calls[c]);
  std::fprintf(f, "]}\n");
  if (std::fclose(f) != 0) {
    std::fprintf(stderr, "op_profile_bench: --json '%s': write failed\n", o.json_path.c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  try {
    const Profile p = run(o);
    std::printf("resnet_ddp %s %s:%d:%d, %d threads, %s: %.1f ms/step (mean of %d, best %.1f) on %s\n",
                RESNET_DDP_VERSION, o.arch.c_str(), o.size, o.batch, o.threads, o.bf16 ? "bf16" : "fp32", p.step_ms,
                o.steps, p.step_ms_min, p.backend_name.c_str());
    std::printf("%-40s %10s %6s %8s\n", "category", "ms/step", "%", "calls");
    for (int c = 0; c < kNumCategories; ++c)
      std::printf("%-40s %10.2f %5.1f%% %8.1f\n", kNames[c], p.ms[c], 100.0 * p.ms[c] / p.step_ms, p.calls[c]);
    if (!o.json_path.empty()) write_json(o, p);
  } catch (const rd::UsageError& e) {
    std::fprintf(stderr, "op_profile_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "op_profile_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
