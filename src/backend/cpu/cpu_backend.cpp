// CPU backend: memory, layout conversion, and the small memory-bound ops.
// Convolution lives in conv.cpp, batch norm in batchnorm.cpp.
#include "backend/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/cpu/layout.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/math/activation.h"
#include "resnet_ddp/math/image.h"
#include "resnet_ddp/math/loss.h"
#include "resnet_ddp/math/optim.h"

extern "C" {
#include <dnnl.h>
}

namespace rd::cpu {

CpuBackend::CpuBackend(const BackendOptions& opts)
    : isa_(cpu_isa_defaults()), engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
  layout_ = opts.layout.value_or(isa_.layout(opts.precision));
  if (layout_ != Layout::NHWC && layout_ != Layout::NCHW && layout_ != Layout::NCHW16C &&
      layout_ != Layout::NCHW8C)
    throw UsageError(std::string("CPU backend: activation layout ") + layout_name(layout_) +
                     " is not supported (use nChw16c, nChw8c, NHWC or NCHW)");
  if (opts.precision != Precision::FP32 && opts.precision != Precision::BF16)
    throw UsageError("CPU backend: precision must be fp32 or bf16 (tf32 and fp16 are GPU modes)");
  precision_ = opts.precision;
  conv_algo_ = opts.conv_algo;
  if (precision_ == Precision::BF16 && !isa_.bf16)
    throw UsageError("CPU backend: bf16 needs a CPU with AVX512-BF16 or AMX; this one has " + isa_.isa +
                     " (use --precision fp32)");
  threads_ = opts.threads > 0 ? opts.threads : omp_get_max_threads();
  omp_set_num_threads(threads_);
}

std::string CpuBackend::name() const {
  const dnnl_version_t* v = dnnl_version();
  return "cpu (oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + ", " + isa_.isa + ", " + std::to_string(threads_) + " threads, " +
         layout_name(layout_) +
         (precision_ == Precision::BF16      ? (isa_.winograd_in_bf16 && conv_algo_ != ConvAlgo::Direct
                                                    ? ", bf16 convolutions, 3x3 stride-1 in fp32 Winograd where faster"
                                                    : ", bf16 convolutions")
          : conv_algo_ == ConvAlgo::Direct    ? ", direct convolutions"
          : !isa_.avx512 && !winograd::cpu_supported() ? ", direct convolutions (no Winograd kernel for this ISA)"
          : !isa_.avx512 && layout_ != Layout::NCHW8C    ? ", direct convolutions (Winograd needs nChw8c on this ISA)"
          : conv_algo_ == ConvAlgo::Winograd  ? (isa_.avx512 ? ", Winograd 3x3 convolutions"
                                                             : ", own Winograd F(4x4,3x3) / F(2x2,3x3) 3x3 convolutions")
          : isa_.avx512                       ? ", Winograd 3x3 convolutions where faster"
                                              : ", own Winograd F(4x4,3x3) / F(2x2,3x3) 3x3 convolutions where faster") +
         ")";
}

// ---- memory -----------------------------------------------------------------

std::shared_ptr<void> CpuBackend::allocate(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) RD_FAIL("CPU backend: out of memory allocating " << bytes << " bytes");
  std::memset(p, 0, rounded);
  ++*memory_events_;
  return std::shared_ptr<void>(p, [events = memory_events_](void* q) {
    std::free(q);
    ++*events;
  });
}

int CpuBackend::graph_end() { RD_FAIL("graph_end: the CPU backend records no graphs (graph_begin returned false)"); }
bool CpuBackend::graph_launch(int graph) {
  RD_FAIL("graph_launch: the CPU backend has no graph " << graph << " (it records no graphs)");
}
void CpuBackend::graph_drop(int graph) {
  RD_FAIL("graph_drop: the CPU backend has no graph " << graph << " (it records no graphs)");
}

void CpuBackend::copy_from_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void CpuBackend::fill(float* dst, float value, size_t count) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < count; ++i) dst[i] = value;
}

// NCHW <-> NHWC transpose of host/CPU float data (the two directions of one loop).
static void transpose_nchw_nhwc(const Dims& d, const float* src, float* dst, bool to_nhwc) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < d.n; ++n)
    for (int64_t h = 0; h < d.h; ++h)
      for (int64_t w = 0; w < d.w; ++w)
        for (int64_t c = 0; c < d.c; ++c) {
          const int64_t nchw = ((n * d.c + c) * d.h + h) * d.w + w;
          const int64_t nhwc = ((n * d.h + h) * d.w + w) * d.c + c;
          if (to_nhwc) dst[nhwc] = src[nchw];
          else dst[nchw] = src[nhwc];
        }
}

