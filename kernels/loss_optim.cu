// Linear-layer helpers, softmax cross-entropy (forward + backward fused),
// accuracy counts, and the optimizers over a whole flat arena in one launch.
#include <algorithm>

#include "common.cuh"
#include "resnet_ddp/math/loss.h"
#include "resnet_ddp/math/optim.h"

namespace rd::kern {
namespace {

__global__ void add_bias_kernel(float* y, const float* b, int64_t rows, int64_t cols) {
  RD_GRID_STRIDE(i, rows * cols) y[i] += b[i % cols];
}

__global__ void column_sums_kernel(const float* m, int64_t rows, int64_t cols, float* out,
                                   bool accumulate) {
  RD_GRID_STRIDE(c, cols) {
    float acc = 0.f;
    for (int64_t r = 0; r < rows; ++r) acc += m[r * cols + c];
    out[c] = accumulate ? out[c] + acc : acc;
  }
}

__device__ float row_grad_scale_of(RowGradScale s, int64_t n) {
  return (s.amp ? math::amp_grad_scale(*s.amp, s.grad_scale) : s.grad_scale) / static_cast<float>(n);
}

__global__ void xent_kernel(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                            float smoothing, RowGradScale scale, float* dlogits, float* row_loss,
                            int32_t* argmax) {
  const float row_grad_scale = row_grad_scale_of(scale, n);
  RD_GRID_STRIDE(r, n) {
    int amax = 0;
    row_loss[r] = math::softmax_xent_row(logits + r * k, static_cast<int>(k), labels[r], smoothing,
                                         row_grad_scale, dlogits ? dlogits + r * k : nullptr, &amax);
    if (argmax) argmax[r] = amax;
  }
}

__global__ void xent_mixed_kernel(const float* logits, const int32_t* labels, int64_t n, int64_t k, float lam,
                                  float smoothing, RowGradScale scale, float* dlogits, float* row_loss,
                                  int32_t* argmax) {
  const float row_grad_scale = row_grad_scale_of(scale, n);
  RD_GRID_STRIDE(r, n) {
    int amax = 0;
    row_loss[r] = math::softmax_xent_mixed_row(logits + r * k, static_cast<int>(k), labels[r], labels[n + r], lam,
                                               smoothing, row_grad_scale, dlogits ? dlogits + r * k : nullptr, &amax);
    if (argmax) argmax[r] = amax;
  }
}

__global__ void correct_kernel(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                               int* correct) {
  RD_GRID_STRIDE(r, n) {
    const float* z = logits + r * k;
    int64_t best = 0;
    for (int64_t j = 1; j < k; ++j)
      if (z[j] > z[best]) best = j;
    if (best == labels[r]) atomicAdd(correct, 1);
  }
}

// One thread, rows in order: the same double sum of the float row losses that the host
// forms after softmax_xent's copy back, so the step's loss is bit-identical.
__global__ void loss_sums_kernel(const float* row_loss, const int32_t* argmax, const int32_t* targets, int64_t n,
                                 double* sums) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double total = 0.0, correct = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    total += row_loss[r];
    correct += argmax[r] == targets[r] ? 1.0 : 0.0;
  }
  sums[0] += total;
  sums[1] += correct;
  sums[2] += isfinite(total) ? 0.0 : 1.0;
}

// fp16's unscale: the loss scale, read from the device, divided out of the gradients, and
// *nonfinite = 1 when an unscaled value is not finite (the caller zeroes it first).
__global__ void amp_unscale_kernel(float* g, int64_t n, const math::AmpStepState* state, int* nonfinite) {
  const float factor = math::amp_unscale_factor(*state);
  bool bad = false;
  RD_GRID_STRIDE(i, n) {
    const float v = g[i] * factor;
    g[i] = v;
    bad |= !isfinite(v);
  }
  // One store per warp that saw a bad value: cheap, and any store suffices.
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *nonfinite = 1;
}

// One thread: the verdict folded into the step scalars (GradScaler.update).
__global__ void amp_finish_kernel(math::AmpStepState* state, const int* nonfinite, bool found_inf_elsewhere) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  math::amp_finish_step(*state, found_inf_elsewhere || *nonfinite != 0);
}

