// Max pool (the stem's 3x3/2) and global average pool (before the head).
#include "nn/layers.h"
#include "resnet_ddp/errors.h"

namespace rd::nn {

const Tensor& MaxPool2d::forward(LayerContext& ctx, const Tensor& x) {
  Backend& be = *ctx.backend;
  const int64_t oh = conv_out_size(x.shape[2], kernel_, stride_, pad_);
  const int64_t ow = conv_out_size(x.shape[3], kernel_, stride_, pad_);
  RD_CHECK(oh > 0 && ow > 0, "MaxPool2d: input " << x.describe() << " is too small");
  ensure_tensor(be, y_, Shape{x.shape[0], x.shape[1], oh, ow}, x.layout);
  const size_t ws = be.maxpool_workspace_bytes(y_);
  if (!workspace_.owner || workspace_.capacity < ws)
    workspace_ = be.tensor(Shape{static_cast<int64_t>(ws)}, Layout::RowMajor, DType::U8);
  be.maxpool_forward(x, y_, kernel_, stride_, pad_, workspace_.data);
  x_shape_ = x.shape;
  return y_;
}

const Tensor& MaxPool2d::backward(LayerContext& ctx, const Tensor& dy, Tensor* into) {
  Backend& be = *ctx.backend;
  place_grad(be, dx_, x_shape_, dy.layout, into);
  be.maxpool_backward(dy, dx_, kernel_, stride_, pad_, workspace_.data);
  return dx_;
}

const Tensor& GlobalAvgPool::forward(LayerContext& ctx, const Tensor& x) {
  Backend& be = *ctx.backend;
  ensure_tensor(be, y_, Shape{x.shape[0], x.shape[1]}, Layout::RowMajor);
  be.global_avgpool_forward(x, y_);
  x_shape_ = x.shape;
  return y_;
}

const Tensor& GlobalAvgPool::backward(LayerContext& ctx, const Tensor& dy, Tensor* into) {
  Backend& be = *ctx.backend;
  place_grad(be, dx_, x_shape_, be.layout_for_channels(x_shape_[1]), into);
  be.global_avgpool_backward(dy, dx_);
  return dx_;
}

}  // namespace rd::nn
