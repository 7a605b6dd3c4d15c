// Backend's own members: tensor allocation and the one contract every Backend op
// runs before its implementation (see backend.h): what a caller may pass, checked
// identically for the CPU and the CUDA backend. A backend's own checks after this
// are about its limits only (e.g. cuDNN's int dimensions), never about the shape
// of the API.
#include <cmath>
#include <cstdint>
#include <sstream>
#include <utility>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/errors.h"

namespace rd {

namespace {

// An activation of this backend: 4-D, the layout it uses for that channel count,
// its activation dtype, on its device, with memory unless empty.
void expect_activation(const Backend& be, const Tensor& t, const char* op, const char* role) {
  const bool ok = t.shape.rank == 4 && t.device == be.device() &&
                  t.layout == be.layout_for_channels(t.shape[1]) && t.dtype == be.activation_dtype() &&
                  (t.data || t.numel() == 0);
  RD_CHECK(ok, op << ": " << role << " must be a " << dtype_name(be.activation_dtype()) << " "
                  << layout_name(be.layout_for_channels(t.shape.rank == 4 ? t.shape[1] : 0)) << " "
                  << device_name(be.device()) << " activation (N, C, H, W), got " << t.describe());
}

// A matrix: 2-D RowMajor F32 on the backend's device; rows/cols < 0 mean "any".
void expect_matrix(const Backend& be, const Tensor& t, int64_t rows, int64_t cols, const char* op,
                   const char* role) {
  RD_CHECK(t.shape.rank == 2 && t.layout == Layout::RowMajor && t.dtype == DType::F32 &&
               t.device == be.device() && (t.data || t.numel() == 0),
           op << ": " << role << " must be a f32 RowMajor " << device_name(be.device()) << " matrix, got "
              << t.describe());
  RD_CHECK((rows < 0 || t.shape[0] == rows) && (cols < 0 || t.shape[1] == cols),
           op << ": " << role << " is " << t.shape.str() << ", expected [" << rows << ", " << cols << "]");
}

// relu's operands: an activation, or the MLP head's F32 matrix under any precision.
void expect_activation_or_matrix(const Backend& be, const Tensor& t, const char* op, const char* role) {
  if (t.shape.rank == 2)
    expect_matrix(be, t, -1, -1, op, role);
  else
    expect_activation(be, t, op, role);
}

void expect_same_shape(const Tensor& a, const Tensor& b, const char* op, const char* what) {
  RD_CHECK(a.shape == b.shape && a.layout == b.layout && a.dtype == b.dtype,
           op << ": " << what << " differ: " << a.describe() << " vs " << b.describe());
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (!a || !b || !a_bytes || !b_bytes) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

// `out` must not share memory with `in` (ops that read an input after writing
// part of the output, e.g. convolutions and GEMMs).
void expect_disjoint(const Tensor& out, const Tensor& in, const char* op, const char* out_role,
                     const char* in_role) {
  RD_CHECK(!overlaps(out.data, out.nbytes(), in.data, in.nbytes()),
           op << ": " << out_role << " overlaps " << in_role << " (in-place is not supported here)");
}

// Elementwise ops may run in place: the output is exactly the input or disjoint from it.
void expect_same_or_disjoint(const Tensor& out, const Tensor& in, const char* op, const char* out_role,
                             const char* in_role) {
  RD_CHECK(out.data == in.data || !overlaps(out.data, out.nbytes(), in.data, in.nbytes()),
           op << ": " << out_role << " partly overlaps " << in_role);
}

void expect_conv(const Backend& be, const Tensor& x, const Tensor& w, const Tensor& y, const ConvGeometry& g,
                 const char* op, const char* x_role, const char* y_role) {
  expect_activation(be, x, op, x_role);
  expect_activation(be, y, op, y_role);
  RD_CHECK(g.kernel > 0 && g.stride > 0 && g.pad >= 0 && g.groups > 0,
           op << ": bad geometry kernel " << g.kernel << " stride " << g.stride << " pad " << g.pad << " groups "
              << g.groups);
  RD_CHECK(w.shape.rank == 4 && w.layout == Layout::RowMajor && w.dtype == DType::F32 && w.device == be.device() &&
               (w.data || w.numel() == 0),
           op << ": weight must be a f32 RowMajor (O, I / groups, kh, kw) tensor, got " << w.describe());
  RD_CHECK(x.shape[1] % g.groups == 0 && y.shape[1] % g.groups == 0,
           op << ": " << g.groups << " groups do not divide " << x_role << " channels " << x.shape[1] << " and "
              << y_role << " channels " << y.shape[1]);
  RD_CHECK(w.shape[1] * g.groups == x.shape[1] && w.shape[2] == g.kernel && w.shape[3] == g.kernel &&
               w.shape[0] == y.shape[1],
           op << ": weight " << w.shape.str() << " does not match " << x_role << " " << x.shape.str() << ", "
              << y_role << " " << y.shape.str() << ", kernel " << g.kernel << " and " << g.groups << " groups");
  const int64_t oh = conv_out_size(x.shape[2], g.kernel, g.stride, g.pad);
  const int64_t ow = conv_out_size(x.shape[3], g.kernel, g.stride, g.pad);
  RD_CHECK(y.shape[0] == x.shape[0] && y.shape[2] == oh && y.shape[3] == ow && oh > 0 && ow > 0,
           op << ": " << y_role << " is " << y.shape.str() << ", expected [" << x.shape[0] << ", " << w.shape[0]
              << ", " << oh << ", " << ow << "] for " << x_role << " " << x.shape.str());
  expect_disjoint(y, x, op, y_role, x_role);
}

void expect_bn_vectors(const BatchNormArgs& a, const char* op) {
  RD_CHECK(a.gamma && a.beta, op << ": gamma and beta are required");
  RD_CHECK(a.eps > 0.f && std::isfinite(a.eps), op << ": eps must be > 0, got " << a.eps);
}

void expect_pool_window(int kernel, int stride, int pad, const char* op) {
  RD_CHECK(kernel > 0 && stride > 0 && pad >= 0 && 2 * pad <= kernel,
           op << ": bad kernel " << kernel << " stride " << stride << " pad " << pad);
}

}  // namespace

Tensor Backend::tensor(const Shape& shape, Layout layout, DType dtype) {
  Tensor t;
  t.shape = shape;
  t.dtype = dtype;
  t.device = device();
  t.layout = layout;
  t.capacity = t.nbytes();
  t.owner = allocate(t.capacity);
  t.data = t.owner.get();
  return t;
}

// ---- data movement ---------------------------------------------------------------

void Backend::copy_from_host_nchw(const float* src, Tensor& dst) {
  expect_activation(*this, dst, "copy_from_host_nchw", "destination");
  RD_CHECK(src || dst.numel() == 0, "copy_from_host_nchw: source missing");
  copy_from_host_nchw_impl(src, dst);
}

void Backend::copy_to_host_nchw(const Tensor& src, float* dst) {
  expect_activation(*this, src, "copy_to_host_nchw", "source");
  RD_CHECK(dst || src.numel() == 0, "copy_to_host_nchw: destination missing");
  copy_to_host_nchw_impl(src, dst);
}

void Backend::erase_rectangles(Tensor& x, const int32_t* boxes) {
  expect_activation(*this, x, "erase_rectangles", "tensor");
  RD_CHECK(boxes || x.shape[0] == 0, "erase_rectangles: boxes missing");
  for (int64_t n = 0; n < x.shape[0]; ++n) {
    const int32_t* b = boxes + 4 * n;
    RD_CHECK(b[0] >= 0 && b[1] >= 0 && b[2] >= 0 && b[3] >= 0 && b[0] + b[2] <= x.shape[2] && b[1] + b[3] <= x.shape[3],
             "erase_rectangles: image " << n << "'s box (top " << b[0] << ", left " << b[1] << ", " << b[2] << "x"
                                        << b[3] << ") is outside " << x.describe());
  }
  erase_rectangles_impl(x, boxes);
}

void Backend::images_u8_to_activation(const uint8_t* src_nhwc, Tensor& dst, const float* mean, const float* std) {
  expect_activation(*this, dst, "images_u8_to_activation", "destination");
  RD_CHECK(dst.shape[1] == 3, "images_u8_to_activation: destination must have 3 channels, got " << dst.describe());
  RD_CHECK(src_nhwc || dst.numel() == 0, "images_u8_to_activation: source missing");
  if (std)
    for (int c = 0; c < 3; ++c)
      RD_CHECK(std[c] != 0.f && std::isfinite(std[c]),
               "images_u8_to_activation: std[" << c << "] = " << std[c] << " (must be finite, non-zero)");
  images_u8_to_activation_impl(src_nhwc, dst, mean, std);
}

// ---- convolution ----------------------------------------------------------------------

void Backend::conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g) {
  expect_conv(*this, x, w, y, g, "conv2d_forward", "x", "y");
  conv2d_forward_impl(x, w, y, g);
}

void Backend::conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx, const ConvGeometry& g) {
  expect_conv(*this, dx, w, dy, g, "conv2d_backward_data", "dx", "dy");
  conv2d_backward_data_impl(dy, w, dx, g);
}

