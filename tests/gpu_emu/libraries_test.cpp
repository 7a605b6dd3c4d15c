// The cuBLAS and cuDNN stand-ins of the emulated device (tests/cuda_emu/
// cublas.cpp, cudnn.cpp) against float64 references: Sgemm's transposes, leading
// dimensions and beta; the three convolutions in NCHW/NHWC, fp32/fp16/bf16, with
// strides, padding, 1x1/3x3/7x7 filters, odd channel counts and alpha/beta; Find's
// entries and workspace rule (a TF32 entry's workspace is not the FMA kernel's), NOT_SUPPORTED and BAD_PARAM, TF32
// against FMA, and that work runs on the stream with the values of the call.
//
// The emulated device is an H200 unless RD_EMU_DEVICE says otherwise (main below);
// the [device] cases also run on an emulated RTX 5000 (libraries.cmake), where
// there is no TF32 and no bf16.
#define CATCH_CONFIG_RUNNER
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cuda_emu/emu.h"
#include "reference/reference_ops.h"

namespace {

using rd::ref::Act;
using rd::ref::Vec;

#define CUDA_OK(call) REQUIRE((call) == cudaSuccess)
#define BLAS_OK(call) REQUIRE((call) == CUBLAS_STATUS_SUCCESS)
#define DNN_OK(call) REQUIRE((call) == CUDNN_STATUS_SUCCESS)

// TF32 needs sm_80+, and NVIDIA_TF32_OVERRIDE=0 turns it off (documented).
bool tf32_device() {
  const char* o = std::getenv("NVIDIA_TF32_OVERRIDE");
  return rd::emu::device_spec().major >= 8 && !(o && std::string(o) == "0");
}
bool bf16_device() { return rd::emu::device_spec().major >= 8; }

// Deterministic values in [-1, 1).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  double next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
  }
};

// A stream and device buffers for one test.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
  void sync() const { REQUIRE(cudaStreamSynchronize(s) == cudaSuccess); }
};

struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) { REQUIRE(cudaMalloc(&p, n ? n : 1) == cudaSuccess); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
  void upload(const void* h, const Stream& st) {
    CUDA_OK(cudaMemcpyAsync(p, h, bytes, cudaMemcpyHostToDevice, st.s));
    st.sync();
  }
  void download(void* h, const Stream& st) const {
    CUDA_OK(cudaMemcpyAsync(h, p, bytes, cudaMemcpyDeviceToHost, st.s));
    st.sync();
  }
};

// TF32 rounding written independently of the stand-ins: to 11 significant bits,
// to nearest with ties away from zero.
double tf32(double v) {
  const float f = static_cast<float>(v);
  if (f == 0.f || !std::isfinite(f)) return f;
  int e = 0;
  std::frexp(f, &e);  // f = m * 2^e, 0.5 <= |m| < 1
  const double q = std::ldexp(1.0, e - 11);
  return std::round(static_cast<double>(f) / q) * q;
}

// ---- cuBLAS -------------------------------------------------------------------------------

struct Gemm {
  cublasOperation_t ta, tb;
  int m, n, k, lda, ldb, ldc;
  std::vector<float> a, b, c0;
};

Gemm make_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, uint64_t seed) {
  Gemm g{ta, tb, m, n, k, 0, 0, 0, {}, {}, {}};
  const int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
  const int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
  g.lda = a_rows + 3, g.ldb = b_rows + 1, g.ldc = m + 2;  // odd padding on purpose
  Rng r(seed);
  g.a.resize(static_cast<size_t>(g.lda) * a_cols);
  g.b.resize(static_cast<size_t>(g.ldb) * b_cols);
  g.c0.resize(static_cast<size_t>(g.ldc) * n);
  for (auto& v : g.a) v = static_cast<float>(r.next());
  for (auto& v : g.b) v = static_cast<float>(r.next());
  for (auto& v : g.c0) v = static_cast<float>(r.next());
  return g;
}

// C (column-major, ldc) = alpha op(A) op(B) + beta C0 in double; `abs` gets the
// same with absolute values (the scale of the rounding errors).
void gemm_ref(const Gemm& g, double alpha, double beta, bool round_tf32, std::vector<double>& c,
              std::vector<double>& abs) {
  c.assign(g.c0.size(), 0.0);
  abs.assign(g.c0.size(), 0.0);
  auto A = [&](int i, int l) {
    const double v = g.ta == CUBLAS_OP_N ? g.a[static_cast<size_t>(l) * g.lda + i]
                                         : g.a[static_cast<size_t>(i) * g.lda + l];
    return round_tf32 ? tf32(v) : v;
  };
  auto B = [&](int l, int j) {
    const double v = g.tb == CUBLAS_OP_N ? g.b[static_cast<size_t>(j) * g.ldb + l]
                                         : g.b[static_cast<size_t>(l) * g.ldb + j];
    return round_tf32 ? tf32(v) : v;
  };
  for (int j = 0; j < g.n; ++j)
    for (int i = 0; i < g.m; ++i) {
      double s = 0, sa = 0;
      for (int l = 0; l < g.k; ++l) s += A(i, l) * B(l, j), sa += std::fabs(A(i, l) * B(l, j));
      const size_t o = static_cast<size_t>(j) * g.ldc + i;
      c[o] = alpha * s + (beta == 0 ? 0.0 : beta * g.c0[o]);
      abs[o] = std::fabs(alpha) * sa + std::fabs(beta * g.c0[o]);
    }
}

// Runs Sgemm with C0 in C (NaN instead when nan_c); returns C.
std::vector<float> run_gemm(cublasHandle_t h, const Stream& st, const Gemm& g, float alpha, float beta,
                            bool nan_c) {
  DevBuf da(g.a.size() * 4), db(g.b.size() * 4), dc(g.c0.size() * 4);
  da.upload(g.a.data(), st);
  db.upload(g.b.data(), st);
  std::vector<float> c = g.c0;
  if (nan_c)
    for (int j = 0; j < g.n; ++j)
      for (int i = 0; i < g.m; ++i)
        c[static_cast<size_t>(j) * g.ldc + i] = std::numeric_limits<float>::quiet_NaN();
  dc.upload(c.data(), st);
  BLAS_OK(cublasSgemm(h, g.ta, g.tb, g.m, g.n, g.k, &alpha, da.as<float>(), g.lda, db.as<float>(), g.ldb,
                      &beta, dc.as<float>(), g.ldc));
  dc.download(c.data(), st);
  return c;
}

// Checks C against the reference inside the m x n block and that the padding rows
// (ldc > m) were not written.
void check_gemm(const Gemm& g, const std::vector<float>& got, const std::vector<double>& ref,
                const std::vector<double>& abs, double rel, const std::vector<float>& before) {
  for (int j = 0; j < g.n; ++j)
    for (int i = 0; i < g.ldc; ++i) {
      const size_t o = static_cast<size_t>(j) * g.ldc + i;
      if (i >= g.m) {
        REQUIRE(std::memcmp(&got[o], &before[o], 4) == 0);
        continue;
      }
      INFO("C(" << i << "," << j << ") got " << got[o] << " want " << ref[o]);
      REQUIRE(std::isfinite(got[o]));
      REQUIRE(std::fabs(got[o] - ref[o]) <= rel * abs[o] + 1e-30);
    }
}

struct Blas {
  cublasHandle_t h = nullptr;
  Stream st;
  Blas() {
    REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasSetStream(h, st.s) == CUBLAS_STATUS_SUCCESS);
  }
  ~Blas() { cublasDestroy(h); }
};

