// Host-side launchers of the CUDA kernels in kernels/*.cu. Plain C++ (no device
// code), so the cuDNN/cuBLAS backend compiled by the host compiler can call them.
// Every launcher enqueues on the given stream and checks the launch; per-element
// math comes from include/resnet_ddp/math/*.h, the same functions the CPU
// backend runs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "resnet_ddp/math/image.h"
#include "resnet_ddp/math/optim.h"
#include "resnet_ddp/tensor.h"

namespace rd::kern {

// A logical (N, C, H, W) activation stored NCHW or NHWC with elements of
// `dtype` (F32, F16 or BF16).
struct ActDesc {
  int64_t n = 0, c = 0, h = 0, w = 0;
  bool nhwc = false;
  DType dtype = DType::F32;
  constexpr int64_t count() const { return n * c * h * w; }
};

// ---- elementwise (activations of any float dtype) -----------------------------
void fill_f32(float* dst, float value, size_t count, cudaStream_t s);
void relu_forward(DType t, const void* x, void* y, size_t count, cudaStream_t s);
// dx = dy where y > 0, else 0 (also the backward of a fused add+ReLU).
void relu_backward(DType t, const void* y, const void* dy, void* dx, size_t count, cudaStream_t s);
void add_forward(DType t, const void* a, const void* b, void* y, size_t count, bool relu,
                 cudaStream_t s);
void accumulate(DType t, const void* src, void* dst, size_t count, cudaStream_t s);
void scale_f32(float* data, float factor, size_t count, cudaStream_t s);
// data *= factor (skipped when factor == 1) and *nonfinite = 1 if any element of
// the result is inf/nan: loss-scale unscaling and overflow check in one pass.
// The caller zeroes *nonfinite (device int) first.
void scale_and_check(float* data, float factor, size_t count, int* nonfinite, cudaStream_t s);

// ---- layouts and conversions ----------------------------------------------------
void nchw_f32_to_act(const float* src, const ActDesc& dst_desc, void* dst, cudaStream_t s);
void act_to_nchw_f32(const ActDesc& src_desc, const void* src, float* dst, cudaStream_t s);
// src: N x H x W x 3 uint8 (device); dst (N, 3, H, W); (v / 255 - mean[c]) / std[c].
void images_u8_to_act(const uint8_t* src, const ActDesc& dst_desc, void* dst, const float mean[3],
                      const float std[3], cudaStream_t s);
// MixUp / CutMix of a batch with its roll by one (Backend::mix_images); src, dst distinct.
void mix_images(const ActDesc& d, const void* src, void* dst, const math::ImageMix& mix, cudaStream_t s);
// x[n, :, top:top+h, left:left+w] = 0 with boxes[4n..4n+3] = (top, left, h, w) (device).
void erase_rectangles(const ActDesc& d, void* x, const int32_t* boxes, cudaStream_t s);
// Conv weight (O, I, kh, kw) float -> `t` in OIHW (ohwi = false) or OHWI (the
// layout cuDNN wants next to NHWC activations).
void stage_conv_weight(const float* w_oihw, int64_t o, int64_t i, int64_t kh, int64_t kw, bool ohwi,
                       DType t, void* dst, cudaStream_t s);
// The reverse for a weight gradient, adding into dw when `accumulate`.
void unstage_conv_weight_grad(const void* src, int64_t o, int64_t i, int64_t kh, int64_t kw,
                              bool ohwi, DType t, float* dw_oihw, bool accumulate, cudaStream_t s);

// ---- batch norm (and SyncBatchNorm) ------------------------------------------------
// sums[0..C) = sum (x - shift), sums[C..2C) = sum (x - shift)^2 per channel
// (sums zeroed here); shift[C] may be null (0). See math::bn_stats_from_shifted_sums.
void bn_sums_forward(const ActDesc& d, const void* x, const float* shift, double* sums, cudaStream_t s);
// With g = dy masked by y > 0 when relu: sums[0..C) = sum g, sums[C..2C) = sum g * xhat.
void bn_sums_backward(const ActDesc& d, const void* x, const void* y, const void* dy, bool relu,
                      const float* mean, const float* invstd, double* sums, cudaStream_t s);
// packed[0..2C) = sums, packed[2C] = count, all double (exact counts): what ranks all-reduce.
void bn_pack_sums(const double* sums, int64_t c, double count, double* packed, cudaStream_t s);
// Batch statistics -> saved mean/invstd, running stats update, per-channel
// scale/shift (scale_shift[0..C) scale, [C..2C) shift). Reads the double `sums`
// with `count`, or, when `packed` is non-null, the all-reduced packed sums. The
// forward sums were shifted by running_mean (its value before this update).
void bn_finalize_forward(int64_t c, const double* sums, double count, const double* packed,
                         const float* gamma, const float* beta, float* running_mean,
                         float* running_var, float momentum, float eps, float* saved_mean,
                         float* saved_invstd, float* scale_shift, cudaStream_t s);
void bn_scale_shift_eval(int64_t c, const float* gamma, const float* beta, const float* running_mean,
                         const float* running_var, float eps, float* scale_shift, cudaStream_t s);
// y = x * scale + shift (+ ReLU).
void bn_apply(const ActDesc& d, const void* x, const float* scale_shift, bool relu, void* y,
              cudaStream_t s);
// dgamma = sum g * xhat, dbeta = sum g (this rank's batch, as PyTorch's SyncBN).
void bn_param_grads(int64_t c, const double* sums, float* dgamma, float* dbeta, bool accumulate,
                    cudaStream_t s);
// means[0..C) = sum g / count, means[C..2C) = sum g xhat / count (global when packed).
void bn_finalize_backward(int64_t c, const double* sums, double count, const double* packed,
                          float* means, cudaStream_t s);
void bn_backward_dx(const ActDesc& d, const void* x, const void* y, const void* dy, bool relu,
                    const float* gamma, const float* mean, const float* invstd, const float* means,
                    void* dx, cudaStream_t s);

// ---- pooling -------------------------------------------------------------------------
// argmax[j] = offset in x (its layout) of output j's source (PyTorch tie rules).
void maxpool_forward(const ActDesc& xd, const void* x, const ActDesc& yd, void* y, int kernel,
                     int stride, int pad, int32_t* argmax, cudaStream_t s);
// Gather form (no atomics): each input sums the outputs that picked it.
void maxpool_backward(const ActDesc& dyd, const void* dy, const ActDesc& dxd, void* dx, int kernel,
                      int stride, int pad, const int32_t* argmax, cudaStream_t s);
// y (N, C) float RowMajor.
void global_avgpool_forward(const ActDesc& xd, const void* x, float* y, cudaStream_t s);
void global_avgpool_backward(const float* dy, const ActDesc& dxd, void* dx, cudaStream_t s);

// ---- linear-layer helpers (RowMajor float) -------------------------------------------
void add_bias_rows(float* y, const float* b, int64_t rows, int64_t cols, cudaStream_t s);
void column_sums(const float* m, int64_t rows, int64_t cols, float* out, bool accumulate,
                 cudaStream_t s);

// ---- loss and accuracy ---------------------------------------------------------------
// The loss gradient's scale: grad_scale, or with `amp` (device; fp16) read there as
// float(amp->loss_scale / grad_scale), grad_scale being the divisor. The kernel divides it by
// the row count, as the host did.
struct RowGradScale {
  float grad_scale;
  const math::AmpStepState* amp;
};
// softmax_xent with mixed targets (math::softmax_xent_mixed_row); `labels` holds n labels then
// n partner labels.
void softmax_xent_mixed(const float* logits, const int32_t* labels, int64_t n, int64_t k, float lam,
                        float smoothing, RowGradScale scale, float* dlogits, float* row_loss, int32_t* argmax,
                        cudaStream_t s);
// One row per thread through math::softmax_xent_row; dlogits may be null.
void softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k, float smoothing,
                  RowGradScale scale, float* dlogits, float* row_loss, int32_t* argmax,
                  cudaStream_t s);