// NCHW <-> nChw16c/nChw8c through a oneDNN reorder (rare: tests, parity, checkpoints of inputs).
void CpuBackend::reorder_nchw_blocked(const Tensor& t, float* nchw, bool to_blocked) {
  const Dims d = dims_of(t);
  const dnnl::memory::dims dims{d.n, d.c, d.h, d.w};
  using tag = dnnl::memory::format_tag;
  dnnl::memory plain({dims, dnnl::memory::data_type::f32, tag::nchw}, engine_, nchw);
  dnnl::memory blocked({dims, dnnl::memory::data_type::f32, t.layout == Layout::NCHW8C ? tag::nChw8c : tag::nChw16c},
                       engine_, t.data);
  if (to_blocked) dnnl::reorder(plain, blocked).execute(stream_, plain, blocked);
  else dnnl::reorder(blocked, plain).execute(stream_, blocked, plain);
  stream_.wait();
}

void CpuBackend::copy_from_host_nchw_impl(const float* src, Tensor& dst) {
  if (dst.layout == Layout::RowMajor || dst.layout == Layout::NCHW) {
    copy_from_host(dst.data, src, static_cast<size_t>(dst.numel()) * sizeof(float));
    return;
  }
  if (is_blocked(dst)) return reorder_nchw_blocked(dst, const_cast<float*>(src), true);
  transpose_nchw_nhwc(dims_of(dst), src, dst.f32(), true);
}

void CpuBackend::copy_to_host_nchw_impl(const Tensor& src, float* dst) {
  if (src.layout == Layout::RowMajor || src.layout == Layout::NCHW) {
    copy_to_host(dst, src.data, static_cast<size_t>(src.numel()) * sizeof(float));
    return;
  }
  if (is_blocked(src)) return reorder_nchw_blocked(src, dst, false);
  transpose_nchw_nhwc(dims_of(src), src.f32(), dst, false);
}

void CpuBackend::images_u8_to_activation_impl(const uint8_t* src, Tensor& dst, const float* mean,
                                         const float* std) {
  const Dims d = dims_of(dst);
  RD_CHECK(d.c == 3 && (dst.layout == Layout::NHWC || dst.layout == Layout::NCHW),
           "images_u8_to_activation: expected a 3-channel NHWC or NCHW activation, got " << dst.describe());
  // torchvision's ToTensor (+ Normalize), with the formula the CUDA kernel shares.
  float m[3], sd[3];
  for (int c = 0; c < 3; ++c) {
    m[c] = mean ? mean[c] : 0.f;
    sd[c] = std ? std[c] : 1.f;
  }
  float* out = dst.f32();
  const int64_t hw = d.h * d.w;
  if (dst.layout == Layout::NHWC) {
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < d.n * hw; ++p)
      for (int c = 0; c < 3; ++c) out[p * 3 + c] = math::image_u8_to_input(src[p * 3 + c], m[c], sd[c]);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < d.n; ++n)
      for (int c = 0; c < 3; ++c)
        for (int64_t p = 0; p < hw; ++p)
          out[(n * 3 + c) * hw + p] = math::image_u8_to_input(src[(n * hw + p) * 3 + c], m[c], sd[c]);
  }
}

void CpuBackend::erase_rectangles_impl(Tensor& x, const int32_t* boxes) {
  const Dims d = dims_of(x);
  RD_CHECK(x.layout == Layout::NHWC || x.layout == Layout::NCHW,
           "erase_rectangles: expected an NHWC or NCHW activation, got " << x.describe());
  float* data = x.f32();
  for (int64_t n = 0; n < d.n; ++n) {
    const int64_t top = boxes[4 * n], left = boxes[4 * n + 1], h = boxes[4 * n + 2], w = boxes[4 * n + 3];
    if (h == 0 || w == 0) continue;
    for (int64_t y = top; y < top + h; ++y) {
      if (x.layout == Layout::NHWC) {
        float* row = data + ((n * d.h + y) * d.w + left) * d.c;
        std::fill(row, row + w * d.c, 0.f);
      } else {
        for (int64_t c = 0; c < d.c; ++c) {
          float* row = data + ((n * d.c + c) * d.h + y) * d.w + left;
          std::fill(row, row + w, 0.f);
        }
      }
    }
  }
}