TEST_CASE("cublasSgemm: four transpose combinations, odd leading dimensions, beta 0 and 1", "[cublas]") {
  Blas b;
  BLAS_OK(cublasSetMathMode(b.h, CUBLAS_DEFAULT_MATH));
  const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T};
  uint64_t seed = 1;
  for (auto ta : ops)
    for (auto tb : ops)
      for (float beta : {0.f, 1.f}) {
        INFO("transa " << ta << " transb " << tb << " beta " << beta);
        const Gemm g = make_gemm(ta, tb, 5, 7, 9, seed++);
        std::vector<double> ref, abs;
        gemm_ref(g, 1.5, beta, false, ref, abs);
        // beta == 0: C starts as NaN, which must not reach the result.
        std::vector<float> before = g.c0;
        if (beta == 0.f)
          for (int j = 0; j < g.n; ++j)
            for (int i = 0; i < g.m; ++i) before[static_cast<size_t>(j) * g.ldc + i] = NAN;
        const std::vector<float> got = run_gemm(b.h, b.st, g, 1.5f, beta, beta == 0.f);
        check_gemm(g, got, ref, abs, 1e-6, before);
      }
}

TEST_CASE("cublasSgemm: the backend's linear layer shapes", "[cublas]") {
  // y^T = W x^T (T, N), dx^T = W^T dy^T (N, N), dW^T += x^T dy (N, T), as in cuda_backend.cpp.
  Blas b;
  const int in = 13, out = 6, n = 3;
  struct Shape {
    cublasOperation_t ta, tb;
    int m, n, k;
  } shapes[] = {{CUBLAS_OP_T, CUBLAS_OP_N, out, n, in},
                {CUBLAS_OP_N, CUBLAS_OP_N, in, n, out},
                {CUBLAS_OP_N, CUBLAS_OP_T, in, out, n}};
  uint64_t seed = 40;
  for (const Shape& s : shapes) {
    Gemm g = make_gemm(s.ta, s.tb, s.m, s.n, s.k, seed++);
    std::vector<double> ref, abs;
    gemm_ref(g, 1.0, 1.0, false, ref, abs);
    check_gemm(g, run_gemm(b.h, b.st, g, 1.f, 1.f, false), ref, abs, 1e-6, g.c0);
  }
}

TEST_CASE("cublasSgemm: INVALID_VALUE for short leading dimensions and negative sizes", "[cublas]") {
  Blas b;
  DevBuf buf(4096);
  float* p = buf.as<float>();
  const float one = 1.f, zero = 0.f;
  // m=4, n=3, k=5: A is 4x5 (N) or 5x4 (T), B 5x3 (N) or 3x5 (T).
  CHECK(cublasSgemm(b.h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 5, &one, p, 3, p, 5, &zero, p, 4) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasSgemm(b.h, CUBLAS_OP_T, CUBLAS_OP_N, 4, 3, 5, &one, p, 4, p, 5, &zero, p, 4) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasSgemm(b.h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 5, &one, p, 4, p, 4, &zero, p, 4) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasSgemm(b.h, CUBLAS_OP_N, CUBLAS_OP_T, 4, 3, 5, &one, p, 4, p, 2, &zero, p, 4) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasSgemm(b.h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 5, &one, p, 4, p, 5, &zero, p, 3) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasSgemm(b.h, CUBLAS_OP_N, CUBLAS_OP_N, -1, 3, 5, &one, p, 4, p, 5, &zero, p, 4) ==
        CUBLAS_STATUS_INVALID_VALUE);
  // The smallest legal leading dimensions pass.
  CHECK(cublasSgemm(b.h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 5, &one, p, 4, p, 5, &zero, p, 4) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSgemm(b.h, CUBLAS_OP_T, CUBLAS_OP_T, 4, 3, 5, &one, p, 5, p, 3, &zero, p, 4) ==
        CUBLAS_STATUS_SUCCESS);
  b.st.sync();
  CHECK(std::string(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE)) == "CUBLAS_STATUS_INVALID_VALUE");
  CHECK(!std::string(cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE)).empty());
}

TEST_CASE("cublasSgemm: TF32 math rounds the inputs, FMA does not", "[cublas][device]") {
  Blas b;
  const Gemm g = make_gemm(CUBLAS_OP_T, CUBLAS_OP_N, 8, 5, 33, 77);
  std::vector<double> ref, abs, ref32, abs32;
  gemm_ref(g, 1.0, 0.0, false, ref, abs);
  gemm_ref(g, 1.0, 0.0, true, ref32, abs32);
  BLAS_OK(cublasSetMathMode(b.h, CUBLAS_DEFAULT_MATH));
  const std::vector<float> fma = run_gemm(b.h, b.st, g, 1.f, 0.f, true);
  check_gemm(g, fma, ref, abs, 1e-6, fma);
  BLAS_OK(cublasSetMathMode(b.h, CUBLAS_TF32_TENSOR_OP_MATH));
  const std::vector<float> t = run_gemm(b.h, b.st, g, 1.f, 0.f, true);
  if (tf32_device()) {
    check_gemm(g, t, ref32, abs32, 1e-6, t);
    // Apart from the FMA result by about the TF32 rounding of the two inputs.
    double worst = 0;
    for (int j = 0; j < g.n; ++j)
      for (int i = 0; i < g.m; ++i) {
        const size_t o = static_cast<size_t>(j) * g.ldc + i;
        const double d = std::fabs(t[o] - fma[o]) / abs[o];
        REQUIRE(d <= std::ldexp(1.0, -10));
        worst = std::max(worst, d);
      }
    CHECK(worst > 1e-5);
  } else {
    CHECK(t == fma);  // no TF32 before sm_80
  }
}

TEST_CASE("cublasSgemm: alpha and beta are read at the call, the work runs on the stream", "[cublas]") {
  Blas b;
  const Gemm g = make_gemm(CUBLAS_OP_N, CUBLAS_OP_N, 3, 4, 2, 9);
  DevBuf da(g.a.size() * 4), db(g.b.size() * 4), dc(g.c0.size() * 4);
  da.upload(g.a.data(), b.st);
  db.upload(g.b.data(), b.st);
  dc.upload(g.c0.data(), b.st);
  float alpha = 2.f, beta = 1.f;
  BLAS_OK(cublasSgemm(b.h, g.ta, g.tb, g.m, g.n, g.k, &alpha, da.as<float>(), g.lda, db.as<float>(), g.ldb,
                      &beta, dc.as<float>(), g.ldc));
  alpha = 100.f, beta = 0.f;  // too late: pointer mode host reads them at the call
  std::vector<float> c(g.c0.size());
  dc.download(c.data(), b.st);
  std::vector<double> ref, abs;
  gemm_ref(g, 2.0, 1.0, false, ref, abs);
  check_gemm(g, c, ref, abs, 1e-6, g.c0);
}

// ---- cuDNN --------------------------------------------------------------------------------

enum class DT { F32, F16, BF16 };
const char* dt_str(DT d) { return d == DT::F32 ? "f32" : d == DT::F16 ? "f16" : "bf16"; }
cudnnDataType_t dnn_dt(DT d) {
  return d == DT::F32 ? CUDNN_DATA_FLOAT : d == DT::F16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
}
size_t dt_size(DT d) { return d == DT::F32 ? 4 : 2; }
// Half an ulp of the output type, relative.
double out_eps(DT d) {
  return d == DT::F32 ? std::ldexp(1.0, -24) : d == DT::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
}