// *correct += rows whose first maximum equals the label.
void count_correct(const float* logits, const int32_t* labels, int64_t n, int64_t k, int* correct,
                   cudaStream_t s);

// sums[0] += the rows' losses summed in double in row order, sums[1] += rows whose argmax
// equals targets[r], sums[2] += 1 when that sum is not finite (one thread: n is a batch).
void loss_sums(const float* row_loss, const int32_t* argmax, const int32_t* targets, int64_t n, double* sums,
               cudaStream_t s);

// ---- optimizers over a flat arena slice, one launch -----------------------------------
// Backend::amp_unscale: g *= 1 / state->loss_scale, *nonfinite = 1 on a non-finite result
// (the caller zeroes it first), then one thread folds the verdict into *state.
void amp_unscale(float* g, size_t count, math::AmpStepState* state, int* nonfinite, bool found_inf_elsewhere,
                 cudaStream_t s);
// amp (device, may be null): the step count comes from it, and a skipped step changes nothing;
// scalars (device, may be null): the learning rate and, without amp, the step count.
void adam_step(float* p, const float* g, float* m, float* v, size_t count, const math::AdamHyper& h,
               const math::AmpStepState* amp, const math::OptimizerStepScalars* scalars, cudaStream_t s);
// Backend::set_optimizer_scalars: one thread stores `values` (a launch argument) at dst.
void store_optimizer_scalars(math::OptimizerStepScalars* dst, const math::OptimizerStepScalars& values,
                             cudaStream_t s);
void sgd_step(float* p, const float* g, float* buf, size_t count, const math::SgdHyper& h,
              cudaStream_t s);
// Per-segment ops (ranges, decay, scale in device memory; see Backend::segment_step).
// partials: segments * blocks_per_segment doubles, segment-major.
void segment_sum_squares(const float* x, const int64_t* ranges, int64_t segments, unsigned blocks_per_segment,
                         double* partials, cudaStream_t s);
void segment_step(float* p, float* g, float* s0, float* s1, const int64_t* ranges, const float* decay,
                  const float* scale, int64_t segments, int64_t longest, const math::SegmentHyper& h,
                  cudaStream_t s);
// avg = decay * avg + one_minus_decay * cur (math::ema_average).
void ema_update(float* avg, const float* cur, size_t count, float decay, float one_minus_decay, cudaStream_t s);

}  // namespace rd::kern
