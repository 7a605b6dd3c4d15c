// The checks in backend_checks.h must catch a wrong backend, not only pass a
// right one. Each case here runs one check on a CPU backend with a single
// planted fault (a decorator that bends one op slightly) and is tagged
// [!shouldfail]: Catch2 reports it as passed only if the check failed.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "backend/backend_checks.h"
#include "backend/forwarding_backend.h"

using namespace rd;
using namespace rd::test;

namespace {

enum class Fault {
  ConvDataScaled,          // dx off by 0.1 %
  ConvWeightsOverwrite,    // accumulate=true ignored
  BnMomentum,              // running stats updated with momentum 0.2
  BnGradsSwapped,          // dgamma and dbeta exchanged
  XentNotMean,             // gradient of the summed, not the mean, loss
  AdamNoBiasCorrection,    // bias correction dropped
  SgdFirstStepIgnored,     // momentum buffer not initialised to the gradient
  ReluBackwardFromInput,   // gradient passes where y >= 0 instead of y > 0
  AvgpoolSum,              // backward forgets the 1 / (H W)
};

// Owns the inner backend; a base so that it exists before ForwardingBackend binds to it.
struct OwnsInner {
  std::unique_ptr<Backend> owned;
};

// Forwards every call to a real backend, except for one planted fault.
class FaultyBackend final : private OwnsInner, public ForwardingBackend {
 public:
  FaultyBackend(std::unique_ptr<Backend> inner, Fault fault)
      : OwnsInner{std::move(inner)}, ForwardingBackend(*owned), fault_(fault) {}

  std::string name() const override { return "faulty " + owned->name(); }

 protected:
  void conv2d_backward_data_impl(const Tensor& dy, const Tensor& w, Tensor& dx, const ConvGeometry& g) override {
    ForwardingBackend::conv2d_backward_data_impl(dy, w, dx, g);
    if (fault_ == Fault::ConvDataScaled) owned->scale(dx.f32(), 1.001f, static_cast<size_t>(dx.storage_elems()));
  }
  void conv2d_backward_weights_impl(const Tensor& x, const Tensor& dy, Tensor& dw, const ConvGeometry& g,
                                    bool accumulate) override {
    ForwardingBackend::conv2d_backward_weights_impl(x, dy, dw, g,
                                                    fault_ == Fault::ConvWeightsOverwrite ? false : accumulate);
  }
  void batchnorm_forward_train_impl(const Tensor& x, const BatchNormArgs& a, Tensor& y,
                                    BatchNormSaved& saved) override {
    BatchNormArgs changed = a;
    if (fault_ == Fault::BnMomentum) changed.momentum = 0.2f;
    ForwardingBackend::batchnorm_forward_train_impl(x, changed, y, saved);
  }
  void batchnorm_backward_impl(const Tensor& x, const Tensor& y, const Tensor& dy, const BatchNormArgs& a,
                               const BatchNormSaved& saved, Tensor& dx, const BatchNormGrads& grads) override {
    BatchNormGrads changed = grads;
    if (fault_ == Fault::BnGradsSwapped) std::swap(changed.dgamma, changed.dbeta);
    ForwardingBackend::batchnorm_backward_impl(x, y, dy, a, saved, dx, changed);
  }
  void relu_backward_impl(const Tensor& y, const Tensor& dy, Tensor& dx) override {
    if (fault_ != Fault::ReluBackwardFromInput) return ForwardingBackend::relu_backward_impl(y, dy, dx);
    std::vector<float> yh(static_cast<size_t>(y.numel())), gh(yh.size());
    owned->copy_to_host_nchw(y, yh.data());
    owned->copy_to_host_nchw(dy, gh.data());
    for (size_t i = 0; i < yh.size(); ++i) gh[i] = yh[i] >= 0.f ? gh[i] : 0.f;
    owned->copy_from_host_nchw(gh.data(), dx);
  }
  void global_avgpool_backward_impl(const Tensor& dy, Tensor& dx) override {
    ForwardingBackend::global_avgpool_backward_impl(dy, dx);
    if (fault_ == Fault::AvgpoolSum)
      owned->scale(dx.f32(), static_cast<float>(dx.shape[2] * dx.shape[3]), static_cast<size_t>(dx.storage_elems()));
  }
  double softmax_xent_impl(const Tensor& z, const int32_t* labels, float s, float grad_scale, Tensor* dz,
                           int32_t* pred) override {
    const float scale = fault_ == Fault::XentNotMean ? grad_scale * static_cast<float>(z.shape[0]) : grad_scale;
    return ForwardingBackend::softmax_xent_impl(z, labels, s, scale, dz, pred);
  }
  void adam_step_impl(float* p, const float* g, float* m, float* v, size_t n, const math::AdamArgs& a) override {
    math::AdamArgs changed = a;
    if (fault_ == Fault::AdamNoBiasCorrection) changed.step += 100000;
    ForwardingBackend::adam_step_impl(p, g, m, v, n, changed);
  }
  void sgd_step_impl(float* p, const float* g, float* buf, size_t n, const math::SgdHyper& h) override {
    math::SgdHyper changed = h;
    if (fault_ == Fault::SgdFirstStepIgnored) changed.first_step = false;
    ForwardingBackend::sgd_step_impl(p, g, buf, n, changed);
  }