void Backend::conv2d_backward_weights(const Tensor& x, const Tensor& dy, Tensor& dw, const ConvGeometry& g,
                                      bool accumulate) {
  expect_conv(*this, x, dw, dy, g, "conv2d_backward_weights", "x", "dy");
  expect_disjoint(dw, x, "conv2d_backward_weights", "dw", "x");
  expect_disjoint(dw, dy, "conv2d_backward_weights", "dw", "dy");
  conv2d_backward_weights_impl(x, dy, dw, g, accumulate);
}

// ---- batch norm ----------------------------------------------------------------------------

void Backend::batchnorm_forward_train(const Tensor& x, const BatchNormArgs& a, Tensor& y, BatchNormSaved& saved) {
  const char* op = "batchnorm_forward_train";
  expect_activation(*this, x, op, "x");
  expect_activation(*this, y, op, "y");
  expect_same_shape(x, y, op, "x and y");
  expect_same_or_disjoint(y, x, op, "y", "x");
  expect_bn_vectors(a, op);
  RD_CHECK(a.running_mean && a.running_var, op << ": running statistics missing");
  RD_CHECK(a.momentum >= 0.f && a.momentum <= 1.f, op << ": momentum " << a.momentum << " not in [0, 1]");
  RD_CHECK(saved.mean && saved.invstd, op << ": saved.mean/invstd not allocated");
  RD_CHECK(x.shape[0] * x.shape[2] * x.shape[3] > 0, op << ": empty batch " << x.shape.str());
  batchnorm_forward_train_impl(x, a, y, saved);
}