// ---- elementwise ----------------------------------------------------------------

static void check_same(const Tensor& a, const Tensor& b, const char* op) {
  RD_CHECK(a.shape == b.shape && a.layout == b.layout,
           op << ": tensors differ: " << a.describe() << " vs " << b.describe());
}

void CpuBackend::relu_forward_impl(const Tensor& x, Tensor& y) {
  check_same(x, y, "relu_forward");
  const float* in = x.f32();
  float* out = y.f32();
  const int64_t n = x.storage_elems();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = math::relu_forward(in[i]);
}

void CpuBackend::relu_backward_impl(const Tensor& y, const Tensor& dy, Tensor& dx) {
  check_same(y, dy, "relu_backward");
  check_same(y, dx, "relu_backward");
  const float* yo = y.f32();
  const float* g = dy.f32();
  float* out = dx.f32();
  const int64_t n = y.storage_elems();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = math::relu_backward(yo[i], g[i]);
}

void CpuBackend::add_forward_impl(const Tensor& a, const Tensor& b, bool relu, Tensor& y) {
  check_same(a, b, "add_forward");
  check_same(a, y, "add_forward");
  const float* pa = a.f32();
  const float* pb = b.f32();
  float* out = y.f32();
  const int64_t n = a.storage_elems();
  if (relu) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = math::add_relu_forward(pa[i], pb[i]);
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = pa[i] + pb[i];
  }
}

void CpuBackend::add_backward_impl(const Tensor& y, const Tensor& dy, bool relu, Tensor& dsum) {
  check_same(y, dy, "add_backward");
  check_same(y, dsum, "add_backward");
  if (!relu) {
    if (dsum.data != dy.data) copy_from_host(dsum.data, dy.data, dy.nbytes());
    return;
  }
  relu_backward(y, dy, dsum);
}

void CpuBackend::accumulate_impl(const Tensor& src, Tensor& dst) {
  check_same(src, dst, "accumulate");
  const float* in = src.f32();
  float* out = dst.f32();
  const int64_t n = src.storage_elems();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] += in[i];
}

// ---- pooling ----------------------------------------------------------------------
// Max pool keeps the flat input index of each window's maximum (first one wins on
// ties, as PyTorch), so backward is a scatter and works for any layout.

size_t CpuBackend::maxpool_workspace_bytes(const Tensor& y) {
  return static_cast<size_t>(y.numel()) * sizeof(int32_t);
}

void CpuBackend::maxpool_forward_impl(const Tensor& x, Tensor& y, int k, int stride, int pad,
                                 void* workspace) {
  RD_CHECK(x.layout == y.layout, "maxpool_forward: layouts differ");
  const Dims in = dims_of(x), out = dims_of(y);
  RD_CHECK(out.h == conv_out_size(in.h, k, stride, pad) && out.w == conv_out_size(in.w, k, stride, pad),
           "maxpool_forward: output " << y.describe() << " does not fit input " << x.describe());
  RD_CHECK(static_cast<int64_t>(in.n) * in.c * in.h * in.w < (int64_t(1) << 31),
           "maxpool_forward: tensor too large for 32-bit indices");
  const float* src = x.f32();
  float* dst = y.f32();
  int32_t* arg = static_cast<int32_t*>(workspace);
  if (x.layout == Layout::NHWC || is_blocked(x)) {
    // Channels are contiguous: compare whole rows of C (or 16) values at once.
    const Dims in = rows_view(x), out = rows_view(y);
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t n = 0; n < out.n; ++n)
      for (int64_t oh = 0; oh < out.h; ++oh)
        for (int64_t ow = 0; ow < out.w; ++ow) {
          float* best = dst + ((n * out.h + oh) * out.w + ow) * out.c;
          int32_t* best_i = arg + ((n * out.h + oh) * out.w + ow) * out.c;
          bool first = true;
          for (int kh = 0; kh < k; ++kh) {
            const int64_t ih = oh * stride - pad + kh;
            if (ih < 0 || ih >= in.h) continue;
            for (int kw = 0; kw < k; ++kw) {
              const int64_t iw = ow * stride - pad + kw;
              if (iw < 0 || iw >= in.w) continue;
              const int64_t base = ((n * in.h + ih) * in.w + iw) * in.c;
              const float* row = src + base;
              if (first) {
#pragma omp simd
                for (int64_t c = 0; c < in.c; ++c) {
                  best[c] = row[c];
                  best_i[c] = static_cast<int32_t>(base + c);
                }
                first = false;
                continue;
              }
#pragma omp simd
              for (int64_t c = 0; c < in.c; ++c) {
                const float v = row[c];
                const bool take = v > best[c] || v != v;  // NaN propagates, as in PyTorch
                best[c] = take ? v : best[c];
                best_i[c] = take ? static_cast<int32_t>(base + c) : best_i[c];
              }
            }
          }
        }
    return;
  }
  const Indexer xi(x), yi(y);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < out.n; ++n)
    for (int64_t oh = 0; oh < out.h; ++oh)
      for (int64_t ow = 0; ow < out.w; ++ow)
        for (int64_t c = 0; c < out.c; ++c) {
          float best = -INFINITY;
          int64_t best_i = -1;
          for (int kh = 0; kh < k; ++kh) {
            const int64_t ih = oh * stride - pad + kh;
            if (ih < 0 || ih >= in.h) continue;
            for (int kw = 0; kw < k; ++kw) {
              const int64_t iw = ow * stride - pad + kw;
              if (iw < 0 || iw >= in.w) continue;
              const int64_t i = xi(n, c, ih, iw);
              const float v = src[i];
              if (best_i < 0) best_i = i;  // PyTorch starts from the window's first element
              if (v > best || std::isnan(v)) {
                best = v;
                best_i = i;
              }
            }
          }
          const int64_t o = yi(n, c, oh, ow);
          dst[o] = best;
          arg[o] = static_cast<int32_t>(best_i);
        }
}