// Host buffers in the device type, converted with the toolkit's own conversions.
std::vector<unsigned char> encode(const Vec& v, DT d) {
  std::vector<unsigned char> out(v.size() * dt_size(d));
  for (size_t i = 0; i < v.size(); ++i) {
    if (d == DT::F32) {
      const float f = static_cast<float>(v[i]);
      std::memcpy(&out[i * 4], &f, 4);
    } else if (d == DT::F16) {
      const __half h = __double2half(v[i]);
      std::memcpy(&out[i * 2], &h, 2);
    } else {
      const __nv_bfloat16 h = __double2bfloat16(v[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}
Vec decode(const std::vector<unsigned char>& b, DT d) {
  Vec out(b.size() / dt_size(d));
  for (size_t i = 0; i < out.size(); ++i) {
    if (d == DT::F32) {
      float f;
      std::memcpy(&f, &b[i * 4], 4);
      out[i] = f;
    } else if (d == DT::F16) {
      __half h;
      std::memcpy(&h, &b[i * 2], 2);
      out[i] = __half2float(h);
    } else {
      __nv_bfloat16 h;
      std::memcpy(&h, &b[i * 2], 2);
      out[i] = __bfloat162float(h);
    }
  }
  return out;
}
// Values exactly representable in the type.
Vec quantize(Vec v, DT d) { return decode(encode(v, d), d); }

// NCHW (reference order) <-> the device layout.
Vec to_layout(const Act& a, bool nhwc) {
  if (!nhwc) return a.v;
  Vec out(a.v.size());
  size_t o = 0;
  for (int64_t n = 0; n < a.n; ++n)
    for (int64_t h = 0; h < a.h; ++h)
      for (int64_t w = 0; w < a.w; ++w)
        for (int64_t c = 0; c < a.c; ++c) out[o++] = a.at(n, c, h, w);
  return out;
}
Act from_layout(const Vec& v, int64_t N, int64_t C, int64_t H, int64_t W, bool nhwc) {
  Act a(N, C, H, W);
  size_t o = 0;
  if (!nhwc) {
    a.v = v;
    return a;
  }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t w = 0; w < W; ++w)
        for (int64_t c = 0; c < C; ++c) a.at(n, c, h, w) = v[o++];
  return a;
}
// Filter KCRS (reference) <-> KRSC for an NHWC filter descriptor.
Vec filter_to(const Vec& w, int K, int C, int R, bool nhwc) {
  if (!nhwc) return w;
  Vec out(w.size());
  size_t o = 0;
  for (int k = 0; k < K; ++k)
    for (int r = 0; r < R; ++r)
      for (int s = 0; s < R; ++s)
        for (int c = 0; c < C; ++c) out[o++] = w[((static_cast<size_t>(k) * C + c) * R + r) * R + s];
  return out;
}
Vec filter_from(const Vec& w, int K, int C, int R, bool nhwc) {
  if (!nhwc) return w;
  Vec out(w.size());
  size_t o = 0;
  for (int k = 0; k < K; ++k)
    for (int r = 0; r < R; ++r)
      for (int s = 0; s < R; ++s)
        for (int c = 0; c < C; ++c) out[((static_cast<size_t>(k) * C + c) * R + r) * R + s] = w[o++];
  return out;
}
Vec abs_of(const Vec& v) {
  Vec out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = std::fabs(v[i]);
  return out;
}
Act abs_of(const Act& a) {
  Act out = a;
  out.v = abs_of(a.v);
  return out;
}

struct Geo {
  int N, C, H, W, K, R, stride, pad;
};

// One convolution problem with its descriptors.
struct Conv {
  Geo g;
  DT dt;
  bool nhwc;
  int P, Q;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  Conv(const Geo& geo, DT d, bool nhwc_, cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION)
      : g(geo), dt(d), nhwc(nhwc_) {
    P = static_cast<int>(rd::ref::out_size(g.H, g.R, g.stride, g.pad));
    Q = static_cast<int>(rd::ref::out_size(g.W, g.R, g.stride, g.pad));
    const cudnnTensorFormat_t f = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    DNN_OK(cudnnCreateTensorDescriptor(&x));
    DNN_OK(cudnnCreateTensorDescriptor(&y));
    DNN_OK(cudnnCreateFilterDescriptor(&w));
    DNN_OK(cudnnCreateConvolutionDescriptor(&conv));
    DNN_OK(cudnnSetTensor4dDescriptor(x, f, dnn_dt(d), g.N, g.C, g.H, g.W));
    DNN_OK(cudnnSetTensor4dDescriptor(y, f, dnn_dt(d), g.N, g.K, P, Q));
    DNN_OK(cudnnSetFilter4dDescriptor(w, dnn_dt(d), f, g.K, g.C, g.R, g.R));
    DNN_OK(cudnnSetConvolution2dDescriptor(conv, g.pad, g.pad, g.stride, g.stride, 1, 1, mode,
                                           CUDNN_DATA_FLOAT));
  }
  ~Conv() {
    cudnnDestroyTensorDescriptor(x);
    cudnnDestroyTensorDescriptor(y);
    cudnnDestroyFilterDescriptor(w);
    cudnnDestroyConvolutionDescriptor(conv);
  }
  size_t x_elems() const { return static_cast<size_t>(g.N) * g.C * g.H * g.W; }
  size_t y_elems() const { return static_cast<size_t>(g.N) * g.K * P * Q; }
  size_t w_elems() const { return static_cast<size_t>(g.K) * g.C * g.R * g.R; }
};

struct Dnn {
  cudnnHandle_t h = nullptr;
  Stream st;
  Dnn() {
    REQUIRE(cudnnCreate(&h) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnSetStream(h, st.s) == CUDNN_STATUS_SUCCESS);
  }
  ~Dnn() { cudnnDestroy(h); }
};

enum class Op { Fwd, BwdData, BwdFilter };
const char* op_str(Op o) {
  return o == Op::Fwd ? "forward" : o == Op::BwdData ? "backward data" : "backward filter";
}

struct Choice {
  int algo = -1;
  size_t ws = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  int found = 0, succeeded = 0;
  cudnnMathType_t first_math = CUDNN_DEFAULT_MATH;  // of the fastest success, any math type
};

// Find for one direction with `math` on the descriptor: the fastest success that
// uses that math type (Find also offers DEFAULT_MATH entries, whose workspace is the TF32 kernel's).
Choice find(const Dnn& d, const Conv& c, Op op, cudnnMathType_t math) {
  DNN_OK(cudnnSetConvolutionMathType(c.conv, math));
  Choice ch;
  auto take = [&](const auto* perf, int n) {
    ch.found = n;
    for (int i = 0; i < n; ++i)
      if (perf[i].status == CUDNN_STATUS_SUCCESS) {
        if (ch.succeeded++ == 0) ch.first_math = perf[i].mathType;
        if (ch.algo < 0 && perf[i].mathType == math)
          ch.algo = static_cast<int>(perf[i].algo), ch.ws = perf[i].memory, ch.math = perf[i].mathType;
      }
  };
  int n = 0;
  if (op == Op::Fwd) {
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
    DNN_OK(cudnnFindConvolutionForwardAlgorithm(d.h, c.x, c.w, c.conv, c.y, static_cast<int>(perf.size()), &n,
                                                perf.data()));
    take(perf.data(), n);
  } else if (op == Op::BwdData) {
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
    DNN_OK(cudnnFindConvolutionBackwardDataAlgorithm(d.h, c.w, c.y, c.conv, c.x,
                                                     static_cast<int>(perf.size()), &n, perf.data()));
    take(perf.data(), n);
  } else {
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
    DNN_OK(cudnnFindConvolutionBackwardFilterAlgorithm(d.h, c.x, c.y, c.conv, c.w,
                                                       static_cast<int>(perf.size()), &n, perf.data()));
    take(perf.data(), n);
  }
  return ch;
}

cudnnStatus_t launch(const Dnn& d, const Conv& c, Op op, int algo, void* ws, size_t ws_bytes,
                     const float* alpha, const float* beta, void* x, void* w, void* y) {
  switch (op) {
    case Op::Fwd:
      return cudnnConvolutionForward(d.h, alpha, c.x, x, c.w, w, c.conv,
                                     static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws, ws_bytes, beta, c.y,
                                     y);
    case Op::BwdData:
      return cudnnConvolutionBackwardData(d.h, alpha, c.w, w, c.y, y, c.conv,
                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), ws, ws_bytes,
                                          beta, c.x, x);
    default:
      return cudnnConvolutionBackwardFilter(d.h, alpha, c.x, x, c.y, y, c.conv,
                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), ws, ws_bytes,
                                            beta, c.w, w);
  }
}

// Operands of one problem (NCHW / KCRS doubles, exactly representable in dt).
struct Operands {
  Act x, dy;
  Vec w;
};
Operands make_operands(const Conv& c, uint64_t seed) {
  Rng r(seed);
  Operands o{Act(c.g.N, c.g.C, c.g.H, c.g.W), Act(c.g.N, c.g.K, c.P, c.Q), Vec(c.w_elems())};
  for (auto& v : o.x.v) v = r.next();
  for (auto& v : o.dy.v) v = r.next();
  for (auto& v : o.w) v = r.next() * 0.5;
  o.x.v = quantize(o.x.v, c.dt);
  o.dy.v = quantize(o.dy.v, c.dt);
  o.w = quantize(o.w, c.dt);
  return o;
}

// The reference output of one direction (NCHW/KCRS) and its absolute-value twin.
void conv_ref(const Conv& c, Op op, const Operands& o, bool round_tf32, bool flip, Vec& out, Vec& abs) {
  auto r32 = [&](Vec v) {
    if (round_tf32)
      for (auto& e : v) e = tf32(e);
    return v;
  };
  Act x = o.x, dy = o.dy;
  x.v = r32(x.v), dy.v = r32(dy.v);
  Vec w = r32(o.w);
  if (flip) {  // true convolution = cross-correlation with the flipped filter
    Vec f(w.size());
    const int R = c.g.R;
    for (int k = 0; k < c.g.K * c.g.C; ++k)
      for (int y = 0; y < R; ++y)
        for (int xx = 0; xx < R; ++xx)
          f[(static_cast<size_t>(k) * R + y) * R + xx] =
              w[(static_cast<size_t>(k) * R + (R - 1 - y)) * R + (R - 1 - xx)];
    w = f;
  }
  const Geo& g = c.g;
  switch (op) {
    case Op::Fwd:
      out = rd::ref::conv2d_forward(x, w, g.K, g.R, g.stride, g.pad).v;
      abs = rd::ref::conv2d_forward(abs_of(x), abs_of(w), g.K, g.R, g.stride, g.pad).v;
      break;
    case Op::BwdData:
      out = rd::ref::conv2d_backward_data(dy, w, g.C, g.H, g.W, g.R, g.stride, g.pad).v;
      abs = rd::ref::conv2d_backward_data(abs_of(dy), abs_of(w), g.C, g.H, g.W, g.R, g.stride, g.pad).v;
      break;
    case Op::BwdFilter: {
      out = rd::ref::conv2d_backward_weights(x, dy, g.R, g.stride, g.pad);
      abs = rd::ref::conv2d_backward_weights(abs_of(x), abs_of(dy), g.R, g.stride, g.pad);
      if (flip) {  // the gradient of the flipped filter, flipped back
        Vec f(out.size()), fa(abs.size());
        const int R = g.R;
        for (int k = 0; k < g.K * g.C; ++k)
          for (int y = 0; y < R; ++y)
            for (int xx = 0; xx < R; ++xx) {
              const size_t a = (static_cast<size_t>(k) * R + y) * R + xx;
              const size_t b = (static_cast<size_t>(k) * R + (R - 1 - y)) * R + (R - 1 - xx);
              f[b] = out[a], fa[b] = abs[a];
            }
        out = f, abs = fa;
      }
      break;
    }
  }
}

// Runs one direction on the emulated device with the operands and returns the
// output (NCHW / KCRS doubles). `prior` is the output's initial content (same order).
Vec run_conv(const Dnn& d, const Conv& c, Op op, const Operands& o, const Vec& prior, const Choice& ch,
             float alpha, float beta) {
  const size_t e = dt_size(c.dt);
  DevBuf dx(c.x_elems() * e), dw(c.w_elems() * e), dy(c.y_elems() * e), ws(std::max<size_t>(ch.ws, 1));
  auto up = [&](DevBuf& b, const Vec& v) {
    const auto bytes = encode(v, c.dt);
    b.upload(bytes.data(), d.st);
  };
  const Act prior_x = op == Op::BwdData ? from_layout(prior, c.g.N, c.g.C, c.g.H, c.g.W, false) : o.x;
  const Act prior_y = op == Op::Fwd ? from_layout(prior, c.g.N, c.g.K, c.P, c.Q, false) : o.dy;
  up(dx, to_layout(prior_x, c.nhwc));
  up(dy, to_layout(prior_y, c.nhwc));
  up(dw, filter_to(op == Op::BwdFilter ? prior : o.w, c.g.K, c.g.C, c.g.R, c.nhwc));
  DNN_OK(cudnnSetConvolutionMathType(c.conv, ch.math));
  DNN_OK(launch(d, c, op, ch.algo, ws.p, ch.ws, &alpha, &beta, dx.p, dw.p, dy.p));
  DevBuf& out = op == Op::Fwd ? dy : op == Op::BwdData ? dx : dw;
  std::vector<unsigned char> bytes(out.bytes);
  out.download(bytes.data(), d.st);
  const Vec v = decode(bytes, c.dt);
  if (op == Op::Fwd) return from_layout(v, c.g.N, c.g.K, c.P, c.Q, c.nhwc).v;
  if (op == Op::BwdData) return from_layout(v, c.g.N, c.g.C, c.g.H, c.g.W, c.nhwc).v;
  return filter_from(v, c.g.K, c.g.C, c.g.R, c.nhwc);
}

// got == alpha * ref + beta * prior within the accumulation error (rel of the
// absolute sum) plus the output type's rounding.
void check_conv(const Vec& got, const Vec& ref, const Vec& abs, const Vec& prior, double alpha, double beta,
                double rel, DT dt) {
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = alpha * ref[i] + (beta == 0 ? 0.0 : beta * prior[i]);
    const double scale = std::fabs(alpha) * abs[i] + std::fabs(beta * (beta == 0 ? 0.0 : prior[i]));
    INFO("element " << i << " got " << got[i] << " want " << want);
    REQUIRE(std::isfinite(got[i]));
    REQUIRE(std::fabs(got[i] - want) <= rel * scale + out_eps(dt) * std::fabs(want) * 1.0001 + 1e-30 +
                                            (dt == DT::F32 ? 0.0 : std::ldexp(1.0, -24)));
  }
}