void Backend::batchnorm_forward_eval(const Tensor& x, const BatchNormArgs& a, Tensor& y) {
  const char* op = "batchnorm_forward_eval";
  expect_activation(*this, x, op, "x");
  expect_activation(*this, y, op, "y");
  expect_same_shape(x, y, op, "x and y");
  expect_same_or_disjoint(y, x, op, "y", "x");
  expect_bn_vectors(a, op);
  RD_CHECK(a.running_mean && a.running_var, op << ": running statistics missing");
  batchnorm_forward_eval_impl(x, a, y);
}

void Backend::batchnorm_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const BatchNormArgs& a,
                                 const BatchNormSaved& saved, Tensor& dx, const BatchNormGrads& grads) {
  const char* op = "batchnorm_backward";
  expect_activation(*this, x, op, "x");
  expect_activation(*this, dy, op, "dy");
  expect_activation(*this, dx, op, "dx");
  expect_same_shape(x, dy, op, "x and dy");
  expect_same_shape(x, dx, op, "x and dx");
  if (a.relu) {
    expect_activation(*this, y, op, "y");
    expect_same_shape(x, y, op, "x and y");
  }
  // dx is written while x (and y) are still read; dy may be overwritten in place.
  expect_disjoint(dx, x, op, "dx", "x");
  if (a.relu) expect_disjoint(dx, y, op, "dx", "y");
  expect_same_or_disjoint(dx, dy, op, "dx", "dy");
  expect_bn_vectors(a, op);
  RD_CHECK(saved.mean && saved.invstd, op << ": saved statistics missing (forward_train first)");
  RD_CHECK(grads.dgamma && grads.dbeta, op << ": dgamma and dbeta are required");
  batchnorm_backward_impl(x, y, dy, a, saved, dx, grads);
}