void CpuBackend::maxpool_backward_impl(const Tensor& dy, Tensor& dx, int, int, int,
                                  const void* workspace) {
  const Dims out = dims_of(dy), in = dims_of(dx);
  const float* g = dy.f32();
  float* dst = dx.f32();
  const int32_t* arg = static_cast<const int32_t*>(workspace);
  const int64_t in_per_image = static_cast<int64_t>(dx.storage_elems()) / in.n;
  const int64_t out_per_image = static_cast<int64_t>(dy.storage_elems()) / out.n;
  // Windows overlap, so scatter per image (images never share input elements).
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < in.n; ++n) {
    float* di = dst + n * in_per_image;
    for (int64_t i = 0; i < in_per_image; ++i) di[i] = 0.f;
    for (int64_t o = n * out_per_image; o < (n + 1) * out_per_image; ++o) dst[arg[o]] += g[o];
  }
}

void CpuBackend::global_avgpool_forward_impl(const Tensor& x, Tensor& y) {
  const Dims d = dims_of(x);
  RD_CHECK(y.shape == (Shape{d.n, d.c}), "global_avgpool_forward: output " << y.describe());
  const float* src = x.f32();
  float* dst = y.f32();
  const int64_t hw = d.h * d.w;
  const float inv = 1.f / static_cast<float>(hw);
  if (is_blocked(x)) {
    const int64_t B = channel_block(x.layout), blocks = d.c / B;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t cb = 0; cb < blocks; ++cb) {
        float acc[kMaxBlock] = {};
        const float* plane = src + (n * blocks + cb) * hw * B;
        for (int64_t p = 0; p < hw; ++p) {
#pragma omp simd
          for (int64_t l = 0; l < B; ++l) acc[l] += plane[p * B + l];
        }
        for (int64_t l = 0; l < B; ++l) dst[n * d.c + cb * B + l] = acc[l] * inv;
      }
  } else if (x.layout == Layout::NHWC) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < d.n; ++n) {
      float* o = dst + n * d.c;
      for (int64_t c = 0; c < d.c; ++c) o[c] = 0.f;
      for (int64_t p = 0; p < hw; ++p) {
        const float* row = src + (n * hw + p) * d.c;
#pragma omp simd
        for (int64_t c = 0; c < d.c; ++c) o[c] += row[c];
      }
      for (int64_t c = 0; c < d.c; ++c) o[c] *= inv;
    }
  } else {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t c = 0; c < d.c; ++c) {
        const float* plane = src + (n * d.c + c) * hw;
        float s = 0.f;
        for (int64_t p = 0; p < hw; ++p) s += plane[p];
        dst[n * d.c + c] = s * inv;
      }
  }
}

