// The layers a ResNet is made of. Each keeps pointers to its slices of the flat
// parameter/gradient/buffer arenas, its own output and input-gradient buffers
// (sized once, reused every step), and whatever forward saves for backward.
// Forward and backward of each layer sit side by side in its .cpp file.
#pragma once

#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/nn/arena.h"
#include "resnet_ddp/nn/resnet.h"

namespace rd::nn {

// Makes `buf` a tensor of `shape` in `layout`, reusing its storage when large
// enough (a smaller last batch reuses the big buffer: N is the outermost axis).
void ensure_tensor(Backend& be, Tensor& buf, const Shape& shape, Layout layout);

// Where a layer writes its input gradient: its own buffer (into == null) or a view
// of a shared backward buffer (`*into`, grown when too small). Backward passes
// rotate a few shared buffers instead of keeping one gradient per layer.
void place_grad(Backend& be, Tensor& dx, const Shape& shape, Layout layout, Tensor* into);

// Parameters register in torchvision state_dict order; this records the indices.
struct ParamRefs {
  std::vector<size_t> params;  // indices into the params/grads arenas
};

struct LayerContext {
  Backend* backend = nullptr;
  Arena* params = nullptr;
  Arena* grads = nullptr;
  Arena* buffers = nullptr;
  bool training = true;
  ChannelReducer* bn_reducer = nullptr;
  BackwardHooks* hooks = nullptr;
  bool accumulate = false;
  void grads_ready(const ParamRefs& refs) const {
    if (!hooks) return;
    for (size_t i : refs.params) hooks->on_grad_ready(i);
    hooks->poll();
  }
};

class Conv2d {
 public:
  Conv2d(Arena& params, const std::string& name, int in_ch, int out_ch, int kernel, int stride,
         int pad, int groups = 1);
  const Tensor& forward(LayerContext& ctx, const Tensor& x);
  // Returns dx (unless `need_dx` is false, then an undefined tensor).
  const Tensor& backward(LayerContext& ctx, const Tensor& dy, bool need_dx = true,
                         Tensor* into = nullptr);
  void init(Backend& be, Arena& params, uint64_t seed);
  // Plans this convolution for an (n, in_ch, h, w) input (Backend::plan_convolution);
  // h and w become the output's.
  void plan(Backend& be, int64_t n, int64_t& h, int64_t& w, bool training, bool need_dx) const {
    be.plan_convolution(Shape{n, in_ch, h, w}, Shape{out_ch, in_ch / geom.groups, geom.kernel, geom.kernel}, geom,
                        training && need_dx, training);
    h = conv_out_size(h, geom.kernel, geom.stride, geom.pad);
    w = conv_out_size(w, geom.kernel, geom.stride, geom.pad);
  }

  ParamRefs refs;
  int in_ch, out_ch;
  ConvGeometry geom;

 private:
  const Tensor* x_ = nullptr;
  Tensor y_, dx_;
};

class BatchNorm2d {
 public:
  BatchNorm2d(Arena& params, Arena& buffers, const std::string& name, int channels, bool relu);
  const Tensor& forward(LayerContext& ctx, const Tensor& x);
  const Tensor& backward(LayerContext& ctx, const Tensor& dy, Tensor* into = nullptr);
  void init(Backend& be, Arena& params, Arena& buffers);

  ParamRefs refs;  // weight, bias
  size_t running_mean = 0, running_var = 0;  // indices into buffers
  int channels;
  bool relu;
  float momentum = 0.1f, eps = 1e-5f;

 private:
  // This layer's parameters, buffers and settings as the backend ops take them.
  BatchNormArgs bn_args(const LayerContext& ctx) const;

  const Tensor* x_ = nullptr;
  Tensor y_, dx_;
  Tensor saved_mean_, saved_invstd_;
  BatchNormSaved saved_;
};

class MaxPool2d {
 public:
  MaxPool2d(int kernel, int stride, int pad) : kernel_(kernel), stride_(stride), pad_(pad) {}
  const Tensor& forward(LayerContext& ctx, const Tensor& x);
  const Tensor& backward(LayerContext& ctx, const Tensor& dy, Tensor* into = nullptr);
  int64_t out_size(int64_t in) const { return conv_out_size(in, kernel_, stride_, pad_); }

 private:
  int kernel_, stride_, pad_;
  Tensor y_, dx_, workspace_;
  Shape x_shape_;
};

class GlobalAvgPool {
 public:
  const Tensor& forward(LayerContext& ctx, const Tensor& x);
  const Tensor& backward(LayerContext& ctx, const Tensor& dy, Tensor* into = nullptr);

 private:
  Tensor y_, dx_;
  Shape x_shape_;
};

class Linear {
 public:
  Linear(Arena& params, const std::string& name, int in_features, int out_features);
  const Tensor& forward(LayerContext& ctx, const Tensor& x);
  const Tensor& backward(LayerContext& ctx, const Tensor& dy, bool need_dx = true);
  void init(Backend& be, Arena& params, uint64_t seed);

  ParamRefs refs;  // weight, bias
  int in_features, out_features;

 private:
  const Tensor* x_ = nullptr;
  Tensor y_, dx_;
};

class ReLU {
 public:
  const Tensor& forward(LayerContext& ctx, const Tensor& x);
  const Tensor& backward(LayerContext& ctx, const Tensor& dy);

 private:
  Tensor y_, dx_;
};

}  // namespace rd::nn
