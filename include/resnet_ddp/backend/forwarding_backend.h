// ForwardingBackend: a Backend that passes every call on to an inner Backend, for
// decorators that watch or time calls (the parity driver's ReLU recorder, the
// per-op profiler in bench/op_profile_bench.cpp) without each repeating the list
// of forwarders.
//
// A subclass either overrides the `*_impl` calls it cares about (and calls the
// base version to forward; the public ops are Backend's contract checks), or overrides on_enter/on_exit, which bracket every
// operation with its BackendOp. The cheap queries (device, name, layouts, dtype)
// are forwarded without hooks: they are not operations.
//
// Every virtual of Backend must be forwarded here: a new pure virtual in
// backend.h makes this class abstract (a compile error in every decorator); a
// new non-pure virtual needs a line here too, or decorators silently use the
// default instead of the inner backend's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "resnet_ddp/backend/backend.h"

namespace rd {

// One value per Backend operation, in the order of backend.h.
enum class BackendOp : uint8_t {
  allocate,
  copy_from_host,
  copy_to_host,
  fill,
  copy_from_host_nchw,
  copy_to_host_nchw,
  images_u8_to_activation,
  synchronize,
  conv2d_forward,
  conv2d_backward_data,
  conv2d_backward_weights,
  batchnorm_forward_train,
  batchnorm_forward_eval,
  batchnorm_backward,
  relu_forward,
  relu_backward,
  add_forward,
  add_backward,
  accumulate,
  maxpool_workspace_bytes,
  maxpool_forward,
  maxpool_backward,
  global_avgpool_forward,
  global_avgpool_backward,
  linear_forward,
  linear_backward,
  softmax_xent,
  adam_step,
  sgd_step,
  scale,
  all_finite,
  unscale_and_check,
  count_  // number of operations, not an operation
};

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : in_(inner) {}

  Backend& inner() { return in_; }

  DeviceKind device() const override { return in_.device(); }
  std::string name() const override { return in_.name(); }
  Layout activation_layout() const override { return in_.activation_layout(); }
  DType activation_dtype() const override { return in_.activation_dtype(); }