void CpuBackend::global_avgpool_backward_impl(const Tensor& dy, Tensor& dx) {
  const Dims d = dims_of(dx);
  const float* g = dy.f32();
  float* dst = dx.f32();
  const int64_t hw = d.h * d.w;
  const float inv = 1.f / static_cast<float>(hw);
  if (is_blocked(dx)) {
    const int64_t B = channel_block(dx.layout), blocks = d.c / B;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t cb = 0; cb < blocks; ++cb) {
        float* plane = dst + (n * blocks + cb) * hw * B;
        const float* gi = g + n * d.c + cb * B;
        for (int64_t p = 0; p < hw; ++p) {
#pragma omp simd
          for (int64_t l = 0; l < B; ++l) plane[p * B + l] = gi[l] * inv;
        }
      }
  } else if (dx.layout == Layout::NHWC) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t p = 0; p < hw; ++p) {
        float* row = dst + (n * hw + p) * d.c;
        const float* gi = g + n * d.c;
#pragma omp simd
        for (int64_t c = 0; c < d.c; ++c) row[c] = gi[c] * inv;
      }
  } else {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t c = 0; c < d.c; ++c) {
        float* plane = dst + (n * d.c + c) * hw;
        const float v = g[n * d.c + c] * inv;
        for (int64_t p = 0; p < hw; ++p) plane[p] = v;
      }
  }
}

// ---- linear (row-major GEMMs through oneDNN's sgemm) ----------------------------------

static void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const dnnl_status_t st = dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  RD_CHECK(st == dnnl_success, "dnnl_sgemm failed with status " << static_cast<int>(st));
}

void CpuBackend::linear_forward_impl(const Tensor& x, const Tensor& w, const float* b, Tensor& y) {
  const int64_t n = x.shape[0], in = x.shape[1], out = w.shape[0];
  RD_CHECK(w.shape[1] == in && y.shape == (Shape{n, out}),
           "linear_forward: x " << x.describe() << " w " << w.describe() << " y " << y.describe());
  float* yo = y.f32();
  if (b) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < out; ++j) yo[r * out + j] = b[j];
  }
  sgemm('N', 'T', n, out, in, 1.f, x.f32(), in, w.f32(), in, b ? 1.f : 0.f, yo, out);
}

void CpuBackend::linear_backward_impl(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                                 Tensor& dw, float* db, bool accumulate) {
  const int64_t n = x.shape[0], in = x.shape[1], out = w.shape[0];
  const float beta = accumulate ? 1.f : 0.f;
  sgemm('T', 'N', out, in, n, 1.f, dy.f32(), out, x.f32(), in, beta, dw.f32(), in);
  if (db) {
    const float* g = dy.f32();
    for (int64_t j = 0; j < out; ++j) {
      double s = 0.0;
      for (int64_t r = 0; r < n; ++r) s += g[r * out + j];
      db[j] = static_cast<float>(accumulate ? db[j] + s : s);
    }
  }
  if (dx) sgemm('N', 'N', n, in, out, 1.f, dy.f32(), out, w.f32(), in, 0.f, dx->f32(), in);
}

// ---- loss ---------------------------------------------------------------------------

namespace {
// The row loop both cross-entropies share: `row(r, z_row, dz_row, &argmax)` returns the
// row's loss; the mean's 1/n is folded into the gradient scale.
template <class Row>
double softmax_xent_rows(const Tensor& logits, float grad_scale, Tensor* dlogits, int32_t* predictions, Row row) {
  const int64_t n = logits.shape[0], k = logits.shape[1];
  const float* z = logits.f32();
  float* dz = dlogits ? dlogits->f32() : nullptr;
  const float row_scale = n > 0 ? grad_scale / static_cast<float>(n) : 0.f;
  double total = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    int amax = 0;
    total += row(r, z + r * k, static_cast<int>(k), row_scale, dz ? dz + r * k : nullptr, &amax);
    if (predictions) predictions[r] = amax;
  }
  return total;
}
}  // namespace

double CpuBackend::softmax_xent_impl(const Tensor& logits, const int32_t* labels, float smoothing,
                                float grad_scale, Tensor* dlogits, int32_t* predictions) {
  return softmax_xent_rows(logits, grad_scale, dlogits, predictions,
                           [&](int64_t r, const float* z, int k, float scale, float* dz, int* amax) {
                             RD_CHECK(labels[r] >= 0 && labels[r] < k, "softmax_xent: label " << labels[r]
                                                                            << " out of range for " << k << " classes");
                             return math::softmax_xent_row(z, k, labels[r], smoothing, scale, dz, amax);
                           });
}