// ---- elementwise ---------------------------------------------------------------------------

void Backend::relu_forward(const Tensor& x, Tensor& y) {
  expect_activation_or_matrix(*this, x, "relu_forward", "x");
  expect_same_shape(x, y, "relu_forward", "x and y");
  expect_activation_or_matrix(*this, y, "relu_forward", "y");
  expect_same_or_disjoint(y, x, "relu_forward", "y", "x");
  relu_forward_impl(x, y);
}

void Backend::relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  expect_activation_or_matrix(*this, y, "relu_backward", "y");
  expect_same_shape(y, dy, "relu_backward", "y and dy");
  expect_same_shape(y, dx, "relu_backward", "y and dx");
  expect_activation_or_matrix(*this, dy, "relu_backward", "dy");
  expect_activation_or_matrix(*this, dx, "relu_backward", "dx");
  expect_same_or_disjoint(dx, y, "relu_backward", "dx", "y");
  expect_same_or_disjoint(dx, dy, "relu_backward", "dx", "dy");
  relu_backward_impl(y, dy, dx);
}

void Backend::add_forward(const Tensor& a, const Tensor& b, bool relu, Tensor& y) {
  expect_activation(*this, a, "add_forward", "a");
  expect_activation(*this, b, "add_forward", "b");
  expect_activation(*this, y, "add_forward", "y");
  expect_same_shape(a, b, "add_forward", "a and b");
  expect_same_shape(a, y, "add_forward", "a and y");
  expect_same_or_disjoint(y, a, "add_forward", "y", "a");
  expect_same_or_disjoint(y, b, "add_forward", "y", "b");
  add_forward_impl(a, b, relu, y);
}

void Backend::add_backward(const Tensor& y, const Tensor& dy, bool relu, Tensor& dsum) {
  expect_activation(*this, dy, "add_backward", "dy");
  expect_activation(*this, dsum, "add_backward", "dsum");
  expect_same_shape(dy, dsum, "add_backward", "dy and dsum");
  expect_same_or_disjoint(dsum, dy, "add_backward", "dsum", "dy");
  if (relu) {
    expect_activation(*this, y, "add_backward", "y");
    expect_same_shape(y, dy, "add_backward", "y and dy");
    expect_same_or_disjoint(dsum, y, "add_backward", "dsum", "y");
  }
  add_backward_impl(y, dy, relu, dsum);
}

void Backend::accumulate(const Tensor& src, Tensor& dst) {
  expect_activation_or_matrix(*this, src, "accumulate", "src");
  expect_same_shape(src, dst, "accumulate", "src and dst");
  expect_activation_or_matrix(*this, dst, "accumulate", "dst");
  expect_disjoint(dst, src, "accumulate", "dst", "src");
  accumulate_impl(src, dst);
}

// ---- pooling ------------------------------------------------------------------------------

void Backend::maxpool_forward(const Tensor& x, Tensor& y, int kernel, int stride, int pad, void* workspace) {
  const char* op = "maxpool_forward";
  expect_activation(*this, x, op, "x");
  expect_activation(*this, y, op, "y");
  expect_pool_window(kernel, stride, pad, op);
  RD_CHECK(y.shape[0] == x.shape[0] && y.shape[1] == x.shape[1] &&
               y.shape[2] == conv_out_size(x.shape[2], kernel, stride, pad) &&
               y.shape[3] == conv_out_size(x.shape[3], kernel, stride, pad),
           op << ": y " << y.shape.str() << " does not match x " << x.shape.str());
  RD_CHECK(x.numel() < (int64_t(1) << 31), op << ": input " << x.shape.str() << " too large for 32-bit indices");
  RD_CHECK(workspace || y.numel() == 0, op << ": workspace missing (maxpool_workspace_bytes)");
  expect_disjoint(y, x, op, "y", "x");
  maxpool_forward_impl(x, y, kernel, stride, pad, workspace);
}

