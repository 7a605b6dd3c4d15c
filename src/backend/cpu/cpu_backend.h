// CPU backend: oneDNN primitives for convolution (cached per shape, weights
// reordered into oneDNN's preferred blocked format each step), OpenMP loops for
// the memory-bound ops (batch norm, elementwise, pooling, loss, optimizers).
//
// Activations: the trainer uses the layout oneDNN runs natively on this CPU
// (cpu_isa_defaults(): nChw16c on AVX-512, NHWC on AVX2; the 3-channel input stays
// NCHW), so no activation is ever reordered between layers. nChw16c: every per-channel
// op vectorises along 16-wide channel rows. All three layouts work on every CPU.
#pragma once

#include <dnnl.hpp>
#include <map>
#include <chrono>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/winograd_f2x3.h"
#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/backend/cpu_isa.h"

namespace rd::cpu {

// Everything oneDNN needs to run one convolution shape forward and backward.
struct ConvPlan {
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights bwd_weights;
  dnnl::memory::desc user_weights_md;  // PyTorch OIHW
  // Weights in each primitive's preferred format (owned, reused every step).
  dnnl::memory fwd_weights, bwd_data_weights, diff_weights;
  dnnl::reorder to_fwd_weights, to_bwd_data_weights, diff_to_user, diff_add_to_user;
  bool fwd_weights_plain = false, bwd_data_weights_plain = false;
  // The backend's activations (x_act_md, y_act_md) are converted on their way into the
  // primitives when these read another format (x_conv_md, dy_conv_md):
  // - bf16 mode: inputs and output gradients in bf16 (outputs and weight gradients
  //   stay fp32), as PyTorch's autocast does;
  // - Winograd: everything in nChw16c, so outputs are converted back as well.
  bool convert_x = false, convert_dy = false, convert_y = false, convert_dx = false;
  dnnl::memory::desc x_act_md, y_act_md, x_conv_md, dy_conv_md, y_conv_md, dx_conv_md;
  dnnl::reorder x_to_conv, dy_to_conv, y_from_conv, dx_from_conv;
  // AVX2 3x3 stride-1 convolutions run on our own Winograd F(4x4,3x3) or F(2x2,3x3)
  // kernels instead (winograd_f2x3.h, wino.tile); none of the oneDNN members above is
  // then built.
  bool own_winograd = false;
  winograd::Geometry wino{};
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& opts);

  DeviceKind device() const override { return DeviceKind::CPU; }
  std::string name() const override;
  Layout activation_layout() const override { return layout_; }

  std::shared_ptr<void> allocate(size_t bytes) override;
  void copy_from_host(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void fill(float* dst, float value, size_t count) override;
  void synchronize() override {}
  // Host memory: the copy is done at once and there is nothing to wait for.
  void copy_to_host_queued(void* dst, const void* src, size_t bytes) override { copy_to_host(dst, src, bytes); }
  void wait_queued_copies() override {}
  void timing_mark(int index) override;
  double timing_seconds(int from, int to) override;
  size_t maxpool_workspace_bytes(const Tensor& y) override;
  void scale(float* data, float factor, size_t count) override;
  bool all_finite(const float* data, size_t count) override;
  bool unscale_and_check(float* data, float factor, size_t count) override;
  // No graphs: every call's work is done when it returns, there is nothing to replay.
  bool graph_begin() override { return false; }
  int graph_end() override;
  bool graph_launch(int graph) override;
  void graph_drop(int graph) override;
  uint64_t memory_events() override { return *memory_events_; }

 protected:
  // Every contracted op's implementation (include/resnet_ddp/backend/ops.def).
#define RD_BACKEND_OP(name, ret, params, args, kind) ret name##_impl params override;
#include "resnet_ddp/backend/ops.def"

 private:
  ConvPlan& conv_plan(const Shape& x, const Shape& w, const Shape& y, const ConvGeometry& g);
  void choose_primitives(ConvPlan& p, const Shape& x, const Shape& w, const Shape& y, const ConvGeometry& g);
  void prepare_conversions(ConvPlan& p);
  void prepare_weights(ConvPlan& p);
  void reorder_nchw_blocked(const Tensor& t, float* nchw, bool to_blocked);
  dnnl::memory::desc activation_md(const Shape& s) const;
  void* scratchpad(const dnnl::memory::desc& md);
  // The per-channel scratch the batch-norm ops need (sums, scale/shift).
  std::vector<double>& bn_scratch(size_t n);

  bool use_winograd(const Shape& x, const Shape& y, const ConvGeometry& g) const;
  bool use_own_winograd(const Shape& x, const Shape& y, const ConvGeometry& g) const;
  void* winograd_workspace(const ConvPlan& p);
  // Grown-on-demand conversion buffers: the current convolution input / output
  // gradient in the primitive's format, and a Winograd primitive's output.
  void* grow_buffer(std::shared_ptr<void>& buf, size_t& cap, size_t bytes);
  const void* convert_input(ConvPlan& p, const Tensor& x);
  dnnl::memory primitive_weights(ConvPlan& p, const Tensor& w, bool plain,
                                 const dnnl::reorder& to_blocked, dnnl::memory& blocked);
  const void* convert_grad(ConvPlan& p, const Tensor& dy, bool may_reuse);

  // Allocations and frees (memory_events); shared with the deleters, which may run later.
  std::shared_ptr<std::atomic<uint64_t>> memory_events_ = std::make_shared<std::atomic<uint64_t>>(0);
  Layout layout_;
  Precision precision_;
  int threads_;
  ConvAlgo conv_algo_;
  CpuIsaDefaults isa_;  // what this CPU runs natively (layouts, Winograd, bf16)
  std::shared_ptr<void> x_conv_, dy_conv_, out_conv_, wino_ws_;
  size_t x_conv_cap_ = 0, dy_conv_cap_ = 0, out_conv_cap_ = 0, wino_ws_cap_ = 0;
  const void* dy_conv_source_ = nullptr;  // which gradient dy_conv_ holds, converted by which plan
  const ConvPlan* dy_conv_plan_ = nullptr;
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<std::string, std::unique_ptr<ConvPlan>> conv_plans_;
  std::vector<std::shared_ptr<void>> plans_storage_;  // reordered-weight buffers of the plans
  std::shared_ptr<void> scratch_;
  size_t scratch_bytes_ = 0;
  std::vector<double> bn_scratch_;
  std::vector<float> bn_scratch_f_;
  std::vector<int32_t> sum_predictions_;  // softmax_xent_sums' arg-maxes
  std::vector<std::chrono::steady_clock::time_point> marks_;  // timing_mark
  std::vector<bool> marked_;
};

}  // namespace rd::cpu