// ---- MixUp / CutMix (torchvision's reference recipe) -----------------------------------------------------------

void CpuBackend::mix_images_impl(const Tensor& src, Tensor& dst, const math::ImageMix& mix) {
  const Indexer at(src);
  const Dims d = at.d;
  const float* in = src.f32();
  float* out = dst.f32();
  // torch multiplies by float casts of lambda and of (1 - lambda) taken in double.
  const float self_w = mix.lambda, partner_w = static_cast<float>(1.0 - static_cast<double>(mix.lambda));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t n = 0; n < d.n; ++n)
    for (int64_t c = 0; c < d.c; ++c) {
      const int64_t partner = n == 0 ? d.n - 1 : n - 1;  // the batch rolled by one
      for (int64_t h = 0; h < d.h; ++h)
        for (int64_t w = 0; w < d.w; ++w) {
          const float self = in[at(n, c, h, w)], other = in[at(partner, c, h, w)];
          float v;
          if (mix.cutmix)
            v = (h >= mix.y0 && h < mix.y1 && w >= mix.x0 && w < mix.x1) ? other : self;
          else
            v = math::mixup_element(self, other, self_w, partner_w);
          out[at(n, c, h, w)] = v;
        }
    }
}

double CpuBackend::softmax_xent_mixed_impl(const Tensor& logits, const int32_t* labels, const int32_t* partner_labels,
                                           float lam, float smoothing, float grad_scale, Tensor* dlogits,
                                           int32_t* predictions) {
  return softmax_xent_rows(logits, grad_scale, dlogits, predictions,
                           [&](int64_t r, const float* z, int k, float scale, float* dz, int* amax) {
                             return math::softmax_xent_mixed_row(z, k, labels[r], partner_labels[r], lam, smoothing,
                                                                 scale, dz, amax);
                           });
}

// Host memory is this backend's device memory: the same loss, added into `sums` at once.
// The CPU records no graphs, so a loss always reads the host arrays it is called with.
void CpuBackend::stage_loss_labels_impl(const int32_t*, const int32_t*, const int32_t*, int64_t) {}

void CpuBackend::softmax_xent_sums_impl(const Tensor& logits, const int32_t* labels, const int32_t* partner_labels,
                                        float lam, float smoothing, float grad_scale, Tensor* dlogits,
                                        const int32_t* accuracy_targets, double* sums,
                                        const math::AmpStepState* amp) {
  const size_t n = static_cast<size_t>(logits.shape[0]);
  sum_predictions_.resize(n);
  if (amp) grad_scale = math::amp_grad_scale(*amp, grad_scale);  // this backend's memory is the host's
  const double loss =
      partner_labels ? softmax_xent_mixed_impl(logits, labels, partner_labels, lam, smoothing, grad_scale, dlogits,
                                               sum_predictions_.data())
                     : softmax_xent_impl(logits, labels, smoothing, grad_scale, dlogits, sum_predictions_.data());
  int64_t correct = 0;
  for (size_t i = 0; i < n; ++i) correct += sum_predictions_[i] == accuracy_targets[i];
  sums[0] += loss;
  sums[1] += static_cast<double>(correct);
  sums[2] += std::isfinite(loss) ? 0.0 : 1.0;
}

void CpuBackend::timing_mark(int index) {
  RD_CHECK(index >= 0, "timing_mark: index " << index << " is negative");
  const size_t i = static_cast<size_t>(index);
  if (marks_.size() <= i) marks_.resize(i + 1), marked_.resize(i + 1, false);
  marks_[i] = std::chrono::steady_clock::now();
  marked_[i] = true;
}

double CpuBackend::timing_seconds(int from, int to) {
  for (int m : {from, to})
    RD_CHECK(m >= 0 && static_cast<size_t>(m) < marked_.size() && marked_[static_cast<size_t>(m)],
             "timing_seconds: mark " << m << " was never recorded");
  return std::chrono::duration<double>(marks_[static_cast<size_t>(to)] - marks_[static_cast<size_t>(from)]).count();
}

// ---- optimizers -------------------------------------------------------------------------

void CpuBackend::amp_unscale_impl(float* grads, size_t count, math::AmpStepState* state, bool found_inf_elsewhere) {
  const bool finite = unscale_and_check(grads, math::amp_unscale_factor(*state), count);
  math::amp_finish_step(*state, found_inf_elsewhere || !finite);
}