void Backend::maxpool_backward(const Tensor& dy, Tensor& dx, int kernel, int stride, int pad, const void* workspace) {
  const char* op = "maxpool_backward";
  expect_activation(*this, dy, op, "dy");
  expect_activation(*this, dx, op, "dx");
  expect_pool_window(kernel, stride, pad, op);
  RD_CHECK(dy.shape[0] == dx.shape[0] && dy.shape[1] == dx.shape[1] &&
               dy.shape[2] == conv_out_size(dx.shape[2], kernel, stride, pad) &&
               dy.shape[3] == conv_out_size(dx.shape[3], kernel, stride, pad),
           op << ": dy " << dy.shape.str() << " does not match dx " << dx.shape.str());
  RD_CHECK(workspace || dy.numel() == 0, op << ": workspace missing");
  expect_disjoint(dx, dy, op, "dx", "dy");
  maxpool_backward_impl(dy, dx, kernel, stride, pad, workspace);
}

void Backend::global_avgpool_forward(const Tensor& x, Tensor& y) {
  expect_activation(*this, x, "global_avgpool_forward", "x");
  expect_matrix(*this, y, x.shape[0], x.shape[1], "global_avgpool_forward", "y");
  expect_disjoint(y, x, "global_avgpool_forward", "y", "x");
  global_avgpool_forward_impl(x, y);
}

void Backend::global_avgpool_backward(const Tensor& dy, Tensor& dx) {
  expect_activation(*this, dx, "global_avgpool_backward", "dx");
  expect_matrix(*this, dy, dx.shape[0], dx.shape[1], "global_avgpool_backward", "dy");
  expect_disjoint(dx, dy, "global_avgpool_backward", "dx", "dy");
  global_avgpool_backward_impl(dy, dx);
}

// ---- linear ----------------------------------------------------------------------------------

void Backend::linear_forward(const Tensor& x, const Tensor& w, const float* b, Tensor& y) {
  const char* op = "linear_forward";
  expect_matrix(*this, w, -1, -1, op, "w");
  expect_matrix(*this, x, -1, w.shape[1], op, "x");
  expect_matrix(*this, y, x.shape[0], w.shape[0], op, "y");
  expect_disjoint(y, x, op, "y", "x");
  expect_disjoint(y, w, op, "y", "w");
  linear_forward_impl(x, w, b, y);
}

void Backend::linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                              float* db, bool accumulate) {
  const char* op = "linear_backward";
  expect_matrix(*this, w, -1, -1, op, "w");
  expect_matrix(*this, x, -1, w.shape[1], op, "x");
  expect_matrix(*this, dy, x.shape[0], w.shape[0], op, "dy");
  expect_matrix(*this, dw, w.shape[0], w.shape[1], op, "dw");
  expect_disjoint(dw, x, op, "dw", "x");
  expect_disjoint(dw, dy, op, "dw", "dy");
  if (dx) {
    expect_matrix(*this, *dx, x.shape[0], w.shape[1], op, "dx");
    expect_disjoint(*dx, x, op, "dx", "x");  // x is read again for dw
    expect_disjoint(*dx, dy, op, "dx", "dy");
    expect_disjoint(*dx, w, op, "dx", "w");
  }
  linear_backward_impl(x, w, dy, dx, dw, db, accumulate);
}

// ---- loss ------------------------------------------------------------------------------------

