// Convolution on oneDNN. Activations stay in the backend's layout (src/dst
// descriptors are fixed: nChw16c by default, which every oneDNN convolution reads
// natively); only the weights are reordered between PyTorch's OIHW (the flat arena)
// and whatever blocked format each primitive prefers. The exceptions are converted
// on the way in (and out): bf16 inputs in bf16 mode, and, with the plain NHWC/NCHW
// layouts, the nChw16c tensors Winograd 3x3 convolutions need. A plan
// (primitive descriptors, primitives, reorders, weight buffers) is built once per
// shape and cached, and all primitives share one user-managed scratchpad, so a
// training step allocates nothing. Grouped convolutions (ConvGeometry::groups > 1)
// run on oneDNN's grouped primitives (goihw weights, the same bytes as PyTorch's
// (O, I/G, k, k)); the Winograd paths, oneDNN's and our own, are for groups == 1 only.
#include <algorithm>
#include <sstream>
#include <string>
#include <utility>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/layout.h"
#include "resnet_ddp/errors.h"

namespace rd::cpu {

// Smallest output side for which the own Winograd kernels run by default (below it
// the tiles are mostly padding).
constexpr int64_t kOwnWinogradMinSize = 4;
// Smallest output side for which they use F(4x4,3x3) rather than F(2x2,3x3).
// Measured with bench/conv_bench (own2 vs own4 vs direct, AVX2 cap, 2 threads,
// docs/performance.md): F(4x4) was faster or equal at the ResNet shapes from 7x7
// (ResNet-50's last stage) to 61x61; at 4x4 to 6x6 it was not reliably faster (its 4x4
// tiles are mostly padding at 5x5 and 6x6) and F(2x2)'s rounding error is 10-20x
// smaller, so those keep F(2x2). The rule is fixed rather than timed at plan time so
// that a run's arithmetic, and so its results, do not depend on the machine's load.
constexpr int64_t kOwnWinogradF4MinSize = 7;

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

static tag activation_tag(Layout l) {
  switch (l) {
    case Layout::NCHW16C: return tag::nChw16c;
    case Layout::NCHW8C: return tag::nChw8c;
    case Layout::NHWC: return tag::nhwc;
    default: return tag::nchw;
  }
}

dnnl::memory::desc CpuBackend::activation_md(const Shape& s) const {
  return dnnl::memory::desc({s[0], s[1], s[2], s[3]}, dt::f32, activation_tag(layout_for_channels(s[1])));
}

void* CpuBackend::scratchpad(const dnnl::memory::desc& md) {
  const size_t bytes = md.get_size();
  if (bytes > scratch_bytes_) {
    scratch_ = allocate(bytes);
    scratch_bytes_ = bytes;
  }
  return scratch_.get();
}

// Winograd pays off only when the output has several 4x4 tiles per image and the
// channels fill the 16-wide blocks; at 2x2 or 4x4 outputs it is slower than direct
// (measured on ResNet-18 at 64 px, docs/performance.md).
bool CpuBackend::use_winograd(const Shape& x, const Shape& y, const ConvGeometry& g) const {
  // oneDNN 2.6 has Winograd kernels for AVX-512 only (cpu_isa_defaults()).
  if (conv_algo_ == ConvAlgo::Direct || !isa_.avx512) return false;
  // bf16 mode: fp32 Winograd beats bf16 direct convolution where the bf16 kernels run
  // on AVX512-BF16's dot products, not AMX tiles (isa_.winograd_in_bf16).
  if (precision_ == Precision::BF16 && !isa_.winograd_in_bf16) return false;
  if (g.groups != 1) return false;  // the group-wise products are too small for it
  if (g.kernel != 3 || g.stride != 1 || g.pad != 1) return false;
  if (conv_algo_ == ConvAlgo::Winograd) return true;
  return x[1] % 16 == 0 && y[1] % 16 == 0 && y[2] >= 8 && y[3] >= 8;
}

// AVX2 (no oneDNN Winograd): our F(4x4,3x3) / F(2x2,3x3) kernels on nChw8c, where
// they beat oneDNN's direct AVX2 kernels (measured per ResNet stage, docs/performance.md).
bool CpuBackend::use_own_winograd(const Shape& x, const Shape& y, const ConvGeometry& g) const {
  if (conv_algo_ == ConvAlgo::Direct || isa_.avx512 || precision_ != Precision::FP32) return false;
  if (g.groups != 1) return false;  // our kernels are dense (one group) only
  if (g.kernel != 3 || g.stride != 1 || g.pad != 1) return false;
  if (layout_for_channels(x[1]) != Layout::NCHW8C || layout_for_channels(y[1]) != Layout::NCHW8C) return false;
  if (!winograd::cpu_supported() || !winograd::shape_supported({x[0], x[1], y[1], x[2], x[3]})) return false;
  if (conv_algo_ == ConvAlgo::Winograd) return true;
  return y[2] >= kOwnWinogradMinSize && y[3] >= kOwnWinogradMinSize;
}

// oneDNN's weight dims and plain format: grouped convolutions take (G, O/G, I/G, k, k)
// goihw, which is PyTorch's (O, I/G, k, k) buffer read with O split into its groups.
static dnnl::memory::dims weight_dims(const Shape& w, const ConvGeometry& g) {
  if (g.groups == 1) return {w[0], w[1], w[2], w[3]};
  return {g.groups, w[0] / g.groups, w[1], w[2], w[3]};
}

static tag plain_weight_tag(const ConvGeometry& g) { return g.groups == 1 ? tag::oihw : tag::goihw; }

static int64_t own_winograd_tile(const Shape& y) {
  return std::min(y[2], y[3]) >= kOwnWinogradF4MinSize ? 4 : 2;
}

void* CpuBackend::winograd_workspace(const ConvPlan& p) {
  return grow_buffer(wino_ws_, wino_ws_cap_, winograd::workspace_bytes(p.wino, threads_));
}

// The three primitive descriptors for one algorithm and set of formats; throws
// dnnl::error when oneDNN has no implementation for them.
static void build_descriptors(ConvPlan& p, const dnnl::engine& engine, const Shape& w, const ConvGeometry& g,
                              dnnl::algorithm alg, const dnnl::memory::desc& src, const dnnl::memory::desc& dst,
                              const dnnl::memory::desc& diff_dst, const dnnl::memory::desc& diff_src) {
  const dnnl::memory::dims strides{g.stride, g.stride}, pad{g.pad, g.pad};
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const bool bf16_weights = src.data_type() == dt::bf16;
  const dnnl::memory::desc any_w(weight_dims(w, g), bf16_weights ? dt::bf16 : dt::f32, tag::any);
  const dnnl::memory::desc any_dw(weight_dims(w, g), dt::f32, tag::any);
  p.fwd_pd = dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, src, any_w, dst, strides, pad, pad),
      attr, engine);
  p.bwd_data_pd = dnnl::convolution_backward_data::primitive_desc(
      dnnl::convolution_backward_data::desc(alg, diff_src, any_w, diff_dst, strides, pad, pad), attr, engine,
      p.fwd_pd);
  p.bwd_weights_pd = dnnl::convolution_backward_weights::primitive_desc(
      dnnl::convolution_backward_weights::desc(alg, src, any_dw, diff_dst, strides, pad, pad), attr, engine,
      p.fwd_pd);
  p.x_conv_md = src;
  p.y_conv_md = dst;
  p.dy_conv_md = diff_dst;
  p.dx_conv_md = diff_src;
}

