// Command-line pieces the step benchmarks share (train_step_bench, op_profile_bench):
// the flags both take, added to each program's FlagSet, so both accept exactly the
// same values and defaults.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <string>
#include <thread>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/backend/names.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/flags.h"

namespace rd::bench {

struct ModelConfig {
  std::string arch;
  int size = 0;
  int batch = 0;
};

// --config ARCH:SIZE:BATCH, e.g. resnet34:244:16.
inline ModelConfig parse_config(const std::string& text) {
  const std::string bad = "--config '" + text + "': ";
  const size_t a = text.find(':');
  const size_t b = a == std::string::npos ? a : text.find(':', a + 1);
  if (b == std::string::npos) throw UsageError(bad + "expected ARCH:SIZE:BATCH, e.g. resnet34:244:16");
  ModelConfig c;
  c.arch = text.substr(0, a);
  const char* models[] = {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "wide_resnet50_2",
                          "resnext50_32x4d"};  // torchvision's names (pytorch_train_step.py builds the same)
  if (std::find(std::begin(models), std::end(models), c.arch) == std::end(models))
    throw UsageError(bad + "arch must be resnet18, resnet34, resnet50, resnet101, resnet152, wide_resnet50_2 or "
                           "resnext50_32x4d");
  auto number = [&](const std::string& s, int min) {
    char* end = nullptr;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v < min || v > 1000000)
      throw UsageError(bad + "'" + s + "' is not an integer >= " + std::to_string(min));
    return static_cast<int>(v);
  };
  c.size = number(text.substr(a + 1, b - a - 1), 32);
  c.batch = number(text.substr(b + 1), 1);
  return c;
}

// The flags both step benchmarks take; each program's Options derives from this.
struct StepOptions {
  int threads = 0;  // 0 = OMP_NUM_THREADS, else every core
  int warmup = 1;
  int steps = 3;
  bool bf16 = false;  // --precision fp32|bf16, the CPU backend's two modes
  ConvAlgo conv_algo = ConvAlgo::Auto;
  std::optional<Layout> layout;  // default: the trainer's for the precision
  std::string optimizer = "adam";  // adam: the tutorial's; sgd: torchvision's recipe (per-tensor decay)
};

// --threads N: N when > 0, else OMP_NUM_THREADS, else every core.
inline int resolve_threads(int threads) {
  if (threads > 0) return threads;
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env && *env) return std::max(1, std::atoi(env));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Parses argv with the shared flags plus the program's own in `fs`: --help prints
// `usage` and every flag and exits 0; a bad flag is named on stderr, exit status 2.
inline void parse_step_flags(FlagSet& fs, StepOptions& o, int argc, char** argv, const char* program,
                             const std::string& usage) {
  std::string layout;
  fs.integer("--threads", &o.threads, 0, "compute threads (0 = OMP_NUM_THREADS, else every core)", 1000000);
  fs.integer("--warmup", &o.warmup, 0, "untimed steps first", 1000000);
  fs.integer("--steps", &o.steps, 1, "timed steps", 1000000);
  fs.enumeration("--precision", &o.bf16, {{"fp32", false}, {"bf16", true}}, "compute precision");
  fs.enumeration("--conv-algo", &o.conv_algo, conv_algo_names(), "CPU 3x3 convolution algorithm");
  fs.choice("--optimizer", &o.optimizer, {"adam", "sgd"},
            "adam: the tutorial's (lr 1e-4); sgd: torchvision's recipe (momentum 0.9, weight decay 1e-4, "
            "none on batch norm: the per-tensor update)");
  fs.choice("--layout", &layout, {"nchw16c", "nchw8c", "nhwc", "nchw"}, "activation layout [default: the trainer's]");
  try {
    fs.parse_or_help(argc, argv, usage);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    std::exit(2);
  }
  for (const auto& [name, value] : layout_names())
    if (name == layout) o.layout = value;
  o.threads = resolve_threads(o.threads);
}

}  // namespace rd::bench