cudnnMathType_t backend_math(DT dt) { return dt == DT::F32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH; }

TEST_CASE("cuDNN convolutions: NCHW/NHWC x fp32/fp16/bf16, strides, padding, filter sizes, alpha/beta",
          "[cudnn]") {
  Dnn d;
  const Geo geos[] = {
      {2, 3, 9, 9, 5, 3, 1, 1},    // 3x3, stride 1, pad 1, odd channels
      {1, 5, 10, 7, 3, 1, 2, 0},   // 1x1, stride 2, non-square input
      {2, 3, 11, 11, 4, 7, 2, 1},  // 7x7 stem-like, stride 2
      {1, 7, 6, 6, 3, 3, 2, 0},    // 3x3, stride 2, pad 0
  };
  uint64_t seed = 100;
  for (DT dt : {DT::F32, DT::F16, DT::BF16})
    for (bool nhwc : {false, true})
      if (dt != DT::BF16 || bf16_device())
        for (const Geo& g : geos)
          for (Op op : {Op::Fwd, Op::BwdData, Op::BwdFilter}) {
            INFO(dt_str(dt) << (nhwc ? " NHWC " : " NCHW ") << op_str(op) << " N" << g.N << " C" << g.C << " "
                            << g.H << "x" << g.W << " K" << g.K << " R" << g.R << " stride " << g.stride
                            << " pad " << g.pad);
            Conv c(g, dt, nhwc);
            const Operands o = make_operands(c, seed++);
            Vec ref, abs;
            conv_ref(c, op, o, false, false, ref, abs);
            const Choice ch = find(d, c, op, backend_math(dt));
            REQUIRE(ch.succeeded >= 2);
            REQUIRE(ch.algo >= 0);
            // alpha 1, beta 0 over a NaN output (it must not be read), then alpha/beta blending.
            const Vec nan(ref.size(), std::numeric_limits<double>::quiet_NaN());
            check_conv(run_conv(d, c, op, o, nan, ch, 1.f, 0.f), ref, abs, nan, 1.0, 0.0, 1e-6, dt);
            Rng r(seed++);
            Vec prior(ref.size());
            for (auto& v : prior) v = r.next();
            prior = quantize(prior, dt);
            check_conv(run_conv(d, c, op, o, prior, ch, 0.5f, 2.f), ref, abs, prior, 0.5, 2.0, 1e-6, dt);
          }
}

