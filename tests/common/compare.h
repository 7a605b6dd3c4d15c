// Test data and closeness checks shared by the kernel, model and GPU tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace rd::test {

// Uniform floats in [lo, hi), deterministic per seed.
inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// n distinct values +/-(offset + k * spacing), shuffled: no two values within
// `spacing` of each other and none within `offset` of zero. Finite differences
// with a step below spacing/2 then never cross a ReLU kink or a max-pool tie.
inline std::vector<float> separated_floats(size_t n, uint64_t seed, float spacing = 0.05f,
                                           float offset = 0.05f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const float mag = offset + static_cast<float>(i / 2) * spacing;
    v[i] = (i % 2) ? -mag : mag;
  }
  std::mt19937_64 rng(seed);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

inline std::vector<float> to_float(const std::vector<double>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(v[i]);
  return f;
}

// |got - expected| <= rtol * |expected| + atol * max(1, max |expected|): the
// absolute part scales with the tensor's magnitude because float accumulation
// errors do (sums of many terms cancel to small outputs).
struct Tol {
  double rtol = 1e-4;
  double atol = 1e-5;
};

struct CloseReport {
  bool ok = true;
  size_t count = 0;
  size_t mismatches = 0;
  size_t worst_index = 0;
  double worst_got = 0.0, worst_expected = 0.0, worst_excess = 0.0;
  double max_abs_diff = 0.0;

  std::string str() const {
    std::ostringstream os;
    os.precision(9);
    os << (ok ? "close" : "NOT close") << ": " << mismatches << "/" << count
       << " mismatches, max |diff| " << max_abs_diff << "; worst element " << worst_index
       << " got " << worst_got << " expected " << worst_expected;
    return os.str();
  }
};

template <class A, class B>
CloseReport compare_close(const A& got, const B& expected, Tol tol = {}) {
  CloseReport r;
  r.count = expected.size();
  if (got.size() != expected.size()) {
    r.ok = false;
    r.mismatches = r.count;
    return r;
  }
  double scale = 1.0;
  for (auto e : expected) scale = std::max(scale, std::fabs(static_cast<double>(e)));
  double worst = -INFINITY;
  for (size_t i = 0; i < r.count; ++i) {
    const double g = static_cast<double>(got[i]), e = static_cast<double>(expected[i]);
    const double diff = std::fabs(g - e);
    const double allowed = tol.rtol * std::fabs(e) + tol.atol * scale;
    const double excess = std::isfinite(g) ? diff - allowed : INFINITY;
    if (!(excess <= 0.0)) ++r.mismatches;
    if (std::isfinite(diff)) r.max_abs_diff = std::max(r.max_abs_diff, diff);
    if (excess > worst) {
      worst = excess;
      r.worst_index = i;
      r.worst_got = g;
      r.worst_expected = e;
      r.worst_excess = excess;
    }
  }
  r.ok = r.mismatches == 0;
  return r;
}

}  // namespace rd::test
