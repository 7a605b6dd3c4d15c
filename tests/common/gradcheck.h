// Shared central-finite-difference gradient checker (Caffe's GradientChecker
// criterion). Every layer test uses it the same way:
//
//   loss(x) = sum_i weight_i * y_i(x)     with fixed random weights, so
//   d loss / d y = weight is the dy fed to the analytic backward pass;
//
// then for each checked element x_i:
//   numeric_i = (loss(x + h e_i) - loss(x - h e_i)) / (x_i+ - x_i-)
// and the check passes when |analytic_i - numeric_i| <= threshold * max(|analytic_i|,
// |numeric_i|, scale_floor). The step is divided by the step actually taken in T, so
// float rounding of x_i +/- h does not bias the estimate.
//
// Near a non-differentiable point (ReLU kink, max-pool tie) a central difference is
// meaningless; with `skip_kinks` the element is also probed with h/2 and skipped when
// the two estimates disagree, and `max_skip_fraction` bounds how many may be skipped.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace rd::test {

struct GradCheckOptions {
  double step = 0.0;         // 0: 1e-6 for double, 1e-2 for float (Caffe's default)
  double threshold = 0.0;    // 0: 1e-6 for double, 1e-2 for float
  double scale_floor = 1.0;  // below this magnitude the threshold is absolute
  size_t max_checks = 0;     // 0: every element; otherwise a seeded random sample
  std::vector<size_t> indices;  // when given: exactly these elements (overrides max_checks)
  uint64_t seed = 1;
  bool skip_kinks = false;
  double max_skip_fraction = 0.2;
};

struct GradCheckResult {
  size_t checked = 0;
  size_t skipped = 0;
  size_t failures = 0;
  size_t worst_index = 0;
  double worst_error = 0.0;  // |analytic - numeric| / max(|a|, |n|, scale_floor)
  double worst_analytic = 0.0;
  double worst_numeric = 0.0;
  bool passed = false;

  std::string summary(const std::string& what = "") const {
    std::ostringstream os;
    os << "gradcheck " << what << ": " << (passed ? "ok" : "FAILED") << ", checked " << checked
       << " skipped " << skipped << " failed " << failures << "; worst element " << worst_index
       << " analytic " << worst_analytic << " numeric " << worst_numeric << " scaled error "
       << worst_error;
    return os.str();
  }
};

// Deterministic sample of `k` distinct indices out of [0, n) (all when k == 0 or k >= n).
inline std::vector<size_t> sample_indices(size_t n, size_t k, uint64_t seed) {
  std::vector<size_t> idx(n);
  std::iota(idx.begin(), idx.end(), size_t{0});
  if (k == 0 || k >= n) return idx;
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < k; ++i) {
    std::uniform_int_distribution<size_t> pick(i, n - 1);
    std::swap(idx[i], idx[pick(rng)]);
  }
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

// `loss` evaluates the scalar function at the given point (it may read the
// vector only). `analytic` is d loss / d x at `x`.
template <class T>
GradCheckResult check_gradient(const std::function<double(const std::vector<T>&)>& loss,
                               std::vector<T> x, const std::vector<double>& analytic,
                               GradCheckOptions opt = {}) {
  static_assert(std::is_floating_point_v<T>);
  constexpr bool is_double = std::is_same_v<T, double>;
  const double h = opt.step > 0 ? opt.step : (is_double ? 1e-6 : 1e-2);
  const double threshold = opt.threshold > 0 ? opt.threshold : (is_double ? 1e-6 : 1e-2);
  GradCheckResult r;
  if (analytic.size() != x.size()) {
    r.worst_error = INFINITY;
    return r;
  }

  // Central difference with step `hh` for element i; restores x[i].
  auto central = [&](size_t i, double hh) {
    const T orig = x[i];
    const T plus = static_cast<T>(static_cast<double>(orig) + hh);
    const T minus = static_cast<T>(static_cast<double>(orig) - hh);
    x[i] = plus;
    const double fp = loss(x);
    x[i] = minus;
    const double fm = loss(x);
    x[i] = orig;
    return (fp - fm) / (static_cast<double>(plus) - static_cast<double>(minus));
  };
  auto scaled_error = [&](double a, double n) {
    return std::fabs(a - n) / std::max({std::fabs(a), std::fabs(n), opt.scale_floor});
  };

  const std::vector<size_t> chosen =
      opt.indices.empty() ? sample_indices(x.size(), opt.max_checks, opt.seed) : opt.indices;
  for (size_t i : chosen) {
    if (i >= x.size()) {
      ++r.failures;
      continue;
    }
    const double numeric = central(i, h);
    const double a = analytic[i];
    double err = scaled_error(a, numeric);
    if (opt.skip_kinks && err > threshold) {
      const double half = central(i, h / 2);
      if (scaled_error(numeric, half) > threshold / 2) {  // the function bends inside the step
        ++r.skipped;
        continue;
      }
    }
    if (!std::isfinite(numeric) || !std::isfinite(a)) err = INFINITY;
    ++r.checked;
    if (err > threshold) ++r.failures;
    if (r.checked == 1 || err > r.worst_error) {
      r.worst_error = err;
      r.worst_index = i;
      r.worst_analytic = a;
      r.worst_numeric = numeric;
    }
  }
  const size_t total = r.checked + r.skipped;
  r.passed = r.checked > 0 && r.failures == 0 &&
             static_cast<double>(r.skipped) <= opt.max_skip_fraction * static_cast<double>(total);
  return r;
}

// Fixed random weights for loss = sum_i weight_i * y_i (uniform in [-1, 1]).
inline std::vector<double> projection_weights(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> w(n);
  for (double& v : w) v = u(rng);
  return w;
}

template <class V>
double weighted_sum(const V& y, const std::vector<double>& weights) {
  double s = 0.0;
  for (size_t i = 0; i < weights.size(); ++i) s += weights[i] * static_cast<double>(y[i]);
  return s;
}

}  // namespace rd::test