double Backend::softmax_xent(const Tensor& logits, const int32_t* labels, float smoothing, float grad_scale,
                             Tensor* dlogits, int32_t* predictions) {
  const char* op = "softmax_xent";
  expect_matrix(*this, logits, -1, -1, op, "logits");
  const int64_t n = logits.shape[0], k = logits.shape[1];
  RD_CHECK(k > 0, op << ": logits have no classes");
  RD_CHECK(smoothing >= 0.f && smoothing <= 1.f, op << ": smoothing " << smoothing << " not in [0, 1]");
  RD_CHECK(labels || n == 0, op << ": labels missing");
  for (int64_t i = 0; i < n; ++i)
    RD_CHECK(labels[i] >= 0 && labels[i] < k,
             op << ": label " << labels[i] << " of row " << i << " is outside [0, " << k << ")");
  if (dlogits) expect_matrix(*this, *dlogits, n, k, op, "dlogits");
  return softmax_xent_impl(logits, labels, smoothing, grad_scale, dlogits, predictions);
}

// ---- MixUp / CutMix (torchvision's reference recipe) --------------------------------------------------------------

void Backend::mix_images(const Tensor& src, Tensor& dst, const math::ImageMix& mix) {
  const char* op = "mix_images";
  expect_activation(*this, src, op, "src");
  expect_activation(*this, dst, op, "dst");
  expect_same_shape(src, dst, op, "src and dst");
  expect_disjoint(dst, src, op, "dst", "src");  // dst_i reads src_{i-1}: no in-place
  if (mix.cutmix) {
    const int64_t h = src.shape[2], w = src.shape[3];
    RD_CHECK(0 <= mix.x0 && mix.x0 <= mix.x1 && mix.x1 <= w && 0 <= mix.y0 && mix.y0 <= mix.y1 && mix.y1 <= h,
             op << ": CutMix box [" << mix.x0 << ", " << mix.x1 << ") x [" << mix.y0 << ", " << mix.y1
                << ") is not inside the " << w << " x " << h << " image");
  } else {
    RD_CHECK(mix.lambda >= 0.f && mix.lambda <= 1.f, op << ": MixUp lambda " << mix.lambda << " not in [0, 1]");
  }
  mix_images_impl(src, dst, mix);
}

double Backend::softmax_xent_mixed(const Tensor& logits, const int32_t* labels, const int32_t* partner_labels,
                                   float lam, float smoothing, float grad_scale, Tensor* dlogits,
                                   int32_t* predictions) {
  const char* op = "softmax_xent_mixed";
  expect_matrix(*this, logits, -1, -1, op, "logits");
  const int64_t n = logits.shape[0], k = logits.shape[1];
  RD_CHECK(k > 0, op << ": logits have no classes");
  RD_CHECK(smoothing >= 0.f && smoothing <= 1.f, op << ": smoothing " << smoothing << " not in [0, 1]");
  RD_CHECK(lam >= 0.f && lam <= 1.f, op << ": lam " << lam << " not in [0, 1]");
  RD_CHECK((labels && partner_labels) || n == 0, op << ": labels missing");
  for (int64_t i = 0; i < n; ++i)
    RD_CHECK(labels[i] >= 0 && labels[i] < k && partner_labels[i] >= 0 && partner_labels[i] < k,
             op << ": labels " << labels[i] << ", " << partner_labels[i] << " of row " << i << " outside [0, " << k
                << ")");
  if (dlogits) expect_matrix(*this, *dlogits, n, k, op, "dlogits");
  return softmax_xent_mixed_impl(logits, labels, partner_labels, lam, smoothing, grad_scale, dlogits, predictions);
}

