// The AVX2 Winograd F(2x2, 3x3) and F(4x4, 3x3) kernels (src/backend/cpu/winograd_f2x3.h)
// called directly on nChw8c data, against the float64 reference: forward,
// backward-data, backward-weights (overwrite and accumulate), with odd image sizes
// (partial 2x2 and 4x4 tiles), batch > 1, several channel panels, and chunks smaller
// than the tile count (several passes, GEMM row tails). The backend uses these kernels on AVX2 CPUs only,
// so this test is what exercises them on an AVX-512 CI machine.
#include <catch2/catch.hpp>

#include <memory>
#include <sstream>
#include <vector>

#include "backend/cpu/winograd_f2x3.h"
#include "common/compare.h"
#include "reference/reference_ops.h"

using namespace rd;
using namespace rd::test;
namespace wino = rd::cpu::winograd;

namespace {

// NCHW (float) -> nChw8c when to_blocked, else nChw8c -> NCHW.
std::vector<float> relayout(const std::vector<float>& src, int64_t n, int64_t c, int64_t h, int64_t w,
                            bool to_blocked) {
  std::vector<float> dst(src.size());
  for (int64_t in = 0; in < n; ++in)
    for (int64_t ic = 0; ic < c; ++ic)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x) {
          const auto plain = static_cast<size_t>(((in * c + ic) * h + y) * w + x);
          const auto blocked = static_cast<size_t>((((in * (c / 8) + ic / 8) * h + y) * w + x) * 8 + ic % 8);
          if (to_blocked) dst[blocked] = src[plain];
          else dst[plain] = src[blocked];
        }
  return dst;
}
std::vector<float> to_blocked(const std::vector<float>& v, int64_t n, int64_t c, int64_t h, int64_t w) {
  return relayout(v, n, c, h, w, true);
}
std::vector<float> from_blocked(const std::vector<float>& b, int64_t n, int64_t c, int64_t h, int64_t w) {
  return relayout(b, n, c, h, w, false);
}

ref::Act act(const std::vector<float>& v, int64_t n, int64_t c, int64_t h, int64_t w) {
  ref::Act a(n, c, h, w);
  for (size_t i = 0; i < v.size(); ++i) a.v[i] = v[i];
  return a;
}

struct Workspace {
  std::unique_ptr<void, void (*)(void*)> p;
  explicit Workspace(size_t bytes) : p(std::aligned_alloc(64, (bytes + 63) / 64 * 64), &std::free) {}
};

// F(2x2,3x3) rounds like a direct convolution of the same depth (its transforms
// scale by 1/2 and add at most 4 terms): the same tolerance as the backend tests.
constexpr Tol kTolF2{1e-4, 1e-5};
// F(4x4,3x3): the transforms' norms make its rounding error about 6.5x F(2x2,3x3)'s
// (root-mean-square over a tile's outputs, up to 19x at the tile's last row and
// column; tools/parity/run_parity.py derives it), so 10x the tolerance. Measured here:
// up to 6e-6 of the largest output (F(2x2,3x3): up to 4e-7), against 1e-4 allowed.
constexpr Tol kTolF4{1e-3, 1e-4};