void CpuBackend::set_optimizer_scalars_impl(math::OptimizerStepScalars* dst, const math::OptimizerStepScalars& values) {
  *dst = values;
}

void CpuBackend::adam_step_impl(float* p, const float* g, float* m, float* v, size_t count,
                                const math::AdamArgs& a) {
  math::AdamHyper h = math::adam_hyper(a);
  if (!math::adam_hyper_for_step(h, a.amp, a.scalars)) return;
  // firstprivate: each thread's own copy, which the stores to p, m, v cannot alias. Shared,
  // GCC 12 reloaded h every element and, without AVX-512's masks, kept the loop scalar.
#pragma omp parallel for simd schedule(static) firstprivate(h)
  for (size_t i = 0; i < count; ++i) math::adam_update(p[i], g[i], m[i], v[i], h);
}

void CpuBackend::sgd_step_impl(float* p, const float* g, float* buf, size_t count, const math::SgdHyper& h) {
  // Two loops, not `buf ? buf[i] : local` in one: that select kept the loop scalar. A
  // private copy of h, as in adam_step_impl: a shared one kept AVX2 builds scalar.
  math::SgdHyper hp = h;
  if (!math::sgd_hyper_for_step(hp)) return;
  if (buf) {
#pragma omp parallel for simd schedule(static) firstprivate(hp)
    for (size_t i = 0; i < count; ++i) math::sgd_update(p[i], g[i], buf[i], hp);
  } else {
#pragma omp parallel for simd schedule(static) firstprivate(hp)
    for (size_t i = 0; i < count; ++i) {
      float unused = 0.f;
      math::sgd_update(p[i], g[i], unused, hp);
    }
  }
}

// Fixed chunks summed in a fixed order: the sums do not depend on the thread count, so
// ranks with different --threads still compute the same norms (and clip factors).
void CpuBackend::segment_sum_squares_impl(const float* x, const int64_t* ranges, size_t segments, double* sums) {
  constexpr int64_t kChunk = 4096;
  std::vector<int64_t> first_chunk(segments + 1, 0);
  for (size_t s = 0; s < segments; ++s)
    first_chunk[s + 1] = first_chunk[s] + (ranges[2 * s + 1] - ranges[2 * s] + kChunk - 1) / kChunk;
  const auto chunks = static_cast<size_t>(first_chunk[segments]);
  std::vector<int64_t> chunk_begin(chunks), chunk_end(chunks);
  for (size_t s = 0; s < segments; ++s)
    for (int64_t c = first_chunk[s]; c < first_chunk[s + 1]; ++c) {
      chunk_begin[static_cast<size_t>(c)] = ranges[2 * s] + (c - first_chunk[s]) * kChunk;
      chunk_end[static_cast<size_t>(c)] = std::min(chunk_begin[static_cast<size_t>(c)] + kChunk, ranges[2 * s + 1]);
    }
  std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; ++c) {
    double acc = 0.0;
    for (int64_t i = chunk_begin[c]; i < chunk_end[c]; ++i) acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    partial[c] = acc;
  }
  for (size_t s = 0; s < segments; ++s) {
    double acc = 0.0;
    for (int64_t c = first_chunk[s]; c < first_chunk[s + 1]; ++c) acc += partial[static_cast<size_t>(c)];
    sums[s] = acc;
  }
}