TEST_CASE("cuDNN convolutions: every algorithm Find offers computes the same result", "[cudnn]") {
  Dnn d;
  Conv c({2, 3, 8, 8, 5, 3, 1, 1}, DT::F32, false);
  const Operands o = make_operands(c, 7);
  for (Op op : {Op::Fwd, Op::BwdData, Op::BwdFilter}) {
    INFO(op_str(op));
    Vec ref, abs;
    conv_ref(c, op, o, false, false, ref, abs);
    const Vec zero(ref.size(), 0.0);
    DNN_OK(cudnnSetConvolutionMathType(c.conv, CUDNN_FMA_MATH));
    std::vector<Choice> all;
    int n = 0;
    auto collect = [&](const auto* perf) {
      for (int i = 0; i < n; ++i)
        if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].mathType == CUDNN_FMA_MATH)
          all.push_back({static_cast<int>(perf[i].algo), perf[i].memory, perf[i].mathType, n, 0});
    };
    if (op == Op::Fwd) {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      DNN_OK(cudnnFindConvolutionForwardAlgorithm(d.h, c.x, c.w, c.conv, c.y,
                                                  CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf));
      collect(perf);
    } else if (op == Op::BwdData) {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      DNN_OK(cudnnFindConvolutionBackwardDataAlgorithm(d.h, c.w, c.y, c.conv, c.x,
                                                       CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf));
      collect(perf);
    } else {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      DNN_OK(cudnnFindConvolutionBackwardFilterAlgorithm(d.h, c.x, c.y, c.conv, c.w,
                                                         CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf));
      collect(perf);
    }
    REQUIRE(all.size() >= 2);
    for (const Choice& ch : all) {
      INFO("algo " << ch.algo << " workspace " << ch.ws);
      check_conv(run_conv(d, c, op, o, zero, ch, 1.f, 0.f), ref, abs, zero, 1.0, 0.0, 1e-6, DT::F32);
    }
  }
}

TEST_CASE("cuDNN convolutions: true convolution mode flips the filter", "[cudnn]") {
  Dnn d;
  Conv c({1, 3, 7, 7, 2, 3, 1, 1}, DT::F32, true, CUDNN_CONVOLUTION);
  const Operands o = make_operands(c, 11);
  for (Op op : {Op::Fwd, Op::BwdData, Op::BwdFilter}) {
    INFO(op_str(op));
    Vec ref, abs;
    conv_ref(c, op, o, false, true, ref, abs);
    const Choice ch = find(d, c, op, CUDNN_FMA_MATH);
    REQUIRE(ch.algo >= 0);
    const Vec zero(ref.size(), 0.0);
    check_conv(run_conv(d, c, op, o, zero, ch, 1.f, 0.f), ref, abs, zero, 1.0, 0.0, 1e-6, DT::F32);
  }
}

TEST_CASE("cuDNN forward: dilation 2 equals the zero-stuffed filter", "[cudnn]") {
  Dnn d;
  // 3x3 with dilation 2 over 9x9, pad 2 == 5x5 with zeros between the taps.
  Conv wide({1, 2, 9, 9, 3, 5, 1, 2}, DT::F32, false);
  Conv dil({1, 2, 9, 9, 3, 3, 1, 2}, DT::F32, false);
  DNN_OK(
      cudnnSetConvolution2dDescriptor(dil.conv, 2, 2, 1, 1, 2, 2, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  dil.P = dil.Q = 9;  // (9 + 2*2 - (2*(3-1)+1)) / 1 + 1
  DNN_OK(cudnnSetTensor4dDescriptor(dil.y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 3, 9, 9));
  Operands o = make_operands(wide, 5);
  Vec w3(dil.w_elems());
  for (int kc = 0; kc < 3 * 2; ++kc)
    for (int y = 0; y < 5; ++y)
      for (int x = 0; x < 5; ++x) {
        if (y % 2 || x % 2)
          o.w[(static_cast<size_t>(kc) * 5 + y) * 5 + x] = 0.0;
        else
          w3[(static_cast<size_t>(kc) * 3 + y / 2) * 3 + x / 2] =
              o.w[(static_cast<size_t>(kc) * 5 + y) * 5 + x];
      }
  Vec ref, abs;
  conv_ref(wide, Op::Fwd, o, false, false, ref, abs);
  Operands o3 = o;
  o3.w = w3;
  const Choice ch = find(d, dil, Op::Fwd, CUDNN_FMA_MATH);
  REQUIRE(ch.algo >= 0);
  const Vec zero(ref.size(), 0.0);
  check_conv(run_conv(d, dil, Op::Fwd, o3, zero, ch, 1.f, 0.f), ref, abs, zero, 1.0, 0.0, 1e-6, DT::F32);
}

TEST_CASE("cuDNN: TF32 math differs from FMA by the TF32 rounding, FMA equals the reference",
          "[cudnn][device]") {
  Dnn d;
  Conv c({2, 16, 6, 6, 8, 3, 1, 1}, DT::F32, true);
  const Operands o = make_operands(c, 21);
  for (Op op : {Op::Fwd, Op::BwdData, Op::BwdFilter}) {
    INFO(op_str(op));
    Vec ref, abs, ref32, abs32;
    conv_ref(c, op, o, false, false, ref, abs);
    conv_ref(c, op, o, true, false, ref32, abs32);
    const Vec zero(ref.size(), 0.0);
    const Choice fma = find(d, c, op, CUDNN_FMA_MATH);
    REQUIRE(fma.algo >= 0);
    if (tf32_device()) CHECK(fma.first_math == CUDNN_DEFAULT_MATH);  // Find tries DEFAULT (TF32) too
    size_t need = 0;
    DNN_OK(cudnnSetConvolutionMathType(c.conv, CUDNN_FMA_MATH));
    if (op == Op::Fwd)
      DNN_OK(cudnnGetConvolutionForwardWorkspaceSize(
          d.h, c.x, c.w, c.conv, c.y, static_cast<cudnnConvolutionFwdAlgo_t>(fma.algo), &need));
    else if (op == Op::BwdData)
      DNN_OK(cudnnGetConvolutionBackwardDataWorkspaceSize(
          d.h, c.w, c.y, c.conv, c.x, static_cast<cudnnConvolutionBwdDataAlgo_t>(fma.algo), &need));
    else
      DNN_OK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
          d.h, c.x, c.y, c.conv, c.w, static_cast<cudnnConvolutionBwdFilterAlgo_t>(fma.algo), &need));
    CHECK(need == fma.ws);
    const Vec f = run_conv(d, c, op, o, zero, fma, 1.f, 0.f);
    check_conv(f, ref, abs, zero, 1.0, 0.0, 1e-6, DT::F32);
    const Choice t = find(d, c, op, CUDNN_DEFAULT_MATH);
    REQUIRE(t.algo >= 0);
    const Vec tv = run_conv(d, c, op, o, zero, t, 1.f, 0.f);
    if (tf32_device()) {
      check_conv(tv, ref32, abs32, zero, 1.0, 0.0, 1e-6, DT::F32);
      double worst = 0;
      for (size_t i = 0; i < tv.size(); ++i) {
        const double rel = std::fabs(tv[i] - f[i]) / abs[i];
        REQUIRE(rel <= std::ldexp(1.0, -10));
        worst = std::max(worst, rel);
      }
      CHECK(worst > 1e-5);
    } else {
      CHECK(tv == f);
    }
  }
}

