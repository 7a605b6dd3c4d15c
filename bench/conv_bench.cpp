// Convolution benchmark: forward, backward-data and backward-weights of the CPU
// backend, per shape and algorithm, in ms and GFLOP/s (2 * MACs). The default shapes
// are ResNet-34 @244, batch 16's 3x3 stride-1 convolutions, one per stage; on an AVX2
// CPU (or under DNNL_MAX_CPU_ISA=AVX2) `auto` runs our Winograd F(2x2,3x3) kernels
// and `direct` oneDNN's direct kernels, so the two rows compare them. `own2` and
// `own4` call the backend's own AVX2 Winograd F(2x2,3x3) and F(4x4,3x3) kernels
// directly on nChw8c buffers (whatever the backend would choose), so one run
// compares the three candidates for each shape on an AVX2 CPU.
//
//   conv_bench [--shape N:C:H:W:K]... [--algo auto|direct|winograd|own2|own4]... [--reps R] [--threads T]
#include <algorithm>
#include <array>
#include <cstdint>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/winograd_f2x3.h"
#include "bench_args.h"
#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/backend/cpu_isa.h"
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

// A candidate: a backend algorithm, or (own_tile 2 or 4) the own Winograd kernels.
struct Candidate {
  ConvAlgo algo = ConvAlgo::Auto;
  int own_tile = 0;
};

template <class Fwd, class BwdData, class BwdWeights>
std::array<double, 3> time_passes(int reps, Fwd fwd, BwdData bwd_data, BwdWeights bwd_weights) {
  using clock = std::chrono::steady_clock;
  std::vector<double> t[3];
  for (int r = 0; r <= reps; ++r) {  // the first round warms up (plans, JIT, pages)
    const auto a = clock::now();
    fwd();
    const auto b = clock::now();
    bwd_data();
    const auto c = clock::now();
    bwd_weights();
    const auto d = clock::now();
    if (r == 0) continue;
    t[0].push_back(std::chrono::duration<double, std::milli>(b - a).count());
    t[1].push_back(std::chrono::duration<double, std::milli>(c - b).count());
    t[2].push_back(std::chrono::duration<double, std::milli>(d - c).count());
  }
  return {median(t[0]), median(t[1]), median(t[2])};
}

