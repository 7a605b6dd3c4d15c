// Linear-layer helpers, softmax cross-entropy (forward + backward fused),
// accuracy counts, and the optimizers over a whole flat arena in one launch.
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

__global__ void xent_kernel(const float* logits, const int32_t* labels, int64_t n, int64_t k,
                            float smoothing, float row_grad_scale, float* dlogits, float* row_loss,
                            int32_t* argmax) {
  RD_GRID_STRIDE(r, n) {
    int amax = 0;
    row_loss[r] = math::softmax_xent_row(logits + r * k, static_cast<int>(k), labels[r], smoothing,
                                         row_grad_scale, dlogits ? dlogits + r * k : nullptr, &amax);
    if (argmax) argmax[r] = amax;
  }
}

__global__ void xent_mixed_kernel(const float* logits, const int32_t* labels, int64_t n, int64_t k, float lam,
                                  float smoothing, float row_grad_scale, float* dlogits, float* row_loss,
                                  int32_t* argmax) {
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

__global__ void adam_kernel(float* p, const float* g, float* m, float* v, int64_t n,
                            math::AdamHyper h) {
  RD_GRID_STRIDE(i, n) math::adam_update(p[i], g[i], m[i], v[i], h);
}

__global__ void sgd_kernel(float* p, const float* g, float* buf, int64_t n, math::SgdHyper h) {
  RD_GRID_STRIDE(i, n) {
    float dummy = 0.f;  // no buffer without momentum (PyTorch keeps none)
    math::sgd_update(p[i], g[i], buf ? buf[i] : dummy, h);
  }
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
                        float smoothing, float row_grad_scale, float* dlogits, float* row_loss, int32_t* argmax,
                        cudaStream_t s) {
  if (!n) return;
  RD_LAUNCH(xent_mixed_kernel, grid_for(n, 64), 64, 0, s)(logits, labels, n, k, lam, smoothing, row_grad_scale,
                                                          dlogits, row_loss, argmax);
  RD_LAUNCH_CHECK("softmax_xent_mixed");
}

void softmax_xent(const float* logits, const int32_t* labels, int64_t n, int64_t k, float smoothing,
                  float row_grad_scale, float* dlogits, float* row_loss, int32_t* argmax,
                  cudaStream_t s) {
  if (!n) return;
  RD_LAUNCH(xent_kernel, grid_for(n, 64), 64, 0, s)(logits, labels, n, k, smoothing, row_grad_scale, dlogits,
                                             row_loss, argmax);
  RD_LAUNCH_CHECK("softmax_xent");
}

void count_correct(const float* logits, const int32_t* labels, int64_t n, int64_t k, int* correct,
                   cudaStream_t s) {
  if (!n) return;
  RD_LAUNCH(correct_kernel, grid_for(n, 64), 64, 0, s)(logits, labels, n, k, correct);
  RD_LAUNCH_CHECK("count_correct");
}

void adam_step(float* p, const float* g, float* m, float* v, size_t count, const math::AdamHyper& h,
               cudaStream_t s) {
  if (!count) return;
  RD_LAUNCH(adam_kernel, grid_for(count), kThreads, 0, s)(p, g, m, v, static_cast<int64_t>(count), h);
  RD_LAUNCH_CHECK("adam_step");
}

void sgd_step(float* p, const float* g, float* buf, size_t count, const math::SgdHyper& h,
              cudaStream_t s) {
  if (!count) return;
  RD_LAUNCH(sgd_kernel, grid_for(count), kThreads, 0, s)(p, g, buf, static_cast<int64_t>(count), h);
  RD_LAUNCH_CHECK("sgd_step");
}

}  // namespace rd::kern