TEST_CASE("cuDNN Find: several entries, fastest first, workspace per algorithm and math type", "[cudnn]") {
  Dnn d;
  Conv c({2, 8, 8, 8, 8, 3, 1, 1}, DT::F32, false);
  DNN_OK(cudnnSetConvolutionMathType(c.conv, CUDNN_FMA_MATH));
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int n = 0;
  DNN_OK(cudnnFindConvolutionForwardAlgorithm(d.h, c.x, c.w, c.conv, c.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                              &n, perf));
  REQUIRE(n >= 2);
  REQUIRE(n <= CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
  int ok = 0;
  bool failed_seen = false;
  for (int i = 0; i < n; ++i) {
    INFO("entry " << i << " algo " << perf[i].algo << " math " << perf[i].mathType << " status "
                  << perf[i].status);
    if (perf[i].status != CUDNN_STATUS_SUCCESS) {
      failed_seen = true;
      continue;
    }
    REQUIRE_FALSE(failed_seen);  // failures sort last
    if (ok++) REQUIRE(perf[i].time >= perf[i - 1].time);
    REQUIRE(perf[i].time > 0);
    REQUIRE((perf[i].mathType == CUDNN_FMA_MATH || perf[i].mathType == CUDNN_DEFAULT_MATH));
    // The entry's size is what the workspace query gives for its math type.
    size_t need = 0;
    DNN_OK(cudnnSetConvolutionMathType(c.conv, perf[i].mathType));
    DNN_OK(cudnnGetConvolutionForwardWorkspaceSize(d.h, c.x, c.w, c.conv, c.y, perf[i].algo, &need));
    CHECK(need == perf[i].memory);
  }
  REQUIRE(ok >= 2);

  // The heuristics return the same algorithms without measuring.
  cudnnConvolutionFwdAlgoPerf_t heur[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int hn = 0;
  DNN_OK(cudnnSetConvolutionMathType(c.conv, CUDNN_FMA_MATH));
  DNN_OK(cudnnGetConvolutionForwardAlgorithm_v7(d.h, c.x, c.w, c.conv, c.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                &hn, heur));
  REQUIRE(hn == n);
  for (int i = 0; i < n; ++i) {
    CHECK(heur[i].algo == perf[i].algo);
    CHECK(heur[i].mathType == perf[i].mathType);
    CHECK(heur[i].memory == perf[i].memory);
  }
  cudnnConvolutionBwdDataAlgoPerf_t bd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  DNN_OK(cudnnGetConvolutionBackwardDataAlgorithm_v7(d.h, c.w, c.y, c.conv, c.x,
                                                     CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &hn, bd));
  CHECK(hn >= 2);
  CHECK(bd[0].status == CUDNN_STATUS_SUCCESS);
  cudnnConvolutionBwdFilterAlgoPerf_t bf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  DNN_OK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(d.h, c.x, c.y, c.conv, c.w,
                                                       CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &hn, bf));
  CHECK(hn >= 2);
  CHECK(bf[0].status == CUDNN_STATUS_SUCCESS);

  // requestedAlgoCount cuts the list.
  DNN_OK(cudnnFindConvolutionForwardAlgorithm(d.h, c.x, c.w, c.conv, c.y, 1, &n, perf));
  CHECK(n == 1);
  CHECK(cudnnFindConvolutionForwardAlgorithm(d.h, c.x, c.w, c.conv, c.y, 0, &n, perf) ==
        CUDNN_STATUS_BAD_PARAM);
}

TEST_CASE("cuDNN: too small a workspace or a NULL one is BAD_PARAM", "[cudnn]") {
  Dnn d;
  Conv c({1, 4, 6, 6, 4, 3, 1, 1}, DT::F32, false);
  DNN_OK(cudnnSetConvolutionMathType(c.conv, CUDNN_FMA_MATH));
  size_t need = 0;
  DNN_OK(cudnnGetConvolutionForwardWorkspaceSize(d.h, c.x, c.w, c.conv, c.y,
                                                 CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, &need));
  REQUIRE(need > 0);
  DevBuf x(c.x_elems() * 4), w(c.w_elems() * 4), y(c.y_elems() * 4), ws(need);
  const float one = 1.f, zero = 0.f;
  CHECK(cudnnConvolutionForward(d.h, &one, c.x, x.p, c.w, w.p, c.conv,
                                CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, ws.p, need - 1, &zero, c.y,
                                y.p) == CUDNN_STATUS_BAD_PARAM);
  char msg[256] = {};
  cudnnGetLastErrorString(msg, sizeof msg);
  CHECK(std::string(msg).find("workspace") != std::string::npos);
  CHECK(cudnnConvolutionForward(d.h, &one, c.x, x.p, c.w, w.p, c.conv,
                                CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, nullptr, need, &zero, c.y,
                                y.p) == CUDNN_STATUS_BAD_PARAM);
  CHECK(cudnnConvolutionForward(d.h, &one, c.x, x.p, c.w, w.p, c.conv,
                                CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, ws.p, need, &zero, c.y,
                                y.p) == CUDNN_STATUS_SUCCESS);
  // An algorithm with no workspace accepts none.
  CHECK(cudnnConvolutionForward(d.h, &one, c.x, x.p, c.w, w.p, c.conv,
                                CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, c.y,
                                y.p) == CUDNN_STATUS_SUCCESS);
  for (auto algo : {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1}) {
    size_t nb = 0;
    DNN_OK(cudnnGetConvolutionBackwardDataWorkspaceSize(d.h, c.w, c.y, c.conv, c.x, algo, &nb));
    REQUIRE(nb > 0);
    CHECK(cudnnConvolutionBackwardData(d.h, &one, c.w, w.p, c.y, y.p, c.conv, algo, ws.p, nb - 1, &zero, c.x,
                                       x.p) == CUDNN_STATUS_BAD_PARAM);
  }
  for (auto algo : {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1}) {
    size_t nb = 0;
    DNN_OK(cudnnGetConvolutionBackwardFilterWorkspaceSize(d.h, c.x, c.y, c.conv, c.w, algo, &nb));
    REQUIRE(nb > 0);
    CHECK(cudnnConvolutionBackwardFilter(d.h, &one, c.x, x.p, c.y, y.p, c.conv, algo, ws.p, nb - 1, &zero,
                                         c.w, w.p) == CUDNN_STATUS_BAD_PARAM);
  }
  d.st.sync();
}

TEST_CASE("cuDNN: a TF32 Find entry relabelled FMA keeps too small a workspace",
          "[cudnn][device]") {
  Dnn d;
  Conv c({2, 8, 8, 8, 8, 3, 1, 1}, DT::F32, true);
  DNN_OK(cudnnSetConvolutionMathType(c.conv, CUDNN_FMA_MATH));
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int n = 0;
  DNN_OK(cudnnFindConvolutionForwardAlgorithm(d.h, c.x, c.w, c.conv, c.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                              &n, perf));
  // Each algorithm offered with both math types: the DEFAULT (TF32 on sm_80+)
  // variant needs less workspace than the FMA one.
  bool relabel_fails = false;
  for (int i = 0; i < n; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].mathType != CUDNN_DEFAULT_MATH ||
        perf[i].memory == 0)
      continue;
    DNN_OK(cudnnSetConvolutionMathType(c.conv, CUDNN_FMA_MATH));
    size_t fma = 0;
    DNN_OK(cudnnGetConvolutionForwardWorkspaceSize(d.h, c.x, c.w, c.conv, c.y, perf[i].algo, &fma));
    if (!tf32_device()) {
      CHECK(fma == perf[i].memory);  // DEFAULT is FMA before sm_80
      continue;
    }
    CHECK(fma > perf[i].memory);
    DevBuf x(c.x_elems() * 4), w(c.w_elems() * 4), y(c.y_elems() * 4), ws(perf[i].memory);
    const float one = 1.f, zero = 0.f;
    relabel_fails = cudnnConvolutionForward(d.h, &one, c.x, x.p, c.w, w.p, c.conv, perf[i].algo, ws.p,
                                            perf[i].memory, &zero, c.y, y.p) == CUDNN_STATUS_BAD_PARAM;
    break;
  }
  CHECK(relabel_fails == tf32_device());
  if (tf32_device()) CHECK(perf[0].mathType == CUDNN_DEFAULT_MATH);  // TF32 entries are the fastest
}

