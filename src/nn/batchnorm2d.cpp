// BatchNorm2d (optionally fused with the ReLU that follows it), training and eval
// modes, synchronised across ranks when the context carries a reducer.
#include "nn/layers.h"
#include "resnet_ddp/errors.h"

namespace rd::nn {

BatchNorm2d::BatchNorm2d(Arena& params, Arena& buffers, const std::string& name, int ch,
                         bool fuse_relu)
    : channels(ch), relu(fuse_relu) {
  refs.params.push_back(params.add(name + ".weight", Shape{ch}));
  refs.params.push_back(params.add(name + ".bias", Shape{ch}));
  running_mean = buffers.add(name + ".running_mean", Shape{ch});
  running_var = buffers.add(name + ".running_var", Shape{ch});
}

void BatchNorm2d::init(Backend& be, Arena& params, Arena& buffers) {
  be.fill(params.ptr(refs.params[0]), 1.f, static_cast<size_t>(channels));
  be.fill(params.ptr(refs.params[1]), 0.f, static_cast<size_t>(channels));
  be.fill(buffers.ptr(running_mean), 0.f, static_cast<size_t>(channels));
  be.fill(buffers.ptr(running_var), 1.f, static_cast<size_t>(channels));
}

BatchNormArgs BatchNorm2d::bn_args(const LayerContext& ctx) const {
  BatchNormArgs a;
  a.gamma = ctx.params->ptr(refs.params[0]);
  a.beta = ctx.params->ptr(refs.params[1]);
  a.running_mean = ctx.buffers->ptr(running_mean);
  a.running_var = ctx.buffers->ptr(running_var);
  a.momentum = momentum;
  a.eps = eps;
  a.relu = relu;
  a.sync = ctx.bn_reducer;
  return a;
}

const Tensor& BatchNorm2d::forward(LayerContext& ctx, const Tensor& x) {
  RD_CHECK(x.shape[1] == channels, "BatchNorm2d: expected " << channels << " channels, got "
                                                            << x.describe());
  Backend& be = *ctx.backend;
  ensure_tensor(be, y_, x.shape, x.layout);
  const BatchNormArgs args = bn_args(ctx);
  if (ctx.training) {
    if (!saved_mean_.owner) {
      saved_mean_ = be.tensor(Shape{channels}, Layout::RowMajor);
      saved_invstd_ = be.tensor(Shape{channels}, Layout::RowMajor);
    }
    saved_.mean = saved_mean_.f32();
    saved_.invstd = saved_invstd_.f32();
    be.batchnorm_forward_train(x, args, y_, saved_);
  } else {
    be.batchnorm_forward_eval(x, args, y_);
  }
  x_ = &x;
  return y_;
}

const Tensor& BatchNorm2d::backward(LayerContext& ctx, const Tensor& dy, Tensor* into) {
  RD_CHECK(ctx.training, "BatchNorm2d: backward needs a training-mode forward");
  Backend& be = *ctx.backend;
  place_grad(be, dx_, x_->shape, x_->layout, into);
  BatchNormGrads grads;
  grads.dgamma = ctx.grads->ptr(refs.params[0]);
  grads.dbeta = ctx.grads->ptr(refs.params[1]);
  grads.accumulate = ctx.accumulate;
  be.batchnorm_backward(*x_, y_, dy, bn_args(ctx), saved_, dx_, grads);
  ctx.grads_ready(refs);
  return dx_;
}

}  // namespace rd::nn