  std::shared_ptr<void> allocate(size_t bytes) override {
    Hook h(*this, BackendOp::allocate);
    return in_.allocate(bytes);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    Hook h(*this, BackendOp::copy_from_host);
    in_.copy_from_host(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    Hook h(*this, BackendOp::copy_to_host);
    in_.copy_to_host(dst, src, bytes);
  }
  void fill(float* dst, float value, size_t count) override {
    Hook h(*this, BackendOp::fill);
    in_.fill(dst, value, count);
  }
  void synchronize() override {
    Hook h(*this, BackendOp::synchronize);
    in_.synchronize();
  }
  size_t maxpool_workspace_bytes(const Tensor& y) override {
    Hook h(*this, BackendOp::maxpool_workspace_bytes);
    return in_.maxpool_workspace_bytes(y);
  }
  void scale(float* data, float factor, size_t count) override {
    Hook h(*this, BackendOp::scale);
    in_.scale(data, factor, count);
  }
  bool all_finite(const float* data, size_t count) override {
    Hook h(*this, BackendOp::all_finite);
    return in_.all_finite(data, count);
  }
  bool unscale_and_check(float* data, float factor, size_t count) override {
    Hook h(*this, BackendOp::unscale_and_check);
    return in_.unscale_and_check(data, factor, count);
  }

 protected:
  // The contract already ran in the public op of this decorator; the inner
  // backend's public op runs it again (cheap), then its own implementation.
  void copy_from_host_nchw_impl(const float* src, Tensor& dst) override {
    Hook h(*this, BackendOp::copy_from_host_nchw);
    in_.copy_from_host_nchw(src, dst);
  }
  void copy_to_host_nchw_impl(const Tensor& src, float* dst) override {
    Hook h(*this, BackendOp::copy_to_host_nchw);
    in_.copy_to_host_nchw(src, dst);
  }
  void images_u8_to_activation_impl(const uint8_t* src, Tensor& dst, const float* mean,
                                    const float* std) override {
    Hook h(*this, BackendOp::images_u8_to_activation);
    in_.images_u8_to_activation(src, dst, mean, std);
  }

  void conv2d_forward_impl(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g) override {
    Hook h(*this, BackendOp::conv2d_forward);
    in_.conv2d_forward(x, w, y, g);
  }
  void conv2d_backward_data_impl(const Tensor& dy, const Tensor& w, Tensor& dx, const ConvGeometry& g) override {
    Hook h(*this, BackendOp::conv2d_backward_data);
    in_.conv2d_backward_data(dy, w, dx, g);
  }
  void conv2d_backward_weights_impl(const Tensor& x, const Tensor& dy, Tensor& dw, const ConvGeometry& g,
                                    bool accumulate) override {
    Hook h(*this, BackendOp::conv2d_backward_weights);
    in_.conv2d_backward_weights(x, dy, dw, g, accumulate);
  }

  void batchnorm_forward_train_impl(const Tensor& x, const BatchNormArgs& a, Tensor& y,
                                    BatchNormSaved& saved) override {
    Hook h(*this, BackendOp::batchnorm_forward_train);
    in_.batchnorm_forward_train(x, a, y, saved);
  }
  void batchnorm_forward_eval_impl(const Tensor& x, const BatchNormArgs& a, Tensor& y) override {
    Hook h(*this, BackendOp::batchnorm_forward_eval);
    in_.batchnorm_forward_eval(x, a, y);
  }
  void batchnorm_backward_impl(const Tensor& x, const Tensor& y, const Tensor& dy, const BatchNormArgs& a,
                               const BatchNormSaved& saved, Tensor& dx, const BatchNormGrads& grads) override {
    Hook h(*this, BackendOp::batchnorm_backward);
    in_.batchnorm_backward(x, y, dy, a, saved, dx, grads);
  }

  void relu_forward_impl(const Tensor& x, Tensor& y) override {
    Hook h(*this, BackendOp::relu_forward);
    in_.relu_forward(x, y);
  }
  void relu_backward_impl(const Tensor& y, const Tensor& dy, Tensor& dx) override {
    Hook h(*this, BackendOp::relu_backward);
    in_.relu_backward(y, dy, dx);
  }
  void add_forward_impl(const Tensor& a, const Tensor& b, bool relu, Tensor& y) override {
    Hook h(*this, BackendOp::add_forward);
    in_.add_forward(a, b, relu, y);
  }
  void add_backward_impl(const Tensor& y, const Tensor& dy, bool relu, Tensor& dsum) override {
    Hook h(*this, BackendOp::add_backward);
    in_.add_backward(y, dy, relu, dsum);
  }
  void accumulate_impl(const Tensor& src, Tensor& dst) override {
    Hook h(*this, BackendOp::accumulate);
    in_.accumulate(src, dst);
  }

  void maxpool_forward_impl(const Tensor& x, Tensor& y, int kernel, int stride, int pad, void* workspace) override {
    Hook h(*this, BackendOp::maxpool_forward);
    in_.maxpool_forward(x, y, kernel, stride, pad, workspace);
  }
  void maxpool_backward_impl(const Tensor& dy, Tensor& dx, int kernel, int stride, int pad,
                             const void* workspace) override {
    Hook h(*this, BackendOp::maxpool_backward);
    in_.maxpool_backward(dy, dx, kernel, stride, pad, workspace);
  }
  void global_avgpool_forward_impl(const Tensor& x, Tensor& y) override {
    Hook h(*this, BackendOp::global_avgpool_forward);
    in_.global_avgpool_forward(x, y);
  }
  void global_avgpool_backward_impl(const Tensor& dy, Tensor& dx) override {
    Hook h(*this, BackendOp::global_avgpool_backward);
    in_.global_avgpool_backward(dy, dx);
  }

  void linear_forward_impl(const Tensor& x, const Tensor& w, const float* b, Tensor& y) override {
    Hook h(*this, BackendOp::linear_forward);
    in_.linear_forward(x, w, b, y);
  }
  void linear_backward_impl(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw, float* db,
                            bool accumulate) override {
    Hook h(*this, BackendOp::linear_backward);
    in_.linear_backward(x, w, dy, dx, dw, db, accumulate);
  }
  double softmax_xent_impl(const Tensor& logits, const int32_t* labels, float smoothing, float grad_scale,
                           Tensor* dlogits, int32_t* predictions) override {
    Hook h(*this, BackendOp::softmax_xent);
    return in_.softmax_xent(logits, labels, smoothing, grad_scale, dlogits, predictions);
  }
  void adam_step_impl(float* params, const float* grads, float* m, float* v, size_t count,
                      const math::AdamArgs& a) override {
    Hook h(*this, BackendOp::adam_step);
    in_.adam_step(params, grads, m, v, count, a);
  }
  void sgd_step_impl(float* params, const float* grads, float* momentum_buf, size_t count,
                     const math::SgdHyper& hyper) override {
    Hook h(*this, BackendOp::sgd_step);
    in_.sgd_step(params, grads, momentum_buf, count, hyper);
  }

  // Called around every operation (on_exit after the inner call returned, or threw).
  virtual void on_enter(BackendOp) {}
  virtual void on_exit(BackendOp) {}

 private:
  struct Hook {
    ForwardingBackend& self;
    BackendOp op;
    Hook(ForwardingBackend& s, BackendOp o) : self(s), op(o) { self.on_enter(op); }
    ~Hook() { self.on_exit(op); }
    Hook(const Hook&) = delete;
    Hook& operator=(const Hook&) = delete;
  };

  Backend& in_;
};

}  // namespace rd