void Backend::softmax_xent_sums(const Tensor& logits, const int32_t* labels, const int32_t* partner_labels,
                                float lam, float smoothing, float grad_scale, Tensor* dlogits,
                                const int32_t* accuracy_targets, double* sums, const math::AmpStepState* amp) {
  const char* op = "softmax_xent_sums";
  expect_matrix(*this, logits, -1, -1, op, "logits");
  const int64_t n = logits.shape[0], k = logits.shape[1];
  RD_CHECK(k > 0, op << ": logits have no classes");
  RD_CHECK(smoothing >= 0.f && smoothing <= 1.f, op << ": smoothing " << smoothing << " not in [0, 1]");
  RD_CHECK(lam >= 0.f && lam <= 1.f, op << ": lam " << lam << " not in [0, 1]");
  RD_CHECK((labels && accuracy_targets) || n == 0, op << ": labels or accuracy targets missing");
  RD_CHECK(sums, op << ": the sums buffer is missing");
  RD_CHECK(!amp || grad_scale > 0.f, op << ": with a device loss scale, the divisor " << grad_scale << " must be > 0");
  for (int64_t i = 0; i < n; ++i) {
    RD_CHECK(labels[i] >= 0 && labels[i] < k,
             op << ": label " << labels[i] << " of row " << i << " is outside [0, " << k << ")");
    RD_CHECK(!partner_labels || (partner_labels[i] >= 0 && partner_labels[i] < k),
             op << ": partner label " << partner_labels[i] << " of row " << i << " is outside [0, " << k << ")");
    RD_CHECK(accuracy_targets[i] >= 0 && accuracy_targets[i] < k,
             op << ": accuracy target " << accuracy_targets[i] << " of row " << i << " is outside [0, " << k << ")");
  }
  if (dlogits) expect_matrix(*this, *dlogits, n, k, op, "dlogits");
  softmax_xent_sums_impl(logits, labels, partner_labels, lam, smoothing, grad_scale, dlogits, accuracy_targets, sums,
                         amp);
}

void Backend::stage_loss_labels(const int32_t* labels, const int32_t* partner_labels,
                                const int32_t* accuracy_targets, int64_t n) {
  const char* op = "stage_loss_labels";
  RD_CHECK(n >= 0, op << ": n " << n << " is negative");
  RD_CHECK((labels && accuracy_targets) || n == 0, op << ": labels or accuracy targets missing");
  // The class count is the loss's: a label outside it is refused when the loss is recorded
  // (softmax_xent_sums checks the host arrays it is called with, the ones staged here).
  for (int64_t i = 0; i < n; ++i)
    RD_CHECK(labels[i] >= 0 && accuracy_targets[i] >= 0 && (!partner_labels || partner_labels[i] >= 0),
             op << ": a label of row " << i << " is negative");
  stage_loss_labels_impl(labels, partner_labels, accuracy_targets, n);
}

// ---- optimizers ------------------------------------------------------------------------------

void Backend::amp_unscale(float* grads, size_t count, math::AmpStepState* state, bool found_inf_elsewhere) {
  RD_CHECK(state, "amp_unscale: the step state is missing");
  RD_CHECK(count == 0 || grads, "amp_unscale: the gradient buffer is missing");
  amp_unscale_impl(grads, count, state, found_inf_elsewhere);
}

void Backend::set_optimizer_scalars(math::OptimizerStepScalars* dst, const math::OptimizerStepScalars& values) {
  RD_CHECK(dst, "set_optimizer_scalars: the destination is missing");
  RD_CHECK(std::isfinite(values.lr) && values.lr >= 0.0,
           "set_optimizer_scalars: the learning rate must be finite and >= 0, got " << values.lr);
  RD_CHECK(values.steps >= 0.0 && values.steps == std::floor(values.steps),
           "set_optimizer_scalars: the step count must be a whole number >= 0, got " << values.steps);
  set_optimizer_scalars_impl(dst, values);
}

void Backend::adam_step(float* params, const float* grads, float* m, float* v, size_t count,
                        const math::AdamArgs& a) {
  RD_CHECK(a.step >= 1, "adam_step: step must be >= 1, got " << a.step);
  RD_CHECK(a.beta1 >= 0.f && a.beta1 < 1.f && a.beta2 >= 0.f && a.beta2 < 1.f,
           "adam_step: betas (" << a.beta1 << ", " << a.beta2 << ") must be in [0, 1)");
  RD_CHECK(count == 0 || (params && grads && m && v), "adam_step: a buffer is missing");
  adam_step_impl(params, grads, m, v, count, a);
}