ConvPlan& CpuBackend::conv_plan(const Shape& x, const Shape& w, const Shape& y,
                                const ConvGeometry& g) {
  std::ostringstream key;
  const bool bf16 = precision_ == Precision::BF16;
  key << x.str() << w.str() << g.kernel << "/" << g.stride << "/" << g.pad << "/g" << g.groups << (bf16 ? "/bf16" : "");
  auto it = conv_plans_.find(key.str());
  if (it != conv_plans_.end()) return *it->second;

  RD_CHECK(x.rank == 4 && w.rank == 4 && y.rank == 4 && g.groups > 0 && w[1] * g.groups == x[1] &&
               w[0] == y[1] && w[0] % g.groups == 0 &&
               w[2] == g.kernel && w[3] == g.kernel &&
               y[2] == conv_out_size(x[2], g.kernel, g.stride, g.pad) &&
               y[3] == conv_out_size(x[3], g.kernel, g.stride, g.pad) && y[0] == x[0],
           "conv2d: inconsistent shapes x " << x.str() << " w " << w.str() << " y " << y.str()
                                            << " k" << g.kernel << " s" << g.stride << " p" << g.pad
                                            << " groups " << g.groups);
  auto plan = std::make_unique<ConvPlan>();
  if (use_own_winograd(x, y, g)) {
    plan->own_winograd = true;
    plan->wino = {x[0], x[1], y[1], x[2], x[3]};
    plan->wino.tile = own_winograd_tile(y);
  } else {
    plan->x_act_md = activation_md(x);
    plan->y_act_md = activation_md(y);
    plan->user_weights_md = dnnl::memory::desc(weight_dims(w, g), dt::f32, plain_weight_tag(g));
    choose_primitives(*plan, x, w, y, g);
    prepare_conversions(*plan);
    prepare_weights(*plan);
  }
  ConvPlan& ref = *plan;
  conv_plans_.emplace(key.str(), std::move(plan));
  return ref;
}

