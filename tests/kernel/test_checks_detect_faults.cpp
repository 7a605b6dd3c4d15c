// The checks in backend_checks.h must catch a wrong backend, not only pass a
// right one. Each case here runs one check on a CPU backend with a single
// planted fault (a decorator that bends one op slightly) and is tagged
// [!shouldfail]: Catch2 reports it as passed only if the check failed.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "kernel/backend_checks.h"

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

// Forwards every call to a real backend, except for one planted fault.
class FaultyBackend final : public Backend {
 public:
  FaultyBackend(std::unique_ptr<Backend> inner, Fault fault) : in_(std::move(inner)), fault_(fault) {}

  DeviceKind device() const override { return in_->device(); }
  std::string name() const override { return "faulty " + in_->name(); }
  Layout activation_layout() const override { return in_->activation_layout(); }
  std::shared_ptr<void> allocate(size_t bytes) override { return in_->allocate(bytes); }
  void copy_from_host(void* d, const void* s, size_t b) override { in_->copy_from_host(d, s, b); }
  void copy_to_host(void* d, const void* s, size_t b) override { in_->copy_to_host(d, s, b); }
  void fill(float* d, float v, size_t n) override { in_->fill(d, v, n); }
  void copy_from_host_nchw(const float* s, Tensor& d) override { in_->copy_from_host_nchw(s, d); }
  void copy_to_host_nchw(const Tensor& s, float* d) override { in_->copy_to_host_nchw(s, d); }
  void images_u8_to_activation(const uint8_t* s, Tensor& d, const float* m, const float* sd) override {
    in_->images_u8_to_activation(s, d, m, sd);
  }
  void synchronize() override { in_->synchronize(); }

  void conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g) override {
    in_->conv2d_forward(x, w, y, g);
  }
  void conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx, const ConvGeometry& g) override {
    in_->conv2d_backward_data(dy, w, dx, g);
    if (fault_ == Fault::ConvDataScaled) in_->scale(dx.f32(), 1.001f, static_cast<size_t>(dx.storage_elems()));
  }
  void conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, const ConvGeometry& g,
                               bool accumulate) override {
    in_->conv2d_backward_weights(x, dy, dw, g, fault_ == Fault::ConvWeightsOverwrite ? false : accumulate);
  }
  void batchnorm_forward_train(const Tensor& x, const float* gamma, const float* beta, float* rm, float* rv,
                               float momentum, float eps, bool relu, Tensor& y, BatchNormSaved& saved,
                               ChannelReducer* sync) override {
    in_->batchnorm_forward_train(x, gamma, beta, rm, rv, fault_ == Fault::BnMomentum ? 0.2f : momentum, eps, relu,
                                 y, saved, sync);
  }
  void batchnorm_forward_eval(const Tensor& x, const float* gamma, const float* beta, const float* rm,
                              const float* rv, float eps, bool relu, Tensor& y) override {
    in_->batchnorm_forward_eval(x, gamma, beta, rm, rv, eps, relu, y);
  }
  void batchnorm_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const float* gamma,
                          const BatchNormSaved& saved, bool relu, Tensor& dx, float* dgamma, float* dbeta,
                          bool accumulate, ChannelReducer* sync) override {
    if (fault_ == Fault::BnGradsSwapped) std::swap(dgamma, dbeta);
    in_->batchnorm_backward(x, y, dy, gamma, saved, relu, dx, dgamma, dbeta, accumulate, sync);
  }
  void relu_forward(const Tensor& x, Tensor& y) override { in_->relu_forward(x, y); }
  void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override {
    if (fault_ != Fault::ReluBackwardFromInput) return in_->relu_backward(y, dy, dx);
    std::vector<float> yh(static_cast<size_t>(y.numel())), gh(yh.size());
    in_->copy_to_host_nchw(y, yh.data());
    in_->copy_to_host_nchw(dy, gh.data());
    for (size_t i = 0; i < yh.size(); ++i) gh[i] = yh[i] >= 0.f ? gh[i] : 0.f;
    in_->copy_from_host_nchw(gh.data(), dx);
  }
  void add_forward(const Tensor& a, const Tensor& b, bool relu, Tensor& y) override { in_->add_forward(a, b, relu, y); }
  void add_backward(const Tensor& y, const Tensor& dy, bool relu, Tensor& ds) override {
    in_->add_backward(y, dy, relu, ds);
  }
  void accumulate(const Tensor& s, Tensor& d) override { in_->accumulate(s, d); }
  size_t maxpool_workspace_bytes(const Tensor& y) override { return in_->maxpool_workspace_bytes(y); }
  void maxpool_forward(const Tensor& x, Tensor& y, int k, int s, int p, void* ws) override {
    in_->maxpool_forward(x, y, k, s, p, ws);
  }
  void maxpool_backward(const Tensor& dy, Tensor& dx, int k, int s, int p, const void* ws) override {
    in_->maxpool_backward(dy, dx, k, s, p, ws);
  }
  void global_avgpool_forward(const Tensor& x, Tensor& y) override { in_->global_avgpool_forward(x, y); }
  void global_avgpool_backward(const Tensor& dy, Tensor& dx) override {
    in_->global_avgpool_backward(dy, dx);
    if (fault_ == Fault::AvgpoolSum)
      in_->scale(dx.f32(), static_cast<float>(dx.shape[2] * dx.shape[3]), static_cast<size_t>(dx.storage_elems()));
  }
  void linear_forward(const Tensor& x, const Tensor& w, const float* b, Tensor& y) override {
    in_->linear_forward(x, w, b, y);
  }
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw, float* db,
                       bool accumulate) override {
    in_->linear_backward(x, w, dy, dx, dw, db, accumulate);
  }
  double softmax_xent(const Tensor& z, const int32_t* labels, float s, float grad_scale, Tensor* dz,
                      int32_t* pred) override {
    const float scale = fault_ == Fault::XentNotMean ? grad_scale * static_cast<float>(z.shape[0]) : grad_scale;
    return in_->softmax_xent(z, labels, s, scale, dz, pred);
  }
  void adam_step(float* p, const float* g, float* m, float* v, size_t n, float lr, float b1, float b2, float eps,
                 float wd, int64_t step) override {
    in_->adam_step(p, g, m, v, n, lr, b1, b2, eps, wd, fault_ == Fault::AdamNoBiasCorrection ? step + 100000 : step);
  }
  void sgd_step(float* p, const float* g, float* buf, size_t n, float lr, float mom, float damp, float wd,
                bool nesterov, bool first) override {
    in_->sgd_step(p, g, buf, n, lr, mom, damp, wd, nesterov, fault_ == Fault::SgdFirstStepIgnored ? false : first);
  }
  void scale(float* d, float f, size_t n) override { in_->scale(d, f, n); }
  bool all_finite(const float* d, size_t n) override { return in_->all_finite(d, n); }

 private:
  std::unique_ptr<Backend> in_;
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