TEST_CASE("cuDNN Find: a workspace larger than the free device memory is ALLOC_FAILED", "[cudnn][memory]") {
  // libraries.cmake also runs this on a 1 MiB device (RD_EMU_MEMORY_MIB=1), where
  // the FFT entry's workspace (2.6 MB) cannot be allocated and the others can.
  Dnn d;
  Conv c({2, 16, 30, 30, 16, 3, 1, 1}, DT::F32, false);
  DNN_OK(cudnnSetConvolutionMathType(c.conv, CUDNN_FMA_MATH));
  size_t free_b = 0, total_b = 0;
  CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
  // Room for every entry: failures sort last and a shorter list would cut them.
  cudnnConvolutionFwdAlgoPerf_t perf[2 * CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int n = 0, ok = 0, alloc_failed = 0;
  DNN_OK(cudnnFindConvolutionForwardAlgorithm(d.h, c.x, c.w, c.conv, c.y, 2 * CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n,
                                              perf));
  for (int i = 0; i < n; ++i) {
    INFO("algo " << perf[i].algo << " memory " << perf[i].memory << " free " << free_b);
    if (perf[i].status == CUDNN_STATUS_SUCCESS) {
      CHECK(perf[i].memory <= free_b);
      ++ok;
    } else if (perf[i].status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED) {  // CUDNN_STATUS_ALLOC_FAILED
      CHECK(perf[i].memory > free_b);
      ++alloc_failed;
    }
  }
  CHECK(ok >= 2);
  if (free_b < (size_t(2) << 20)) {
    CHECK(alloc_failed >= 1);
    // Find's own x, w, y buffers (here 4 MiB of x alone) do not fit: the call fails.
    Conv big({4, 64, 64, 64, 8, 3, 1, 1}, DT::F32, false);
    CHECK(cudnnFindConvolutionForwardAlgorithm(d.h, big.x, big.w, big.conv, big.y, 8, &n, perf) ==
          CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED);
    // The heuristics allocate nothing.
    CHECK(cudnnGetConvolutionForwardAlgorithm_v7(d.h, big.x, big.w, big.conv, big.y, 8, &n, perf) ==
          CUDNN_STATUS_SUCCESS);
  }
}

TEST_CASE("cuDNN: NOT_SUPPORTED and BAD_PARAM for unsupported or inconsistent descriptors", "[cudnn]") {
  Dnn d;
  Conv c({1, 4, 6, 6, 4, 3, 1, 1}, DT::F32, false);
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int n = 0;
  DevBuf x(c.x_elems() * 4), w(c.w_elems() * 4), y(c.y_elems() * 4);
  const float one = 1.f, zero = 0.f;
  SECTION("mixed data types") {
    DNN_OK(cudnnSetTensor4dDescriptor(c.y, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, 1, 4, 6, 6));
    CHECK(cudnnFindConvolutionForwardAlgorithm(d.h, c.x, c.w, c.conv, c.y, 8, &n, perf) ==
          CUDNN_STATUS_NOT_SUPPORTED);
    CHECK(cudnnConvolutionForward(d.h, &one, c.x, x.p, c.w, w.p, c.conv,
                                  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, c.y,
                                  y.p) == CUDNN_STATUS_NOT_SUPPORTED);
  }
  SECTION("half compute with float data") {
    DNN_OK(
        cudnnSetConvolution2dDescriptor(c.conv, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_HALF));
    CHECK(cudnnFindConvolutionForwardAlgorithm(d.h, c.x, c.w, c.conv, c.y, 8, &n, perf) ==
          CUDNN_STATUS_NOT_SUPPORTED);
  }
  SECTION("an algorithm this problem does not have") {
    CHECK(cudnnConvolutionForward(d.h, &one, c.x, x.p, c.w, w.p, c.conv, CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
                                  nullptr, 0, &zero, c.y, y.p) == CUDNN_STATUS_NOT_SUPPORTED);
  }
  SECTION("output shape that does not match") {
    DNN_OK(cudnnSetTensor4dDescriptor(c.y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 4, 5, 6));
    CHECK(cudnnFindConvolutionForwardAlgorithm(d.h, c.x, c.w, c.conv, c.y, 8, &n, perf) ==
          CUDNN_STATUS_BAD_PARAM);
  }
  SECTION("channel mismatch") {
    DNN_OK(cudnnSetFilter4dDescriptor(c.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 4, 3, 3, 3));
    CHECK(cudnnFindConvolutionForwardAlgorithm(d.h, c.x, c.w, c.conv, c.y, 8, &n, perf) ==
          CUDNN_STATUS_BAD_PARAM);
  }
  SECTION("group count: the filter's C is x's channels per group, K a multiple of the count") {
    int groups = 0;
    DNN_OK(cudnnGetConvolutionGroupCount(c.conv, &groups));
    CHECK(groups == 1);
    CHECK(cudnnSetConvolutionGroupCount(c.conv, 0) == CUDNN_STATUS_BAD_PARAM);
    DNN_OK(cudnnSetConvolutionGroupCount(c.conv, 2));
    DNN_OK(cudnnGetConvolutionGroupCount(c.conv, &groups));
    CHECK(groups == 2);
    // (4, 4, 3, 3) with 2 groups would need 8 input channels.
    CHECK(cudnnFindConvolutionForwardAlgorithm(d.h, c.x, c.w, c.conv, c.y, 8, &n, perf) ==
          CUDNN_STATUS_BAD_PARAM);
    DNN_OK(cudnnSetFilter4dDescriptor(c.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 4, 2, 3, 3));
    CHECK(cudnnFindConvolutionForwardAlgorithm(d.h, c.x, c.w, c.conv, c.y, 8, &n, perf) == CUDNN_STATUS_SUCCESS);
    CHECK(n > 0);
    DNN_OK(cudnnSetConvolutionGroupCount(c.conv, 4));  // 4 groups of 1 channel: K 4 is fine
    DNN_OK(cudnnSetFilter4dDescriptor(c.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 4, 1, 3, 3));
    CHECK(cudnnFindConvolutionForwardAlgorithm(d.h, c.x, c.w, c.conv, c.y, 8, &n, perf) == CUDNN_STATUS_SUCCESS);
    DNN_OK(cudnnSetFilter4dDescriptor(c.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 6, 1, 3, 3));
    DNN_OK(cudnnSetTensor4dDescriptor(c.y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 6, 6, 6));
    CHECK(cudnnFindConvolutionForwardAlgorithm(d.h, c.x, c.w, c.conv, c.y, 8, &n, perf) ==
          CUDNN_STATUS_BAD_PARAM);  // K = 6 is not a multiple of 4 groups
  }
  SECTION("bad descriptor values") {
    CHECK(cudnnSetTensor4dDescriptor(c.x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 0, 4, 6, 6) ==
          CUDNN_STATUS_BAD_PARAM);
    CHECK(cudnnSetConvolution2dDescriptor(c.conv, -1, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_FLOAT) == CUDNN_STATUS_BAD_PARAM);
    CHECK(cudnnSetConvolution2dDescriptor(c.conv, 0, 0, 0, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_FLOAT) == CUDNN_STATUS_BAD_PARAM);
    CHECK(cudnnSetConvolutionMathType(c.conv, static_cast<cudnnMathType_t>(17)) == CUDNN_STATUS_BAD_PARAM);
    CHECK(std::string(cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM)) == "CUDNN_STATUS_BAD_PARAM");
    CHECK(std::string(cudnnGetErrorString(CUDNN_STATUS_NOT_SUPPORTED)) == "CUDNN_STATUS_NOT_SUPPORTED");
  }
  d.st.sync();
}