// oneDNN's Winograd where use_winograd() asks for it and oneDNN has it, else direct
// convolution in the first formats oneDNN runs with JIT (not reference) kernels.
void CpuBackend::choose_primitives(ConvPlan& p, const Shape& x, const Shape& w, const Shape& y,
                                   const ConvGeometry& g) {
  const bool bf16 = precision_ == Precision::BF16;
  bool built = false;
  if (use_winograd(x, y, g)) {
    const dnnl::memory::desc xb({x[0], x[1], x[2], x[3]}, dt::f32, tag::nChw16c);
    const dnnl::memory::desc yb({y[0], y[1], y[2], y[3]}, dt::f32, tag::nChw16c);
    try {
      build_descriptors(p, engine_, w, g, dnnl::algorithm::convolution_winograd, xb, yb, yb, xb);
      built = true;
    } catch (const dnnl::error&) {
      // No Winograd implementation on this CPU or for this shape: direct below.
    }
  }
  if (!built) {
    // Direct convolution in the activations' own layout; where oneDNN has no JIT kernel
    // for that layout and shape it would run its reference code (100x slower: AVX2's
    // nChw8c backward-weights with a 2x2 input and a 3x3 kernel), so the plan then
    // converts to NHWC, and failing that NCHW, around the primitives instead.
    const auto uses_reference = [&] {
      for (const char* impl : {p.fwd_pd.impl_info_str(), p.bwd_data_pd.impl_info_str(),
                               p.bwd_weights_pd.impl_info_str()})
        if (std::string(impl).find("ref") != std::string::npos) return true;
      return false;
    };
    const tag act_x = activation_tag(layout_for_channels(x[1])), act_y = activation_tag(layout_for_channels(y[1]));
    const std::pair<tag, tag> candidates[] = {{act_x, act_y}, {tag::nhwc, tag::nhwc}, {tag::nchw, tag::nchw}};
    for (const auto& [tx, ty] : candidates) {
      const dnnl::memory::desc xf({x[0], x[1], x[2], x[3]}, dt::f32, tx), yf({y[0], y[1], y[2], y[3]}, dt::f32, ty);
      const dnnl::memory::desc xs({x[0], x[1], x[2], x[3]}, bf16 ? dt::bf16 : dt::f32, tx);
      const dnnl::memory::desc ys({y[0], y[1], y[2], y[3]}, bf16 ? dt::bf16 : dt::f32, ty);
      build_descriptors(p, engine_, w, g, dnnl::algorithm::convolution_direct, xs, yf, ys, xf);
      if (!uses_reference()) break;
    }
  }
  p.fwd = dnnl::convolution_forward(p.fwd_pd);
  p.bwd_data = dnnl::convolution_backward_data(p.bwd_data_pd);
  p.bwd_weights = dnnl::convolution_backward_weights(p.bwd_weights_pd);
}

// Reorders between the backend's activations and the formats the primitives chose.
void CpuBackend::prepare_conversions(ConvPlan& p) {
  const auto unbound = [&](const dnnl::memory::desc& md) { return dnnl::memory(md, engine_, DNNL_MEMORY_NONE); };
  p.convert_x = p.x_conv_md != p.x_act_md;
  p.convert_dy = p.dy_conv_md != p.y_act_md;
  if (p.convert_x) p.x_to_conv = dnnl::reorder(unbound(p.x_act_md), unbound(p.x_conv_md));
  if (p.convert_dy) p.dy_to_conv = dnnl::reorder(unbound(p.y_act_md), unbound(p.dy_conv_md));
  // Outputs need converting back only when the primitive writes another format
  // (Winograd with the plain layouts).
  p.convert_y = p.y_conv_md != p.y_act_md;
  p.convert_dx = p.dx_conv_md != p.x_act_md;
  if (p.convert_y) p.y_from_conv = dnnl::reorder(unbound(p.y_conv_md), unbound(p.y_act_md));
  if (p.convert_dx) p.dx_from_conv = dnnl::reorder(unbound(p.dx_conv_md), unbound(p.x_act_md));
}