namespace {

// One parameter segment under rule R, the state that exists passed as a pointer and the
// rest as a local: a straight-line body (vectorised), inside the caller's parallel region.
template <math::SegmentRule R, bool HasS0, bool HasS1>
void segment_range(float* p, float* g, float* s0, float* s1, int64_t b, int64_t e, float d, float k,
                   const math::SegmentHyper& h) {
#pragma omp for simd schedule(static) nowait
  for (int64_t i = b; i < e; ++i) {
    float a0 = HasS0 ? s0[i] : 0.f, a1 = HasS1 ? s1[i] : 0.f;
    math::segment_update_as<R>(p[i], g[i], a0, a1, d, k, h);
    if constexpr (HasS0) s0[i] = a0;
    if constexpr (HasS1) s1[i] = a1;
  }
}

template <math::SegmentRule R, bool HasS0, bool HasS1>
void segment_ranges(float* p, float* g, float* s0, float* s1, const int64_t* ranges, size_t segments,
                    const float* decay, const float* scale, const math::SegmentHyper& h) {
  // One parallel region for all segments (not one per segment); elementwise, so the
  // result does not depend on how the threads split a segment.
#pragma omp parallel
  for (size_t s = 0; s < segments; ++s)
    segment_range<R, HasS0, HasS1>(p, g, s0, s1, ranges[2 * s], ranges[2 * s + 1], decay[s],
                                   math::segment_scale_for_step(h, decay[s], scale[s]), h);
}

template <math::SegmentRule R>
void segment_ranges_with_state(float* p, float* g, float* s0, float* s1, const int64_t* ranges, size_t segments,
                               const float* decay, const float* scale, const math::SegmentHyper& h) {
  if (s0 && s1) segment_ranges<R, true, true>(p, g, s0, s1, ranges, segments, decay, scale, h);
  else if (s0) segment_ranges<R, true, false>(p, g, s0, s1, ranges, segments, decay, scale, h);
  else if (s1) segment_ranges<R, false, true>(p, g, s0, s1, ranges, segments, decay, scale, h);
  else segment_ranges<R, false, false>(p, g, s0, s1, ranges, segments, decay, scale, h);
}

}  // namespace

void CpuBackend::segment_step_impl(float* p, float* g, float* s0, float* s1, const int64_t* ranges, size_t segments,
                                   const float* decay, const float* scale, const math::SegmentHyper& step_hyper) {
  using math::SegmentRule;
  math::SegmentHyper h = step_hyper;
  if (!math::segment_hyper_for_step(h)) return;
  auto run = [&](auto rule) {
    segment_ranges_with_state<decltype(rule)::value>(p, g, s0, s1, ranges, segments, decay, scale, h);
  };
  switch (h.rule) {
    case SegmentRule::Sgd: return run(std::integral_constant<SegmentRule, SegmentRule::Sgd>{});
    case SegmentRule::Lars: return run(std::integral_constant<SegmentRule, SegmentRule::Lars>{});
    case SegmentRule::Adam: return run(std::integral_constant<SegmentRule, SegmentRule::Adam>{});
    case SegmentRule::AdamW: return run(std::integral_constant<SegmentRule, SegmentRule::AdamW>{});
    case SegmentRule::RmsProp: return run(std::integral_constant<SegmentRule, SegmentRule::RmsProp>{});
    case SegmentRule::LambMoments: return run(std::integral_constant<SegmentRule, SegmentRule::LambMoments>{});
    case SegmentRule::ScaledDescent: return run(std::integral_constant<SegmentRule, SegmentRule::ScaledDescent>{});
  }
}

void CpuBackend::ema_update_impl(float* averaged, const float* current, size_t count, float decay,
                                 float one_minus_decay, bool copy) {
  if (copy) {
    std::memcpy(averaged, current, count * sizeof(float));
    return;
  }
  // Both products go through memory before the add: under -march=native GCC would
  // otherwise fuse one of them into an FMA and round differently from torch's three
  // kernels (math::ema_average's rounding; the CUDA kernel gets it from __fmul_rn).
  constexpr size_t kChunk = 1024;
  const size_t chunks = (count + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; ++c) {
    alignas(64) float scaled_avg[kChunk], scaled_cur[kChunk];
    const size_t begin = c * kChunk, n = std::min(kChunk, count - begin);
    float* avg = averaged + begin;
    const float* cur = current + begin;
    for (size_t j = 0; j < n; ++j) scaled_avg[j] = decay * avg[j];
    for (size_t j = 0; j < n; ++j) scaled_cur[j] = one_minus_decay * cur[j];
    for (size_t j = 0; j < n; ++j) avg[j] = scaled_avg[j] + scaled_cur[j];
  }
}

void CpuBackend::scale(float* data, float factor, size_t count) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < count; ++i) data[i] *= factor;
}

bool CpuBackend::all_finite(const float* data, size_t count) {
  int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static)
  for (size_t i = 0; i < count; ++i) bad |= !std::isfinite(data[i]);
  return bad == 0;
}

// Two passes, as the scaled gradients are read once more for the check; the CPU
// runs fp32/bf16 without loss scaling, so this is off the hot path.
bool CpuBackend::unscale_and_check(float* data, float factor, size_t count) {
  scale(data, factor, count);
  return all_finite(data, count);
}

}  // namespace rd::cpu

namespace rd {
std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& opts) {
  return std::make_unique<cpu::CpuBackend>(opts);
}
}  // namespace rd