void check_case(const wino::Geometry& g, int threads) {
  const Tol kTol = g.tile == 4 ? kTolF4 : kTolF2;
  std::ostringstream name;
  name << "F(" << g.tile << "x" << g.tile << ",3x3) n" << g.n << " c" << g.c << " k" << g.k << " " << g.h << "x"
       << g.w << " chunk " << g.chunk << " threads " << threads;
  INFO(name.str());
  const auto x = random_floats(static_cast<size_t>(g.n * g.c * g.h * g.w), 21);
  const auto w = random_floats(static_cast<size_t>(g.k * g.c * 9), 22);
  const auto dy = random_floats(static_cast<size_t>(g.n * g.k * g.h * g.w), 23);
  const ref::Act xr = act(x, g.n, g.c, g.h, g.w), dyr = act(dy, g.n, g.k, g.h, g.w);
  const ref::Vec wr = to_double(w);
  Workspace ws(wino::workspace_bytes(g, threads));

  std::vector<float> y(dy.size(), 123.f);
  const auto xb = to_blocked(x, g.n, g.c, g.h, g.w);
  wino::forward(g, xb.data(), w.data(), y.data(), ws.p.get(), threads);
  const auto yr = ref::conv2d_forward(xr, wr, g.k, 3, 1, 1);
  const auto fwd = compare_close(from_blocked(y, g.n, g.k, g.h, g.w), yr.v, kTol);
  INFO("forward: " << fwd.str());
  CHECK(fwd.ok);

  std::vector<float> dx(x.size(), 123.f);
  const auto dyb = to_blocked(dy, g.n, g.k, g.h, g.w);
  wino::backward_data(g, dyb.data(), w.data(), dx.data(), ws.p.get(), threads);
  const auto dxr = ref::conv2d_backward_data(dyr, wr, g.c, g.h, g.w, 3, 1, 1);
  const auto bwd = compare_close(from_blocked(dx, g.n, g.c, g.h, g.w), dxr.v, kTol);
  INFO("backward-data: " << bwd.str());
  CHECK(bwd.ok);

  const auto dwr = ref::conv2d_backward_weights(xr, dyr, 3, 1, 1);
  std::vector<float> dw(w.size(), 123.f);
  wino::backward_weights(g, xb.data(), dyb.data(), dw.data(), false, ws.p.get(), threads);
  const auto wgrad = compare_close(dw, dwr, kTol);
  INFO("backward-weights: " << wgrad.str());
  CHECK(wgrad.ok);
  const auto prior = random_floats(w.size(), 24);
  dw = prior;
  wino::backward_weights(g, xb.data(), dyb.data(), dw.data(), true, ws.p.get(), threads);
  std::vector<double> expected(dwr.size());
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = prior[i] + dwr[i];
  const auto acc = compare_close(dw, expected, kTol);
  INFO("backward-weights accumulate: " << acc.str());
  CHECK(acc.ok);
}

}  // namespace

TEST_CASE("winograd F(2x2,3x3) and F(4x4,3x3): forward, backward-data, backward-weights vs float64 reference",
          "[kernel][winograd]") {
  if (!wino::cpu_supported()) {
    WARN("no AVX2+FMA on this CPU: the Winograd kernels are never used here");
    return;
  }
  const std::vector<wino::Geometry> cases{
      {2, 16, 16, 6, 6},         // whole tiles
      {2, 16, 32, 7, 9},         // odd sizes: partial tiles on the bottom and right
      {1, 32, 16, 1, 1},         // one pixel: the tile is mostly padding
      {3, 16, 48, 5, 3, 7},      // 3 output panels, chunks of 7 tiles (row tails)
      {2, 64, 64, 9, 9, 13},     // ResNet channels, several passes
      {1, 48, 16, 2, 3},         // c > k (backward-data: 3 panels)
      {2, 16, 16, 8, 8},         // whole 4x4 tiles
      {2, 32, 16, 13, 10, 5},    // partial 4x4 tiles (1 row, 2 columns), chunks of 5
      {1, 16, 32, 4, 5},         // one 4x4 tile plus a 1-pixel column
  };
  for (int64_t tile : {2, 4})
    for (auto g : cases) {
      g.tile = tile;
      REQUIRE(wino::shape_supported(g));
      for (int threads : {1, 2}) check_case(g, threads);
    }
  CHECK_FALSE(wino::shape_supported({1, 8, 16, 4, 4}));
  CHECK_FALSE(wino::shape_supported({1, 16, 24, 4, 4}));
  CHECK_FALSE(wino::shape_supported({1, 16, 16, 4, 4, 0, 3}));
}