// The update kernels below return at once on a skipped step; each thread derives the
// step's scalars from the device step count itself (a few flops per thread, no launch).
__global__ void adam_kernel(float* p, const float* g, float* m, float* v, int64_t n, math::AdamHyper h,
                            const math::AmpStepState* amp, const math::OptimizerStepScalars* scalars) {
  if (!math::adam_hyper_for_step(h, amp, scalars)) return;
  RD_GRID_STRIDE(i, n) math::adam_update(p[i], g[i], m[i], v[i], h);
}

__global__ void sgd_kernel(float* p, const float* g, float* buf, int64_t n, math::SgdHyper h) {
  if (!math::sgd_hyper_for_step(h)) return;
  RD_GRID_STRIDE(i, n) {
    float dummy = 0.f;  // no buffer without momentum (PyTorch keeps none)
    math::sgd_update(p[i], g[i], buf ? buf[i] : dummy, h);
  }
}

// Segment blockIdx.y (+ first) of the arena; each x-block takes a grid-stride share of it.
__global__ void segment_sum_squares_kernel(const float* x, const int64_t* ranges, int64_t first,
                                           double* partials) {
  __shared__ double part[kThreads];
  const int64_t seg = first + blockIdx.y;
  const int64_t b = ranges[2 * seg], e = ranges[2 * seg + 1];
  double acc = 0.0;
  for (int64_t i = b + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < e;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  part[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[seg * gridDim.x + blockIdx.x] = part[0];
}

// table: decay[segments] then scale[segments], after the ranges.
__global__ void segment_step_kernel(float* p, float* g, float* s0, float* s1, const int64_t* ranges,
                                    const float* decay, const float* scale, int64_t first,
                                    math::SegmentHyper h) {
  if (!math::segment_hyper_for_step(h)) return;
  const int64_t seg = first + blockIdx.y;
  const int64_t b = ranges[2 * seg], e = ranges[2 * seg + 1];
  const float d = decay[seg], k = math::segment_scale_for_step(h, d, scale[seg]);
  for (int64_t i = b + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < e;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float unused0 = 0.f, unused1 = 0.f;
    math::segment_update(p[i], g[i], s0 ? s0[i] : unused0, s1 ? s1[i] : unused1, d, k, h);
  }
}

__global__ void store_optimizer_scalars_kernel(math::OptimizerStepScalars* dst, math::OptimizerStepScalars values) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *dst = values;
}

__global__ void ema_kernel(float* avg, const float* cur, int64_t n, float decay, float one_minus_decay) {
  RD_GRID_STRIDE(i, n) avg[i] = math::ema_average(avg[i], cur[i], decay, one_minus_decay);
}

}  // namespace

void add_bias_rows(float* y, const float* b, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols == 0 || !b) return;
  RD_LAUNCH(add_bias_kernel, grid_for(rows * cols), kThreads, 0, s)(y, b, rows, cols);
  RD_LAUNCH_CHECK("add_bias_rows");
}

void column_sums(const float* m, int64_t rows, int64_t cols, float* out, bool accumulate,
                 cudaStream_t s) {
  if (!cols) return;
  RD_LAUNCH(column_sums_kernel, grid_for(cols), kThreads, 0, s)(m, rows, cols, out, accumulate);
  RD_LAUNCH_CHECK("column_sums");
}

void softmax_xent_mixed(const float* logits, const int32_t* labels, int64_t n, int64_t k, float lam,
                        float smoothing, RowGradScale scale, float* dlogits, float* row_loss, int32_t* argmax,
                        cudaStream_t s) {
  if (!n) return;
  RD_LAUNCH(xent_mixed_kernel, grid_for(n, 64), 64, 0, s)(logits, labels, n, k, lam, smoothing, scale,
                                                          dlogits, row_loss, argmax);
  RD_LAUNCH_CHECK("softmax_xent_mixed");
}

void softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k, float smoothing,
                  RowGradScale scale, float* dlogits, float* row_loss, int32_t* argmax,
                  cudaStream_t s) {
  if (!n) return;
  RD_LAUNCH(xent_kernel, grid_for(n, 64), 64, 0, s)(logits, labels, n, k, smoothing, scale, dlogits,
                                             row_loss, argmax);
  RD_LAUNCH_CHECK("softmax_xent");
}

