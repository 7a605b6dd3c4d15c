// Convolution benchmark: forward, backward-data and backward-weights of the CPU
// backend, per shape and algorithm, in ms and GFLOP/s (2 * MACs). The default shapes
// are ResNet-34 @244, batch 16's 3x3 stride-1 convolutions, one per stage; on an AVX2
// CPU (or under DNNL_MAX_CPU_ISA=AVX2) `auto` runs our Winograd F(2x2,3x3) kernels
// and `direct` oneDNN's direct kernels, so the two rows compare them.
//
//   conv_bench [--shape N:C:H:W:K]... [--algo auto|direct|winograd]... [--reps R] [--threads T]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_args.h"
#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/backend/names.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/flags.h"

using namespace rd;

namespace {

struct ConvShape {
  int64_t n, c, h, w, k;
};

ConvShape parse_shape(const std::string& text) {
  ConvShape s{};
  int64_t* fields[] = {&s.n, &s.c, &s.h, &s.w, &s.k};
  size_t pos = 0;
  for (int i = 0; i < 5; ++i) {
    const size_t end = i < 4 ? text.find(':', pos) : text.size();
    if (end == std::string::npos) throw UsageError("--shape '" + text + "': expected N:C:H:W:K, e.g. 16:64:61:61:64");
    const std::string part = text.substr(pos, end - pos);
    char* stop = nullptr;
    const long long v = std::strtoll(part.c_str(), &stop, 10);
    if (part.empty() || *stop != '\0' || v < 1 || v > 100000)
      throw UsageError("--shape '" + text + "': '" + part + "' is not an integer in 1..100000");
    *fields[i] = v;
    pos = end + 1;
  }
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<ConvShape> shapes;
  std::vector<ConvAlgo> algos;
  int reps = 5, threads = 0;
  FlagSet fs("", "conv_bench");
  fs.custom("--shape", "N:C:H:W:K", "a 3x3 stride-1 pad-1 convolution (repeatable) [default: ResNet-34@244 bs16's four stages]",
            [&](const std::string& v) { shapes.push_back(parse_shape(v)); });
  fs.custom("--algo", "auto|direct|winograd", "algorithm (repeatable) [default: auto and direct]",
            [&](const std::string& v) {
              for (const auto& [name, a] : conv_algo_names())
                if (name == v) return algos.push_back(a);
              throw UsageError("--algo '" + v + "': expected auto, direct or winograd");
            });
  fs.integer("--reps", &reps, 1, "timed repetitions of each pass (median reported)", 10000);
  fs.integer("--threads", &threads, 0, "compute threads (0 = OMP_NUM_THREADS, else every core)", 1000000);
  try {
    fs.parse_or_help(argc, argv, "usage: conv_bench [flags]");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "conv_bench: %s\n", e.what());
    return 2;
  }
  if (shapes.empty()) shapes = {{16, 64, 61, 61, 64}, {16, 128, 31, 31, 128}, {16, 256, 16, 16, 256}, {16, 512, 8, 8, 512}};
  if (algos.empty()) algos = {ConvAlgo::Auto, ConvAlgo::Direct};
  threads = bench::resolve_threads(threads);

  const ConvGeometry g{3, 1, 1};
  std::printf("| shape (N:C:H:W:K) | algo | backend | fwd ms | bwd-data ms | bwd-weights ms | total ms | GFLOP/s |\n");
  std::printf("|---|---|---|---:|---:|---:|---:|---:|\n");
  for (const ConvShape& s : shapes) {
    for (ConvAlgo algo : algos) {
      BackendOptions opts;
      opts.threads = threads;
      opts.conv_algo = algo;
      opts.layout = cpu_isa_defaults().fp32_layout;  // the trainer's fp32 layout on this CPU
      auto be = make_cpu_backend(opts);
      Tensor x = be->activation(s.n, s.c, s.h, s.w), y = be->activation(s.n, s.k, s.h, s.w);
      Tensor dx = be->activation(s.n, s.c, s.h, s.w), dy = be->activation(s.n, s.k, s.h, s.w);
      Tensor w = be->tensor(Shape{s.k, s.c, 3, 3}, Layout::RowMajor);
      Tensor dw = be->tensor(Shape{s.k, s.c, 3, 3}, Layout::RowMajor);
      be->fill(static_cast<float*>(x.data), 0.5f, static_cast<size_t>(x.numel()));
      be->fill(static_cast<float*>(dy.data), 0.25f, static_cast<size_t>(dy.numel()));
      be->fill(static_cast<float*>(w.data), 0.01f, static_cast<size_t>(w.numel()));
      using clock = std::chrono::steady_clock;
      std::vector<double> t[3];
      for (int r = 0; r <= reps; ++r) {  // the first round warms up (plans, JIT, pages)
        const auto a = clock::now();
        be->conv2d_forward(x, w, y, g);
        const auto b = clock::now();
        be->conv2d_backward_data(dy, w, dx, g);
        const auto c = clock::now();
        be->conv2d_backward_weights(x, dy, dw, g, false);
        const auto d = clock::now();
        if (r == 0) continue;
        t[0].push_back(std::chrono::duration<double, std::milli>(b - a).count());
        t[1].push_back(std::chrono::duration<double, std::milli>(c - b).count());
        t[2].push_back(std::chrono::duration<double, std::milli>(d - c).count());
      }
      const double f = median(t[0]), bd = median(t[1]), bw = median(t[2]), total = f + bd + bw;
      const double gflop = 3 * 2.0 * s.n * s.k * s.h * s.w * s.c * 9 / 1e9;
      const std::string name = name_of(conv_algo_names(), algo);
      std::printf("| %lld:%lld:%lld:%lld:%lld | %s | %s | %.2f | %.2f | %.2f | %.2f | %.1f |\n",
                  static_cast<long long>(s.n), static_cast<long long>(s.c), static_cast<long long>(s.h),
                  static_cast<long long>(s.w), static_cast<long long>(s.k), name.c_str(), be->name().c_str(), f, bd,
                  bw, total, gflop / (total / 1e3));
    }
  }
  return 0;
}