std::array<double, 3> time_own(const ConvShape& s, int tile, int reps, int threads) {
  namespace wino = rd::cpu::winograd;
  wino::Geometry g{s.n, s.c, s.k, s.h, s.w};
  g.tile = tile;
  if (!wino::cpu_supported() || !wino::shape_supported(g)) return {-1, -1, -1};
  std::vector<float> x(static_cast<size_t>(s.n * s.c * s.h * s.w), 0.5f), dx(x.size());
  std::vector<float> dy(static_cast<size_t>(s.n * s.k * s.h * s.w), 0.25f), y(dy.size());
  std::vector<float> w(static_cast<size_t>(s.k * s.c * 9), 0.01f), dw(w.size());
  std::vector<float> ws(wino::workspace_bytes(g, threads) / sizeof(float) + 16);
  void* wsp = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.data()) + 63) / 64 * 64);
  return time_passes(
      reps, [&] { wino::forward(g, x.data(), w.data(), y.data(), wsp, threads); },
      [&] { wino::backward_data(g, dy.data(), w.data(), dx.data(), wsp, threads); },
      [&] { wino::backward_weights(g, x.data(), dy.data(), dw.data(), false, wsp, threads); });
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<ConvShape> shapes;
  std::vector<Candidate> algos;
  int reps = 5, threads = 0;
  FlagSet fs("", "conv_bench");
  fs.custom("--shape", "N:C:H:W:K", "a 3x3 stride-1 pad-1 convolution (repeatable) [default: ResNet-34@244 bs16's four stages]",
            [&](const std::string& v) { shapes.push_back(parse_shape(v)); });
  fs.custom("--algo", "auto|direct|winograd|own2|own4", "algorithm (repeatable) [default: auto and direct]",
            [&](const std::string& v) {
              if (v == "own2" || v == "own4") return algos.push_back({ConvAlgo::Auto, v == "own2" ? 2 : 4});
              for (const auto& [name, a] : conv_algo_names())
                if (name == v) return algos.push_back({a, 0});
              throw UsageError("--algo '" + v + "': expected auto, direct, winograd, own2 or own4");
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
  if (algos.empty()) algos = {{ConvAlgo::Auto, 0}, {ConvAlgo::Direct, 0}};
  threads = bench::resolve_threads(threads);

  const ConvGeometry g{3, 1, 1};
  std::printf("| shape (N:C:H:W:K) | algo | backend | fwd ms | bwd-data ms | bwd-weights ms | total ms | GFLOP/s |\n");
  std::printf("|---|---|---|---:|---:|---:|---:|---:|\n");
  for (const ConvShape& s : shapes) {
    for (const Candidate& cand : algos) {
      std::array<double, 3> t{};
      std::string name, backend;
      if (cand.own_tile) {
        t = time_own(s, cand.own_tile, reps, threads);
        name = cand.own_tile == 2 ? "own2" : "own4";
        backend = cand.own_tile == 2 ? "own Winograd F(2x2,3x3), nChw8c" : "own Winograd F(4x4,3x3), nChw8c";
        if (t[0] < 0) {
          std::printf("| %lld:%lld:%lld:%lld:%lld | %s | not supported on this CPU or shape | | | | | |\n",
                      static_cast<long long>(s.n), static_cast<long long>(s.c), static_cast<long long>(s.h),
                      static_cast<long long>(s.w), static_cast<long long>(s.k), name.c_str());
          continue;
        }
      } else {
        BackendOptions opts;
        opts.threads = threads;
        opts.conv_algo = cand.algo;
        opts.layout = cpu_isa_defaults().fp32_layout;  // the trainer's fp32 layout on this CPU
        auto be = make_cpu_backend(opts);
        Tensor x = be->activation(s.n, s.c, s.h, s.w), y = be->activation(s.n, s.k, s.h, s.w);
        Tensor dx = be->activation(s.n, s.c, s.h, s.w), dy = be->activation(s.n, s.k, s.h, s.w);
        Tensor w = be->tensor(Shape{s.k, s.c, 3, 3}, Layout::RowMajor);
        Tensor dw = be->tensor(Shape{s.k, s.c, 3, 3}, Layout::RowMajor);
        be->fill(static_cast<float*>(x.data), 0.5f, static_cast<size_t>(x.numel()));
        be->fill(static_cast<float*>(dy.data), 0.25f, static_cast<size_t>(dy.numel()));
        be->fill(static_cast<float*>(w.data), 0.01f, static_cast<size_t>(w.numel()));
        t = time_passes(
            reps, [&] { be->conv2d_forward(x, w, y, g); }, [&] { be->conv2d_backward_data(dy, w, dx, g); },
            [&] { be->conv2d_backward_weights(x, dy, dw, g, false); });
        name = name_of(conv_algo_names(), cand.algo);
        backend = be->name();
      }
      const double f = t[0], bd = t[1], bw = t[2], total = f + bd + bw;
      const double gflop = 3 * 2.0 * s.n * s.k * s.h * s.w * s.c * 9 / 1e9;
      std::printf("| %lld:%lld:%lld:%lld:%lld | %s | %s | %.2f | %.2f | %.2f | %.2f | %.1f |\n",
                  static_cast<long long>(s.n), static_cast<long long>(s.c), static_cast<long long>(s.h),
                  static_cast<long long>(s.w), static_cast<long long>(s.k), name.c_str(), backend.c_str(), f, bd,
                  bw, total, gflop / (total / 1e3));
    }
  }
  return 0;
}