void Backend::sgd_step(float* params, const float* grads, float* momentum_buf, size_t count,
                       const math::SgdHyper& h) {
  RD_CHECK(h.momentum == 0.f || momentum_buf || count == 0,
           "sgd_step: momentum " << h.momentum << " needs a buffer");
  RD_CHECK(count == 0 || (params && grads), "sgd_step: a buffer is missing");
  sgd_step_impl(params, grads, momentum_buf, count, h);
}

namespace {
// Segments are ordered, non-overlapping, non-empty-or-empty [begin, end) ranges.
void expect_segments(const int64_t* ranges, size_t segments, const char* op) {
  RD_CHECK(segments == 0 || ranges, op << ": the segment ranges are missing");
  int64_t prev_end = 0;
  for (size_t i = 0; i < segments; ++i) {
    const int64_t b = ranges[2 * i], e = ranges[2 * i + 1];
    RD_CHECK(b >= prev_end && e >= b,
             op << ": segment " << i << " [" << b << ", " << e << ") is not after the previous one");
    prev_end = e;
  }
}

// Which state buffers a segment rule reads and writes: {s0, s1}.
std::pair<bool, bool> segment_state_needed(const math::SegmentHyper& h) {
  using R = math::SegmentRule;
  switch (h.rule) {
    case R::Sgd:
    case R::Lars: return {h.momentum != 0.f, false};
    case R::Adam:
    case R::AdamW:
    case R::LambMoments: return {true, true};
    case R::RmsProp: return {true, h.momentum > 0.f};
    case R::ScaledDescent: return {false, false};
  }
  return {true, true};
}
}  // namespace

void Backend::segment_sum_squares(const float* data, const int64_t* ranges, size_t segments, double* sums) {
  expect_segments(ranges, segments, "segment_sum_squares");
  RD_CHECK(segments == 0 || (data && sums), "segment_sum_squares: a buffer is missing");
  segment_sum_squares_impl(data, ranges, segments, sums);
}

void Backend::segment_step(float* params, float* grads, float* s0, float* s1, const int64_t* ranges,
                           size_t segments, const float* decay, const float* scale, const math::SegmentHyper& h) {
  const char* op = "segment_step";
  expect_segments(ranges, segments, op);
  RD_CHECK(static_cast<int>(h.rule) >= 0 && static_cast<int>(h.rule) <= static_cast<int>(math::SegmentRule::ScaledDescent),
           op << ": unknown rule " << static_cast<int>(h.rule));
  RD_CHECK(h.beta1 >= 0.f && h.beta1 < 1.f && h.beta2 >= 0.f && h.beta2 < 1.f,
           op << ": betas (" << h.beta1 << ", " << h.beta2 << ") must be in [0, 1)");
  RD_CHECK(h.grad_divisor > 0.f && h.bias_correction1 > 0.f && h.bias_correction2_sqrt > 0.f,
           op << ": grad_divisor and bias corrections must be > 0");
  if (segments == 0) return;
  RD_CHECK(params && grads && decay && scale, op << ": a buffer is missing");
  const auto [need0, need1] = segment_state_needed(h);
  RD_CHECK((!need0 || s0) && (!need1 || s1), op << ": rule " << static_cast<int>(h.rule) << " needs its state buffers");
  segment_step_impl(params, grads, s0, s1, ranges, segments, decay, scale, h);
}

void Backend::ema_update(float* averaged, const float* current, size_t count, float decay, float one_minus_decay,
                         bool copy) {
  RD_CHECK(count == 0 || (averaged && current), "ema_update: a buffer is missing");
  RD_CHECK(decay >= 0.f && decay <= 1.f && one_minus_decay >= 0.f && one_minus_decay <= 1.f,
           "ema_update: decay " << decay << " and 1 - decay " << one_minus_decay << " must be in [0, 1]");
  RD_CHECK(count == 0 || averaged != current, "ema_update: the average and the model are the same buffer");
  ema_update_impl(averaged, current, count, decay, one_minus_decay, copy);
}

}  // namespace rd