int successes_bf16(const Dnn& d, int C, int K, bool nhwc) {
  Conv c({1, C, 6, 6, K, 3, 1, 1}, DT::BF16, nhwc);
  return find(d, c, Op::Fwd, CUDNN_TENSOR_OP_MATH).succeeded;
}

TEST_CASE("cuDNN: bf16 NHWC with channels not a multiple of 8 under RD_EMU_CUDNN_STRICT_BF16 (defect 8)",
          "[cudnn][device]") {
  Dnn d;
  if (!bf16_device()) {  // no bf16 convolutions before sm_80
    CHECK(successes_bf16(d, 8, 8, true) == 0);
    return;
  }
  unsetenv("RD_EMU_CUDNN_STRICT_BF16");
  CHECK(successes_bf16(d, 3, 8, true) >= 2);
  setenv("RD_EMU_CUDNN_STRICT_BF16", "1", 1);
  CHECK(successes_bf16(d, 3, 8, true) == 0);
  CHECK(successes_bf16(d, 8, 17, true) == 0);
  CHECK(successes_bf16(d, 8, 16, true) >= 2);
  CHECK(successes_bf16(d, 3, 8, false) >= 2);  // NCHW: the fallback layout
  {
    Conv c({1, 3, 6, 6, 8, 3, 1, 1}, DT::BF16, true);
    DNN_OK(cudnnSetConvolutionMathType(c.conv, CUDNN_TENSOR_OP_MATH));
    DevBuf x(c.x_elems() * 2), w(c.w_elems() * 2), y(c.y_elems() * 2);
    const float one = 1.f, zero = 0.f;
    CHECK(cudnnConvolutionForward(d.h, &one, c.x, x.p, c.w, w.p, c.conv,
                                  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, c.y,
                                  y.p) == CUDNN_STATUS_NOT_SUPPORTED);
  }
  unsetenv("RD_EMU_CUDNN_STRICT_BF16");
}

TEST_CASE("cuDNN: the call's alpha and descriptors are captured, the work runs on the stream", "[cudnn]") {
  Dnn d;
  Conv c({1, 3, 5, 5, 2, 3, 1, 1}, DT::F32, false);
  const Operands o = make_operands(c, 3);
  Vec ref, abs;
  conv_ref(c, Op::Fwd, o, false, false, ref, abs);
  DNN_OK(cudnnSetConvolutionMathType(c.conv, CUDNN_FMA_MATH));
  DevBuf x(c.x_elems() * 4), w(c.w_elems() * 4), y(c.y_elems() * 4);
  x.upload(encode(o.x.v, DT::F32).data(), d.st);
  w.upload(encode(o.w, DT::F32).data(), d.st);
  float alpha = 3.f, beta = 0.f;
  DNN_OK(cudnnConvolutionForward(d.h, &alpha, c.x, x.p, c.w, w.p, c.conv,
                                 CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &beta, c.y, y.p));
  // Changing the scalars or the descriptors after the call changes nothing.
  alpha = -7.f, beta = 1.f;
  DNN_OK(cudnnSetTensor4dDescriptor(c.x, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 1, 3, 5, 5));
  DNN_OK(cudnnSetConvolution2dDescriptor(c.conv, 0, 0, 2, 2, 1, 1, CUDNN_CONVOLUTION, CUDNN_DATA_FLOAT));
  std::vector<unsigned char> bytes(y.bytes);
  y.download(bytes.data(), d.st);
  const Vec zero(ref.size(), 0.0);
  check_conv(decode(bytes, DT::F32), ref, abs, zero, 3.0, 0.0, 1e-6, DT::F32);
}

// ---- faults: misuse a GPU answers with undefined behaviour ends the process ----------------

// Runs f in a child process; true when it ended with the emulator's fault exit.
bool faults(const std::function<void()>& f) {
  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    f();
    _Exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == rd::emu::kFaultExit;
}

TEST_CASE("cuBLAS/cuDNN stand-ins: use after destroy, host pointers and device scalars fault",
          "[cudnn][cublas]") {
  CHECK(faults([] {
    cudnnTensorDescriptor_t t;
    cudnnCreateTensorDescriptor(&t);
    cudnnDestroyTensorDescriptor(t);
    cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1, 1, 1);
  }));
  CHECK(faults([] {
    cublasHandle_t h;
    cublasCreate(&h);
    cublasDestroy(h);
    cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
  }));
  CHECK(faults([] {  // a host array as x
    Dnn d;
    Conv c({1, 2, 4, 4, 2, 3, 1, 1}, DT::F32, false);
    std::vector<float> host(c.x_elems());
    DevBuf w(c.w_elems() * 4), y(c.y_elems() * 4);
    const float one = 1.f, zero = 0.f;
    cudnnConvolutionForward(d.h, &one, c.x, host.data(), c.w, w.p, c.conv,
                            CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, c.y, y.p);
  }));
  CHECK(faults([] {  // y one element short
    Dnn d;
    Conv c({1, 2, 4, 4, 2, 3, 1, 1}, DT::F32, false);
    DevBuf x(c.x_elems() * 4), w(c.w_elems() * 4), y(c.y_elems() * 4 - 4);
    const float one = 1.f, zero = 0.f;
    cudnnConvolutionForward(d.h, &one, c.x, x.p, c.w, w.p, c.conv, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                            nullptr, 0, &zero, c.y, y.p);
  }));
  CHECK(faults([] {  // alpha in device memory with the host pointer mode
    Blas b;
    DevBuf m(64 * 4);
    const float zero = 0.f;
    cublasSgemm(b.h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, m.as<float>(), m.as<float>(), 2, m.as<float>(), 2,
                &zero, m.as<float>() + 8, 2);
  }));
  CHECK(faults([] {  // cuDNN on a destroyed stream
    cudnnHandle_t h;
    cudaStream_t s;
    cudnnCreate(&h);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudnnSetStream(h, s);
    cudaStreamDestroy(s);
    Conv c({1, 2, 4, 4, 2, 3, 1, 1}, DT::F32, false);
    DevBuf x(c.x_elems() * 4), w(c.w_elems() * 4), y(c.y_elems() * 4);
    const float one = 1.f, zero = 0.f;
    cudnnConvolutionForward(h, &one, c.x, x.p, c.w, w.p, c.conv, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                            nullptr, 0, &zero, c.y, y.p);
  }));
}

TEST_CASE("cuDNN: version and handle basics", "[cudnn]") {
  CHECK(cudnnGetVersion() == CUDNN_VERSION);
  CHECK(cudnnCreate(nullptr) == CUDNN_STATUS_BAD_PARAM);
  CHECK(cudnnDestroyTensorDescriptor(nullptr) == CUDNN_STATUS_SUCCESS);
  cublasHandle_t h = nullptr;
  CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, nullptr, nullptr, 1, nullptr, 1, nullptr, nullptr,
                    1) == CUBLAS_STATUS_NOT_INITIALIZED);
}

}  // namespace

int main(int argc, char** argv) {
  // TF32 and bf16 need an sm_80+ device: an H200 unless the environment chooses
  // (libraries.cmake also runs the [device] cases on an RTX 5000).
  setenv("RD_EMU_DEVICE", "h200", 0);
  return Catch::Session().run(argc, argv);
}