// The weights in each primitive's preferred format (reordered from PyTorch's OIHW
// every step) and the weight gradient's way back, plain or added (accumulate).
void CpuBackend::prepare_weights(ConvPlan& p) {
  const auto unbound = [&](const dnnl::memory::desc& md) { return dnnl::memory(md, engine_, DNNL_MEMORY_NONE); };
  auto own = [&](const dnnl::memory::desc& md) {
    // Buffers are owned by the backend allocator so they are 64-byte aligned.
    auto storage = allocate(md.get_size());
    dnnl::memory m(md, engine_, storage.get());
    plans_storage_.push_back(storage);
    return m;
  };
  p.fwd_weights_plain = p.fwd_pd.weights_desc() == p.user_weights_md;
  p.bwd_data_weights_plain = p.bwd_data_pd.weights_desc() == p.user_weights_md;
  const dnnl::memory user_w = unbound(p.user_weights_md);
  if (!p.fwd_weights_plain) {
    p.fwd_weights = own(p.fwd_pd.weights_desc());
    p.to_fwd_weights = dnnl::reorder(user_w, p.fwd_weights);
  }
  if (!p.bwd_data_weights_plain) {
    p.bwd_data_weights = own(p.bwd_data_pd.weights_desc());
    p.to_bwd_data_weights = dnnl::reorder(user_w, p.bwd_data_weights);
  }
  p.diff_weights = own(p.bwd_weights_pd.diff_weights_desc());
  p.diff_to_user = dnnl::reorder(p.diff_weights, user_w);
  dnnl::primitive_attr sum_attr;
  dnnl::post_ops sum;
  sum.append_sum(1.f);
  sum_attr.set_post_ops(sum);
  p.diff_add_to_user = dnnl::reorder(dnnl::reorder::primitive_desc(p.diff_weights, user_w, sum_attr));
}

void* CpuBackend::grow_buffer(std::shared_ptr<void>& buf, size_t& cap, size_t bytes) {
  if (bytes > cap) {
    buf = allocate(bytes);
    cap = bytes;
  }
  return buf.get();
}

const void* CpuBackend::convert_input(ConvPlan& p, const Tensor& x) {
  if (!p.convert_x) return x.data;
  void* dst = grow_buffer(x_conv_, x_conv_cap_, p.x_conv_md.get_size());
  dnnl::memory from(p.x_act_md, engine_, const_cast<void*>(x.data)), to(p.x_conv_md, engine_, dst);
  p.x_to_conv.execute(stream_, from, to);
  return dst;
}

// Backward converts dy once: a layer's backward-weights (which always converts)
// is followed by its backward-data on the same, unchanged gradient, which reuses it.
const void* CpuBackend::convert_grad(ConvPlan& p, const Tensor& dy, bool may_reuse) {
  if (!p.convert_dy) return dy.data;
  if (may_reuse && dy_conv_source_ == dy.data && dy_conv_plan_ == &p) return dy_conv_.get();
  void* dst = grow_buffer(dy_conv_, dy_conv_cap_, p.dy_conv_md.get_size());
  dnnl::memory from(p.y_act_md, engine_, const_cast<void*>(dy.data)), to(p.dy_conv_md, engine_, dst);
  p.dy_to_conv.execute(stream_, from, to);
  dy_conv_source_ = dy.data;
  dy_conv_plan_ = &p;
  return dst;
}

// The weights a primitive reads: the arena's OIHW slice itself when the primitive
// takes that format, else its blocked copy, refreshed from the arena (weights change
// every step).
dnnl::memory CpuBackend::primitive_weights(ConvPlan& p, const Tensor& w, bool plain,
                                           const dnnl::reorder& to_blocked, dnnl::memory& blocked) {
  dnnl::memory user_w(p.user_weights_md, engine_, const_cast<void*>(w.data));
  if (plain) return user_w;
  to_blocked.execute(stream_, user_w, blocked);
  return blocked;
}

