// Linear (fully connected) layer and the ReLU between the head's two linears.
#include <cmath>
#include <random>

#include "nn/layers.h"
#include "resnet_ddp/errors.h"

namespace rd::nn {

Linear::Linear(Arena& params, const std::string& name, int in, int out)
    : in_features(in), out_features(out) {
  refs.params.push_back(params.add(name + ".weight", Shape{out, in}));
  refs.params.push_back(params.add(name + ".bias", Shape{out}));
}

void Linear::init(Backend& be, Arena& params, uint64_t seed) {
  // torch.nn.Linear.reset_parameters: kaiming_uniform_(a=sqrt(5)) gives
  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the weight; the bias uses the same bound.
  const float bound = 1.f / std::sqrt(static_cast<float>(in_features));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-bound, bound);
  for (size_t idx : refs.params) {
    std::vector<float> host(params.slice(idx).count);
    for (float& v : host) v = dist(rng);
    be.copy_from_host(params.ptr(idx), host.data(), host.size() * sizeof(float));
  }
}

const Tensor& Linear::forward(LayerContext& ctx, const Tensor& x) {
  RD_CHECK(x.shape.rank == 2 && x.shape[1] == in_features,
           "Linear: expected (N, " << in_features << "), got " << x.describe());
  Backend& be = *ctx.backend;
  ensure_tensor(be, y_, Shape{x.shape[0], out_features}, Layout::RowMajor);
  Tensor w = ctx.params->tensor(refs.params[0]);
  be.linear_forward(x, w, ctx.params->ptr(refs.params[1]), y_);
  x_ = &x;
  return y_;
}

const Tensor& Linear::backward(LayerContext& ctx, const Tensor& dy, bool need_dx) {
  Backend& be = *ctx.backend;
  Tensor w = ctx.params->tensor(refs.params[0]);
  Tensor dw = ctx.grads->tensor(refs.params[0]);
  if (need_dx) ensure_tensor(be, dx_, x_->shape, Layout::RowMajor);
  be.linear_backward(*x_, w, dy, need_dx ? &dx_ : nullptr, dw, ctx.grads->ptr(refs.params[1]),
                     ctx.accumulate);
  ctx.grads_ready(refs);
  return dx_;
}

const Tensor& ReLU::forward(LayerContext& ctx, const Tensor& x) {
  ensure_tensor(*ctx.backend, y_, x.shape, x.layout);
  ctx.backend->relu_forward(x, y_);
  return y_;
}

const Tensor& ReLU::backward(LayerContext& ctx, const Tensor& dy) {
  ensure_tensor(*ctx.backend, dx_, dy.shape, dy.layout);
  ctx.backend->relu_backward(y_, dy, dx_);
  return dx_;
}

}  // namespace rd::nn
