// CudaBackend: rd::Backend on one GPU. Convolutions through cuDNN (algorithms
// chosen once per shape with cudnnFind*, one shared workspace grown on
// demand), linear layers through cuBLAS, everything else through kernels/
// whose per-element math is include/resnet_ddp/math/*.h.
//
// Streams: all work runs in order on one compute stream; input images go
// host -> pinned -> device on a copy stream (event-ordered); NcclComm runs
// collectives on its own stream ordered against compute_stream() with events.
//
// Precision: FP32 (no TF32 anywhere), TF32 (tensor-core math for convs and
// GEMMs, Ampere+), FP16 / BF16 mixed precision: activations stored F16/BF16,
// parameters, gradients, optimizer state, BN statistics, matrices and the
// loss stay F32 (weights are converted per call, weight gradients come back
// as F32). Loss scaling for FP16 is the trainer's (softmax_xent's grad_scale,
// then unscale_and_check / all_finite).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <memory>
#include <string>
#include <unordered_map>

#include "launch.cuh"  // kernels/
#include "resnet_ddp/backend/backend.h"

namespace rd::cuda {

// Grow-only device (or pinned host) scratch buffer.
class Scratch {
 public:
  explicit Scratch(bool pinned_host = false) : pinned_(pinned_host) {}
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  // Ensures >= bytes; the previous content is lost when it grows. `what`
  // names the buffer in an out-of-memory error.
  void* get(size_t bytes, const char* what);
  template <class T> T* as(size_t count, const char* what) {
    return static_cast<T*>(get(count * sizeof(T), what));
  }
  size_t capacity() const { return bytes_; }

 private:
  void release();
  bool pinned_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Compute stream of the CudaBackend living on `device` (null when none):
// NcclComm orders its collectives against it. The newest backend per device wins.
cudaStream_t registered_compute_stream(int device);

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& opts);
  ~CudaBackend() override;

  DeviceKind device() const override { return DeviceKind::CUDA; }
  std::string name() const override;
  Layout activation_layout() const override { return layout_; }
  DType activation_dtype() const override { return act_dtype_; }

  std::shared_ptr<void> allocate(size_t bytes) override;
  void copy_from_host(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void fill(float* dst, float value, size_t count) override;
  void copy_from_host_nchw(const float* src, Tensor& dst) override;
  void copy_to_host_nchw(const Tensor& src, float* dst) override;
  void images_u8_to_activation(const uint8_t* src_nhwc, Tensor& dst, const float* mean = nullptr,
                               const float* std = nullptr) override;
  void synchronize() override;

  void conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g) override;
  void conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx,
                            const ConvGeometry& g) override;
  void conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, const ConvGeometry& g,
                               bool accumulate) override;

  void batchnorm_forward_train(const Tensor& x, const float* gamma, const float* beta,
                               float* running_mean, float* running_var, float momentum, float eps,
                               bool relu, Tensor& y, BatchNormSaved& saved,
                               ChannelReducer* sync) override;
  void batchnorm_forward_eval(const Tensor& x, const float* gamma, const float* beta,
                              const float* running_mean, const float* running_var, float eps,
                              bool relu, Tensor& y) override;
  void batchnorm_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const float* gamma,
                          const BatchNormSaved& saved, bool relu, Tensor& dx, float* dgamma,
                          float* dbeta, bool accumulate, ChannelReducer* sync) override;

  void relu_forward(const Tensor& x, Tensor& y) override;
  void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override;
  void add_forward(const Tensor& a, const Tensor& b, bool relu, Tensor& y) override;
  void add_backward(const Tensor& y, const Tensor& dy, bool relu, Tensor& dsum) override;
  void accumulate(const Tensor& src, Tensor& dst) override;

  size_t maxpool_workspace_bytes(const Tensor& y) override;
  void maxpool_forward(const Tensor& x, Tensor& y, int kernel, int stride, int pad,
                       void* workspace) override;
  void maxpool_backward(const Tensor& dy, Tensor& dx, int kernel, int stride, int pad,
                        const void* workspace) override;
  void global_avgpool_forward(const Tensor& x, Tensor& y) override;
  void global_avgpool_backward(const Tensor& dy, Tensor& dx) override;

  void linear_forward(const Tensor& x, const Tensor& w, const float* b, Tensor& y) override;
  void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                       float* db, bool accumulate) override;

  double softmax_xent(const Tensor& logits, const int32_t* labels, float smoothing, float grad_scale,
                      Tensor* dlogits, int32_t* predictions) override;

  void adam_step(float* params, const float* grads, float* m, float* v, size_t count, float lr,
                 float beta1, float beta2, float eps, float weight_decay, int64_t step) override;
  void sgd_step(float* params, const float* grads, float* momentum_buf, size_t count, float lr,
                float momentum, float dampening, float weight_decay, bool nesterov,
                bool first_step) override;
  void scale(float* data, float factor, size_t count) override;
  bool all_finite(const float* data, size_t count) override;

  // ---- CUDA-only extras ---------------------------------------------------------
  // data *= factor, then true when every element is finite (one pass: fp16
  // loss-scale unscaling plus the overflow check).
  bool unscale_and_check(float* data, float factor, size_t count);
  // Rows of `logits` whose first maximum equals the (host) label.
  int64_t count_correct(const Tensor& logits, const int32_t* labels);
  cudaStream_t compute_stream() const { return compute_; }
  int device_index() const { return device_; }
  Precision precision() const { return precision_; }
  // Distinct convolution shapes planned so far (each ran cudnnFind once).
  size_t conv_plans() const { return plans_.size(); }
  size_t workspace_bytes() const { return workspace_.capacity(); }

  struct ConvKey {
    int64_t n, c, h, w, o, kh, kw;
    int stride, pad;
    bool nhwc;
    DType dtype;
    bool operator==(const ConvKey&) const = default;
  };
  struct ConvKeyHash {
    size_t operator()(const ConvKey& k) const;
  };
  struct ConvPlan;

 private:
  kern::ActDesc act(const Tensor& t, const char* op, const char* role) const;
  void check_matrix(const Tensor& t, int64_t rows, int64_t cols, const char* op,
                    const char* role) const;
  ConvPlan& plan(const kern::ActDesc& x, const Tensor& w, const ConvGeometry& g, const char* op);
  bool stages_weights() const;
  const void* staged_weight(const Tensor& w, const char* op);
  void* workspace(size_t bytes);
  size_t find_workspace_limit() const;
  cudnnMathType_t wanted_conv_math() const;

  int device_ = 0;
  cudaDeviceProp props_{};
  Precision precision_ = Precision::FP32;
  Layout layout_ = Layout::NHWC;
  DType act_dtype_ = DType::F32;
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t images_ready_ = nullptr;     // copy stream: u8 batch is on the device
  cudaEvent_t images_consumed_ = nullptr;  // compute stream: conversion read it
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;

  std::unordered_map<ConvKey, std::unique_ptr<ConvPlan>, ConvKeyHash> plans_;
  std::unordered_map<const void*, std::unique_ptr<Scratch>> staged_weights_;
  Scratch workspace_;
  Scratch staged_grad_;
  Scratch bn_sums_, bn_packed_, bn_scale_shift_, bn_means_;
  Scratch nchw_scratch_;
  Scratch images_device_, images_pinned_{true};
  Scratch labels_device_, row_loss_device_, argmax_device_, loss_host_{true};
  Scratch flag_device_, flag_host_{true};
};

}  // namespace rd::cuda