void count_correct(const float* logits, const int32_t* labels, int64_t n, int64_t k, int* correct,
                   cudaStream_t s) {
  if (!n) return;
  RD_LAUNCH(correct_kernel, grid_for(n, 64), 64, 0, s)(logits, labels, n, k, correct);
  RD_LAUNCH_CHECK("count_correct");
}

void loss_sums(const float* row_loss, const int32_t* argmax, const int32_t* targets, int64_t n, double* sums,
               cudaStream_t s) {
  RD_LAUNCH(loss_sums_kernel, 1, 1, 0, s)(row_loss, argmax, targets, n, sums);
  RD_LAUNCH_CHECK("loss_sums");
}

void amp_unscale(float* g, size_t count, math::AmpStepState* state, int* nonfinite, bool found_inf_elsewhere,
                 cudaStream_t s) {
  if (count) {
    RD_LAUNCH(amp_unscale_kernel, grid_for(count), kThreads, 0, s)(g, static_cast<int64_t>(count), state, nonfinite);
    RD_LAUNCH_CHECK("amp_unscale");
  }
  RD_LAUNCH(amp_finish_kernel, 1, 1, 0, s)(state, nonfinite, found_inf_elsewhere);
  RD_LAUNCH_CHECK("amp_finish_step");
}

void adam_step(float* p, const float* g, float* m, float* v, size_t count, const math::AdamHyper& h,
               const math::AmpStepState* amp, const math::OptimizerStepScalars* scalars, cudaStream_t s) {
  if (!count) return;
  RD_LAUNCH(adam_kernel, grid_for(count), kThreads, 0, s)(p, g, m, v, static_cast<int64_t>(count), h, amp, scalars);
  RD_LAUNCH_CHECK("adam_step");
}

void store_optimizer_scalars(math::OptimizerStepScalars* dst, const math::OptimizerStepScalars& values,
                             cudaStream_t s) {
  RD_LAUNCH(store_optimizer_scalars_kernel, 1, 1, 0, s)(dst, values);
  RD_LAUNCH_CHECK("store_optimizer_scalars");
}

void sgd_step(float* p, const float* g, float* buf, size_t count, const math::SgdHyper& h,
              cudaStream_t s) {
  if (!count) return;
  RD_LAUNCH(sgd_kernel, grid_for(count), kThreads, 0, s)(p, g, buf, static_cast<int64_t>(count), h);
  RD_LAUNCH_CHECK("sgd_step");
}

// gridDim.y is at most 65535: more segments launch in chunks.
inline constexpr int64_t kMaxSegmentsPerLaunch = 65535;

void segment_sum_squares(const float* x, const int64_t* ranges, int64_t segments, unsigned blocks_per_segment,
                         double* partials, cudaStream_t s) {
  for (int64_t first = 0; first < segments; first += kMaxSegmentsPerLaunch) {
    const auto ny = static_cast<unsigned>(std::min(kMaxSegmentsPerLaunch, segments - first));
    RD_LAUNCH(segment_sum_squares_kernel, dim3(blocks_per_segment, ny), kThreads, 0, s)(x, ranges, first, partials);
    RD_LAUNCH_CHECK("segment_sum_squares");
  }
}

void segment_step(float* p, float* g, float* s0, float* s1, const int64_t* ranges, const float* decay,
                  const float* scale, int64_t segments, int64_t longest, const math::SegmentHyper& h,
                  cudaStream_t s) {
  const unsigned gx = std::min(grid_for(longest), 512u);
  for (int64_t first = 0; first < segments; first += kMaxSegmentsPerLaunch) {
    const auto ny = static_cast<unsigned>(std::min(kMaxSegmentsPerLaunch, segments - first));
    RD_LAUNCH(segment_step_kernel, dim3(gx, ny), kThreads, 0, s)(p, g, s0, s1, ranges, decay, scale, first, h);
    RD_LAUNCH_CHECK("segment_step");
  }
}

void ema_update(float* avg, const float* cur, size_t count, float decay, float one_minus_decay, cudaStream_t s) {
  if (!count) return;
  RD_LAUNCH(ema_kernel, grid_for(count), kThreads, 0, s)(avg, cur, static_cast<int64_t>(count), decay, one_minus_decay);
  RD_LAUNCH_CHECK("ema_update");
}

}  // namespace rd::kern
