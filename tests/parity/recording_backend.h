// A Backend decorator for the parity driver: forwards every call to the real
// backend and, while recording, keeps each ReLU decision (fused BN+ReLU, add+ReLU,
// plain ReLU) and the max-pool input of the forward pass.
//
// Why: an activation within rounding of zero can switch a ReLU (or a near-tie can
// switch a max-pool window) between any two float32 implementations, and then the
// gradients of every earlier layer differ by far more than 1e-4 — PyTorch float32
// differs from PyTorch float64 that way too. ResNet-50 at 160x200 has ~16 ReLU
// inputs within 1e-7 of the tensor maximum, so such ties are not avoidable by
// choosing inputs. The parity script therefore replays resnet_ddp's decisions in
// the float64 PyTorch reference (and counts how many differ from float64's own,
// all of which must be within rounding of the kink).
//
// Every pure virtual of Backend must be forwarded here; a new one in backend.h
// needs a line below.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"

namespace rd::parity {

struct ReluRecord {
  std::string kind;  // bn_relu | add_relu | relu
  std::vector<int64_t> dims;
  std::vector<uint8_t> kept;  // 1 where the output is > 0, in NCHW (or row-major) order
};

class RecordingBackend final : public Backend {
 public:
  explicit RecordingBackend(Backend& inner) : in_(inner) {}

  bool recording = false;
  std::vector<ReluRecord> relus;
  std::vector<int64_t> maxpool_dims;
  std::vector<float> maxpool_input;  // NCHW

  DeviceKind device() const override { return in_.device(); }
  std::string name() const override { return in_.name(); }
  Layout activation_layout() const override { return in_.activation_layout(); }
  std::shared_ptr<void> allocate(size_t bytes) override { return in_.allocate(bytes); }
  DType activation_dtype() const override { return in_.activation_dtype(); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { in_.copy_from_host(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { in_.copy_to_host(dst, src, bytes); }
  void fill(float* dst, float value, size_t count) override { in_.fill(dst, value, count); }
  void copy_from_host_nchw(const float* src, Tensor& dst) override { in_.copy_from_host_nchw(src, dst); }
  void copy_to_host_nchw(const Tensor& src, float* dst) override { in_.copy_to_host_nchw(src, dst); }
  void images_u8_to_activation(const uint8_t* src, Tensor& dst, const float* mean, const float* std) override {
    in_.images_u8_to_activation(src, dst, mean, std);
  }
  void synchronize() override { in_.synchronize(); }

  void conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g) override {
    in_.conv2d_forward(x, w, y, g);
  }
  void conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx, const ConvGeometry& g) override {
    in_.conv2d_backward_data(dy, w, dx, g);
  }
  void conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, const ConvGeometry& g,
                               bool accumulate) override {
    in_.conv2d_backward_weights(x, dy, dw, g, accumulate);
  }

  void batchnorm_forward_train(const Tensor& x, const float* gamma, const float* beta, float* running_mean,
                               float* running_var, float momentum, float eps, bool relu, Tensor& y,
                               BatchNormSaved& saved, ChannelReducer* sync) override {
    in_.batchnorm_forward_train(x, gamma, beta, running_mean, running_var, momentum, eps, relu, y, saved, sync);
    if (relu) record("bn_relu", y);
  }
  void batchnorm_forward_eval(const Tensor& x, const float* gamma, const float* beta, const float* running_mean,
                              const float* running_var, float eps, bool relu, Tensor& y) override {
    in_.batchnorm_forward_eval(x, gamma, beta, running_mean, running_var, eps, relu, y);
  }
  void batchnorm_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const float* gamma,
                          const BatchNormSaved& saved, bool relu, Tensor& dx, float* dgamma, float* dbeta,
                          bool accumulate, ChannelReducer* sync) override {
    in_.batchnorm_backward(x, y, dy, gamma, saved, relu, dx, dgamma, dbeta, accumulate, sync);
  }

  void relu_forward(const Tensor& x, Tensor& y) override {
    in_.relu_forward(x, y);
    record("relu", y);
  }
  void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override { in_.relu_backward(y, dy, dx); }
  void add_forward(const Tensor& a, const Tensor& b, bool relu, Tensor& y) override {
    in_.add_forward(a, b, relu, y);
    if (relu) record("add_relu", y);
  }
  void add_backward(const Tensor& y, const Tensor& dy, bool relu, Tensor& dsum) override {
    in_.add_backward(y, dy, relu, dsum);
  }
  void accumulate(const Tensor& src, Tensor& dst) override { in_.accumulate(src, dst); }

  size_t maxpool_workspace_bytes(const Tensor& y) override { return in_.maxpool_workspace_bytes(y); }
  void maxpool_forward(const Tensor& x, Tensor& y, int kernel, int stride, int pad, void* workspace) override {
    if (recording) {
      maxpool_dims = x.shape.vec();
      maxpool_input.resize(static_cast<size_t>(x.numel()));
      in_.copy_to_host_nchw(x, maxpool_input.data());
    }
    in_.maxpool_forward(x, y, kernel, stride, pad, workspace);
  }
  void maxpool_backward(const Tensor& dy, Tensor& dx, int kernel, int stride, int pad,
                        const void* workspace) override {
    in_.maxpool_backward(dy, dx, kernel, stride, pad, workspace);
  }
  void global_avgpool_forward(const Tensor& x, Tensor& y) override { in_.global_avgpool_forward(x, y); }
  void global_avgpool_backward(const Tensor& dy, Tensor& dx) override { in_.global_avgpool_backward(dy, dx); }

  void linear_forward(const Tensor& x, const Tensor& w, const float* b, Tensor& y) override {
    in_.linear_forward(x, w, b, y);
  }
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw, float* db,
                       bool accumulate) override {
    in_.linear_backward(x, w, dy, dx, dw, db, accumulate);
  }
  double softmax_xent(const Tensor& logits, const int32_t* labels, float smoothing, float grad_scale,
                      Tensor* dlogits, int32_t* predictions) override {
    return in_.softmax_xent(logits, labels, smoothing, grad_scale, dlogits, predictions);
  }
  void adam_step(float* params, const float* grads, float* m, float* v, size_t count, float lr, float beta1,
                 float beta2, float eps, float weight_decay, int64_t step) override {
    in_.adam_step(params, grads, m, v, count, lr, beta1, beta2, eps, weight_decay, step);
  }
  void sgd_step(float* params, const float* grads, float* momentum_buf, size_t count, float lr, float momentum,
                float dampening, float weight_decay, bool nesterov, bool first_step) override {
    in_.sgd_step(params, grads, momentum_buf, count, lr, momentum, dampening, weight_decay, nesterov, first_step);
  }
  void scale(float* data, float factor, size_t count) override { in_.scale(data, factor, count); }
  bool all_finite(const float* data, size_t count) override { return in_.all_finite(data, count); }

 private:
  void record(const char* kind, const Tensor& y) {
    if (!recording) return;
    ReluRecord r;
    r.kind = kind;
    r.dims = y.shape.vec();
    std::vector<float> host(static_cast<size_t>(y.numel()));
    if (y.shape.rank == 4)
      in_.copy_to_host_nchw(y, host.data());
    else
      in_.copy_to_host(host.data(), y.data, host.size() * sizeof(float));
    r.kept.resize(host.size());
    for (size_t i = 0; i < host.size(); ++i) r.kept[i] = host[i] > 0.f ? 1 : 0;
    relus.push_back(std::move(r));
  }

  Backend& in_;
};

}  // namespace rd::parity
