// Conv2d without bias (every ResNet conv feeds a batch norm).
#include <cmath>
#include <random>

#include "nn/layers.h"
#include "resnet_ddp/errors.h"

namespace rd::nn {

void ensure_tensor(Backend& be, Tensor& buf, const Shape& shape, Layout layout) {
  // Activations take the backend's storage type (fp16/bf16 in the GPU's mixed
  // precision); matrices (head inputs, logits) and vectors stay fp32.
  const DType dtype = layout == Layout::RowMajor ? DType::F32 : be.activation_dtype();
  const size_t need = static_cast<size_t>(storage_elems(shape, layout)) * dtype_size(dtype);
  if (!buf.owner || buf.capacity < need || buf.dtype != dtype) buf = be.tensor(shape, layout, dtype);
  buf.shape = shape;
  buf.layout = layout;
}

void place_grad(Backend& be, Tensor& dx, const Shape& shape, Layout layout, Tensor* into) {
  if (!into) {
    ensure_tensor(be, dx, shape, layout);
    return;
  }
  ensure_tensor(be, *into, shape, layout);  // grows the shared buffer when needed
  dx = *into;                               // a view sharing its storage
}

Conv2d::Conv2d(Arena& params, const std::string& name, int in, int out, int kernel, int stride,
               int pad, int groups)
    : in_ch(in), out_ch(out) {
  RD_CHECK(groups > 0 && in % groups == 0 && out % groups == 0,
           "Conv2d " << name << ": " << groups << " groups do not divide " << in << " -> " << out << " channels");
  geom.kernel = kernel;
  geom.stride = stride;
  geom.pad = pad;
  geom.groups = groups;
  // PyTorch's (O, I / groups, k, k).
  refs.params.push_back(params.add(name + ".weight", Shape{out, in / groups, kernel, kernel}));
}

void Conv2d::init(Backend& be, Arena& params, uint64_t seed) {
  // torchvision: kaiming_normal_(mode="fan_out", nonlinearity="relu"); PyTorch's fan_out
  // is O * k * k whatever the groups.
  const size_t idx = refs.params[0];
  const ParamSlice& s = params.slice(idx);
  const double fan_out = static_cast<double>(out_ch) * geom.kernel * geom.kernel;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.f, static_cast<float>(std::sqrt(2.0 / fan_out)));
  std::vector<float> host(s.count);
  for (float& v : host) v = dist(rng);
  be.copy_from_host(params.ptr(idx), host.data(), host.size() * sizeof(float));
}

const Tensor& Conv2d::forward(LayerContext& ctx, const Tensor& x) {
  RD_CHECK(x.shape[1] == in_ch, "Conv2d: expected " << in_ch << " input channels, got " << x.describe());
  Backend& be = *ctx.backend;
  const int64_t oh = conv_out_size(x.shape[2], geom.kernel, geom.stride, geom.pad);
  const int64_t ow = conv_out_size(x.shape[3], geom.kernel, geom.stride, geom.pad);
  RD_CHECK(oh > 0 && ow > 0, "Conv2d: input " << x.describe() << " is too small for kernel "
                                              << geom.kernel << " stride " << geom.stride);
  ensure_tensor(be, y_, Shape{x.shape[0], out_ch, oh, ow}, be.layout_for_channels(out_ch));
  Tensor w = ctx.params->tensor(refs.params[0]);
  be.conv2d_forward(x, w, y_, geom);
  x_ = &x;
  return y_;
}

const Tensor& Conv2d::backward(LayerContext& ctx, const Tensor& dy, bool need_dx, Tensor* into) {
  Backend& be = *ctx.backend;
  Tensor w = ctx.params->tensor(refs.params[0]);
  Tensor dw = ctx.grads->tensor(refs.params[0]);
  be.conv2d_backward_weights(*x_, dy, dw, geom, ctx.accumulate);
  ctx.grads_ready(refs);
  if (need_dx) {
    place_grad(be, dx_, x_->shape, x_->layout, into);
    be.conv2d_backward_data(dy, w, dx_, geom);
  }
  return dx_;
}

}  // namespace rd::nn