void CpuBackend::conv2d_forward_impl(const Tensor& x, const Tensor& w, Tensor& y,
                                const ConvGeometry& g) {
  ConvPlan& p = conv_plan(x.shape, w.shape, y.shape, g);
  dy_conv_source_ = nullptr;  // a new forward: any cached gradient conversion is stale
  if (p.own_winograd)
    return winograd::forward(p.wino, static_cast<const float*>(x.data), static_cast<const float*>(w.data),
                             static_cast<float*>(y.data), winograd_workspace(p), threads_);
  dnnl::memory src(p.fwd_pd.src_desc(), engine_, const_cast<void*>(convert_input(p, x)));
  void* out = p.convert_y ? grow_buffer(out_conv_, out_conv_cap_, p.y_conv_md.get_size()) : y.data;
  dnnl::memory dst(p.fwd_pd.dst_desc(), engine_, out);
  dnnl::memory weights = primitive_weights(p, w, p.fwd_weights_plain, p.to_fwd_weights, p.fwd_weights);
  dnnl::memory scratch(p.fwd_pd.scratchpad_desc(), engine_, scratchpad(p.fwd_pd.scratchpad_desc()));
  p.fwd.execute(stream_, {{DNNL_ARG_SRC, src},
                          {DNNL_ARG_WEIGHTS, weights},
                          {DNNL_ARG_DST, dst},
                          {DNNL_ARG_SCRATCHPAD, scratch}});
  if (p.convert_y) {
    dnnl::memory y_act(p.y_act_md, engine_, y.data);
    p.y_from_conv.execute(stream_, dst, y_act);
  }
  stream_.wait();
}

void CpuBackend::conv2d_backward_data_impl(const Tensor& dy, const Tensor& w, Tensor& dx,
                                      const ConvGeometry& g) {
  ConvPlan& p = conv_plan(dx.shape, w.shape, dy.shape, g);
  if (p.own_winograd)
    return winograd::backward_data(p.wino, static_cast<const float*>(dy.data), static_cast<const float*>(w.data),
                                   static_cast<float*>(dx.data), winograd_workspace(p), threads_);
  dnnl::memory diff_dst(p.bwd_data_pd.diff_dst_desc(), engine_, const_cast<void*>(convert_grad(p, dy, true)));
  void* out = p.convert_dx ? grow_buffer(out_conv_, out_conv_cap_, p.dx_conv_md.get_size()) : dx.data;
  dnnl::memory diff_src(p.bwd_data_pd.diff_src_desc(), engine_, out);
  dnnl::memory weights = primitive_weights(p, w, p.bwd_data_weights_plain, p.to_bwd_data_weights,
                                           p.bwd_data_weights);
  const auto sp_md = p.bwd_data_pd.scratchpad_desc();
  dnnl::memory scratch(sp_md, engine_, scratchpad(sp_md));
  p.bwd_data.execute(stream_, {{DNNL_ARG_DIFF_DST, diff_dst},
                               {DNNL_ARG_WEIGHTS, weights},
                               {DNNL_ARG_DIFF_SRC, diff_src},
                               {DNNL_ARG_SCRATCHPAD, scratch}});
  if (p.convert_dx) {
    dnnl::memory dx_act(p.x_act_md, engine_, dx.data);
    p.dx_from_conv.execute(stream_, diff_src, dx_act);
  }
  stream_.wait();
}

void CpuBackend::conv2d_backward_weights_impl(const Tensor& x, const Tensor& dy, Tensor& dw,
                                         const ConvGeometry& g, bool accumulate) {
  ConvPlan& p = conv_plan(x.shape, dw.shape, dy.shape, g);
  if (p.own_winograd)
    return winograd::backward_weights(p.wino, static_cast<const float*>(x.data), static_cast<const float*>(dy.data),
                                      static_cast<float*>(dw.data), accumulate, winograd_workspace(p), threads_);
  dnnl::memory src(p.bwd_weights_pd.src_desc(), engine_, const_cast<void*>(convert_input(p, x)));
  dnnl::memory diff_dst(p.bwd_weights_pd.diff_dst_desc(), engine_,
                        const_cast<void*>(convert_grad(p, dy, false)));
  dnnl::memory user_dw(p.user_weights_md, engine_, dw.data);
  const auto sp_md = p.bwd_weights_pd.scratchpad_desc();
  dnnl::memory scratch(sp_md, engine_, scratchpad(sp_md));
  p.bwd_weights.execute(stream_, {{DNNL_ARG_SRC, src},
                                  {DNNL_ARG_DIFF_DST, diff_dst},
                                  {DNNL_ARG_DIFF_WEIGHTS, p.diff_weights},
                                  {DNNL_ARG_SCRATCHPAD, scratch}});
  (accumulate ? p.diff_add_to_user : p.diff_to_user).execute(stream_, p.diff_weights, user_dw);
  stream_.wait();
}

}  // namespace rd::cpu