 private:
  Fault fault_;
};

FaultyBackend faulty(Fault f) { return FaultyBackend(make_cpu_backend(), f); }

}  // namespace

TEST_CASE("fault detection: conv dx off by 0.1%", "[kernel][!shouldfail]") {
  auto be = faulty(Fault::ConvDataScaled);
  check_conv2d(be, ConvCase{2, 3, 7, 7, 4, 3, 1, 1}, Tol{}, false);
}
TEST_CASE("fault detection: conv dw ignores accumulate", "[kernel][!shouldfail]") {
  auto be = faulty(Fault::ConvWeightsOverwrite);
  check_conv2d(be, ConvCase{2, 3, 7, 7, 4, 3, 1, 1}, Tol{}, false);
}
TEST_CASE("fault detection: batch norm momentum 0.2", "[kernel][!shouldfail]") {
  auto be = faulty(Fault::BnMomentum);
  check_batchnorm_running_stats(be, BnCase{4, 6, 3, 3, true}, 3);
}
TEST_CASE("fault detection: batch norm dgamma/dbeta swapped", "[kernel][!shouldfail]") {
  auto be = faulty(Fault::BnGradsSwapped);
  check_batchnorm(be, BnCase{2, 5, 3, 3, false}, Tol{}, false);
}
TEST_CASE("fault detection: cross-entropy gradient of the sum", "[kernel][!shouldfail]") {
  auto be = faulty(Fault::XentNotMean);
  check_softmax_xent(be, 4, 3, 0.1f, 1.f);
}
TEST_CASE("fault detection: Adam without bias correction", "[kernel][!shouldfail]") {
  auto be = faulty(Fault::AdamNoBiasCorrection);
  check_adam(be, 37, 0.f, 2);
}
TEST_CASE("fault detection: SGD first step uses a stale buffer", "[kernel][!shouldfail]") {
  auto be = faulty(Fault::SgdFirstStepIgnored);
  check_sgd(be, 37, 0.9f, 0.f, 0.f, false, 2);
}
TEST_CASE("fault detection: ReLU gradient passes at y == 0", "[kernel][!shouldfail]") {
  auto be = faulty(Fault::ReluBackwardFromInput);
  check_relu(be, Dims{2, 3, 5, 7});
}
TEST_CASE("fault detection: average-pool backward without 1/(HW)", "[kernel][!shouldfail]") {
  auto be = faulty(Fault::AvgpoolSum);
  check_global_avgpool(be, Dims{2, 5, 3, 3});
}
