// Command-line pieces the step benchmarks share (train_step_bench, op_profile_bench):
// one parser per flag, so both accept exactly the same values and defaults.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "resnet_ddp/backend/backend.h"

namespace rd::bench {

struct ModelConfig {
  std::string arch;
  int size = 0;
  int batch = 0;
};

// Set by each program: its name and where its usage is documented.
inline const char*& program_name() {
  static const char* name = "bench";
  return name;
}

[[noreturn]] inline void usage_error(const std::string& msg) {
  std::fprintf(stderr, "%s: %s\n(see --help)\n", program_name(), msg.c_str());
  std::exit(2);
}

inline int parse_int(const std::string& flag, const std::string& text, int min_value) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < min_value || v > 1000000)
    usage_error(flag + " '" + text + "': expected an integer >= " + std::to_string(min_value));
  return static_cast<int>(v);
}

inline ModelConfig parse_config(const std::string& text) {
  const size_t a = text.find(':');
  const size_t b = a == std::string::npos ? a : text.find(':', a + 1);
  if (b == std::string::npos) usage_error("--config '" + text + "': expected ARCH:SIZE:BATCH, e.g. resnet34:244:16");
  ModelConfig c;
  c.arch = text.substr(0, a);
  if (c.arch != "resnet18" && c.arch != "resnet34" && c.arch != "resnet50")
    usage_error("--config '" + text + "': arch must be resnet18, resnet34 or resnet50");
  c.size = parse_int("--config size", text.substr(a + 1, b - a - 1), 32);
  c.batch = parse_int("--config batch", text.substr(b + 1), 1);
  return c;
}

// --precision fp32|bf16 (the CPU backend's two modes); true = bf16.
inline bool parse_bf16(const std::string& value) {
  if (value == "fp32") return false;
  if (value == "bf16") return true;
  usage_error("--precision '" + value + "': expected fp32 or bf16");
}

inline ConvAlgo parse_conv_algo(const std::string& value) {
  if (value == "auto") return ConvAlgo::Auto;
  if (value == "direct") return ConvAlgo::Direct;
  if (value == "winograd") return ConvAlgo::Winograd;
  usage_error("--conv-algo '" + value + "': expected auto, direct or winograd");
}

inline Layout parse_layout(const std::string& value) {
  if (value == "nchw16c") return Layout::NCHW16C;
  if (value == "nhwc") return Layout::NHWC;
  if (value == "nchw") return Layout::NCHW;
  usage_error("--layout '" + value + "': expected nchw16c, nhwc or nchw");
}

// The flags both step benchmarks take; each program's Options derives from this.
struct StepOptions {
  int threads = 0;  // 0 = OMP_NUM_THREADS, else every core
  int warmup = 1;
  int steps = 3;
  bool bf16 = false;
  ConvAlgo conv_algo = ConvAlgo::Auto;
  std::optional<Layout> layout;  // default: the trainer's for the precision
};

// Walks the --flag VALUE pairs: -h/--help prints `help` and exits 0; a flag without a
// value, or one neither StepOptions nor `handle(flag, value)` (returning false)
// knows, is a usage error.
template <class Handle>
void parse_flags(int argc, char** argv, const char* help, StepOptions& o, Handle handle) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::fputs(help, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) usage_error("flag " + flag + " needs a value (or is unknown)");
    const std::string value = argv[++i];
    if (flag == "--threads") o.threads = parse_int(flag, value, 0);
    else if (flag == "--warmup") o.warmup = parse_int(flag, value, 0);
    else if (flag == "--steps") o.steps = parse_int(flag, value, 1);
    else if (flag == "--precision") o.bf16 = parse_bf16(value);
    else if (flag == "--conv-algo") o.conv_algo = parse_conv_algo(value);
    else if (flag == "--layout") o.layout = parse_layout(value);
    else if (!handle(flag, value)) usage_error("unknown flag " + flag);
  }
}

// --threads 0 = OMP_NUM_THREADS, else every core.
inline int resolve_threads(int threads) {
  if (threads > 0) return threads;
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env && *env) return parse_int("OMP_NUM_THREADS", env, 1);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace rd::bench
