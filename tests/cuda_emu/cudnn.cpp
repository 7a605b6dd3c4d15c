// cuDNN stand-in of the emulated device (tests only): exactly the legacy-API calls
// the CUDA backend makes (handle, tensor/filter/convolution descriptors, Find and
// Get_v7 algorithm searches, workspace sizes, the three convolutions), written from
// the cuDNN documentation. Declarations are the toolkit's own (cudnn.h); the
// definitions run on the host, queued on the handle's stream (emu.h).
//
// Error model: a convolution sums exact double products of the (possibly TF32-
// rounded) inputs in double and rounds once to the output type; cuDNN accumulates
// in fp32 (compute type FLOAT), so a real GPU differs by about
// (C*R*S or N*P*Q terms) * 2^-24 relative, plus the output type's own rounding.
// fp16/bf16 use the toolkit's __half/__nv_bfloat16 host conversions (round to
// nearest even). TF32 math rounds fp32 inputs to 10 mantissa bits first, so a
// TF32 result differs from the FMA one as on an Ampere+ GPU.
//
// Algorithms are a model, not cuDNN's kernels: each direction offers several
// algorithms with a fake, deterministic time and a workspace size that depends on
// the algorithm and the math type (a tensor-op/TF32 variant needs less than the
// FMA variant of the same algorithm, so using one entry's size with another
// math type fails, as it may on a GPU). All algorithms compute the same numbers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "emu.h"

// The opaque types of cudnn.h; their bodies are ours.
struct cudnnContext {
  cudaStream_t stream = nullptr;
};
struct cudnnTensorStruct {
  bool set = false;
  cudnnDataType_t dt = CUDNN_DATA_FLOAT;
  cudnnTensorFormat_t fmt = CUDNN_TENSOR_NCHW;
  int n = 0, c = 0, h = 0, w = 0;
};
struct cudnnFilterStruct {
  bool set = false;
  cudnnDataType_t dt = CUDNN_DATA_FLOAT;
  cudnnTensorFormat_t fmt = CUDNN_TENSOR_NCHW;
  int k = 0, c = 0, r = 0, s = 0;
};
struct cudnnConvolutionStruct {
  bool set = false;
  int pad_h = 0, pad_w = 0, u = 1, v = 1, dil_h = 1, dil_w = 1;
  int groups = 1;  // cudnnSetConvolutionGroupCount
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;  // documented default
};

namespace {

constexpr const char* kHandle = "cudnnHandle_t";
constexpr const char* kTensor = "cudnnTensorDescriptor_t";
constexpr const char* kFilter = "cudnnFilterDescriptor_t";
constexpr const char* kConv = "cudnnConvolutionDescriptor_t";

// Objects are never freed: a destroyed handle or descriptor's address then cannot
// be reused by a new one, so stale ones stay detectable (emu.h). Reachable from
// here, so leak checkers stay quiet; never destroyed, so a static destructor that
// still uses a handle at exit finds it.
template <class T>
std::vector<std::unique_ptr<T>>& graveyard() {
  static auto* g = new std::vector<std::unique_ptr<T>>;
  return *g;
}
template <class T>
T* make_object(const char* kind) {
  graveyard<T>().push_back(std::make_unique<T>());
  T* p = graveyard<T>().back().get();
  rd::emu::register_handle(p, kind);
  return p;
}

thread_local std::string last_error;

cudnnStatus_t fail(cudnnStatus_t s, const std::string& what) {
  last_error = what;
  return s;
}

using Lock = std::lock_guard<std::recursive_mutex>;

size_t elem_size(cudnnDataType_t dt) {
  switch (dt) {
    case CUDNN_DATA_FLOAT:
      return 4;
    case CUDNN_DATA_DOUBLE:
      return 8;
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16:
      return 2;
    default:
      return 0;  // not modelled
  }
}

const char* dt_name(cudnnDataType_t dt) {
  switch (dt) {
    case CUDNN_DATA_FLOAT:
      return "FLOAT";
    case CUDNN_DATA_DOUBLE:
      return "DOUBLE";
    case CUDNN_DATA_HALF:
      return "HALF";
    case CUDNN_DATA_BFLOAT16:
      return "BFLOAT16";
    default:
      return "other";
  }
}

// ---- shapes --------------------------------------------------------------------------

// Element strides of a 4-D array (outer to inner dimension names as cuDNN's NCHW).
struct Strides {
  int64_t n = 0, c = 0, h = 0, w = 0;
};

// Fully packed NCHW or NHWC, as cudnnSetTensor4dDescriptor defines them.
Strides packed(cudnnTensorFormat_t fmt, int64_t C, int64_t H, int64_t W) {
  if (fmt == CUDNN_TENSOR_NHWC) return {H * W * C, 1, W * C, C};
  return {C * H * W, H * W, W, 1};
}

enum class Dir { Fwd, BwdData, BwdFilter };

const char* dir_call(Dir d) {
  switch (d) {
    case Dir::Fwd:
      return "cudnnConvolutionForward";
    case Dir::BwdData:
      return "cudnnConvolutionBackwardData";
    default:
      return "cudnnConvolutionBackwardFilter";
  }
}

// One convolution, captured by value when a call is made.
struct Problem {
  cudnnDataType_t dt = CUDNN_DATA_FLOAT;
  bool nhwc = false;  // x/y layout (the filter's format matches, see validate())
  int N = 0, C = 0, H = 0, W = 0, K = 0, R = 0, S = 0, P = 0, Q = 0;
  int G = 1;  // groups: C and K split into G slices, the filter is K x C/G x R x S
  int pad_h = 0, pad_w = 0, u = 1, v = 1, dil_h = 1, dil_w = 1;
  bool flip = false;   // CUDNN_CONVOLUTION: the filter is flipped (true convolution)
  Strides xs, ys, ws;  // element strides of x, y and the filter (k, c, r, s)

  size_t x_elems() const { return static_cast<size_t>(N) * C * H * W; }
  size_t y_elems() const { return static_cast<size_t>(N) * K * P * Q; }
  int Cg() const { return C / G; }
  size_t w_elems() const { return static_cast<size_t>(K) * Cg() * R * S; }
  double flops() const { return 2.0 * N * K * P * Q * static_cast<double>(Cg()) * R * S; }
};

// Math resolved for one call: whether tensor-op kernels run (workspace and time
// model) and how fp32 inputs are rounded before the products.
enum class Rounding { None, TF32, FP16 };
struct Math {
  bool tensor = false;
  Rounding rounding = Rounding::None;
};

bool tf32_allowed() {
  // NVIDIA_TF32_OVERRIDE=0 disables TF32 everywhere (documented); TF32 needs sm_80+.
  const char* o = std::getenv("NVIDIA_TF32_OVERRIDE");
  if (o && std::strcmp(o, "0") == 0) return false;
  return rd::emu::device_spec().major >= 8;
}

Math resolve_math(cudnnMathType_t m, cudnnDataType_t dt) {
  const int major = rd::emu::device_spec().major;
  if (m == CUDNN_FMA_MATH) return {false, Rounding::None};
  if (dt == CUDNN_DATA_FLOAT) {
    // cuDNN 8+: DEFAULT and TENSOR_OP permit TF32 tensor ops on Ampere and later.
    if (tf32_allowed()) return {true, Rounding::TF32};
    // Uncertain: ALLOW_CONVERSION before Ampere down-converts fp32 to fp16 for
    // tensor ops; modelled as fp16-rounded inputs.
    if (m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION && major >= 7) return {true, Rounding::FP16};
    return {false, Rounding::None};
  }
  if (dt == CUDNN_DATA_HALF || dt == CUDNN_DATA_BFLOAT16) {
    // Documented: DEFAULT_MATH uses no tensor cores before A100.
    // Uncertain: that DEFAULT picks tensor-op kernels for fp16/bf16 on sm_80+.
    if (m == CUDNN_DEFAULT_MATH) return {major >= 8, Rounding::None};
    return {major >= 7, Rounding::None};
  }
  return {false, Rounding::None};  // double: FMA kernels only
}

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH:
      return "DEFAULT_MATH";
    case CUDNN_TENSOR_OP_MATH:
      return "TENSOR_OP_MATH";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
      return "TENSOR_OP_MATH_ALLOW_CONVERSION";
    case CUDNN_FMA_MATH:
      return "FMA_MATH";
  }
  return "?";
}

bool valid_math(cudnnMathType_t m) {
  return m == CUDNN_DEFAULT_MATH || m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ||
         m == CUDNN_FMA_MATH;
}

int64_t out_dim(int in, int pad, int k, int stride, int dil) {
  return 1 + (static_cast<int64_t>(in) + 2 * pad - (static_cast<int64_t>(k) - 1) * dil - 1) / stride;
}

// Checks descriptors the way each call needs them and builds the Problem.
// x/y are the activation tensors (dx/dy for the backward calls), w the filter.
cudnnStatus_t validate(const char* call, cudnnHandle_t h, cudnnTensorDescriptor_t xd,
                       cudnnFilterDescriptor_t wd, cudnnConvolutionDescriptor_t cd,
                       cudnnTensorDescriptor_t yd, Problem& p) {
  if (!h) return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": handle is NULL");
  rd::emu::require_handle(h, kHandle, call);
  if (!xd || !wd || !cd || !yd)
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": a descriptor is NULL");
  rd::emu::require_handle(xd, kTensor, call);
  rd::emu::require_handle(yd, kTensor, call);
  rd::emu::require_handle(wd, kFilter, call);
  rd::emu::require_handle(cd, kConv, call);
  if (!xd->set || !yd->set || !wd->set || !cd->set)
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": a descriptor was created but never set");
  std::ostringstream why;
  why << call << ": ";
  // Documented supported configurations of the legacy API: x, w, y share one data
  // type; compute FLOAT for float/half/bf16 (fp16 also TRUE_HALF with HALF), DOUBLE
  // for double.
  if (xd->dt != yd->dt || xd->dt != wd->dt) {
    why << "data types differ (x " << dt_name(xd->dt) << ", w " << dt_name(wd->dt) << ", y "
        << dt_name(yd->dt) << ")";
    return fail(CUDNN_STATUS_NOT_SUPPORTED, why.str());
  }
  const cudnnDataType_t dt = xd->dt;
  const bool compute_ok = dt == CUDNN_DATA_DOUBLE ? cd->compute == CUDNN_DATA_DOUBLE
                          : dt == CUDNN_DATA_HALF
                              ? (cd->compute == CUDNN_DATA_FLOAT || cd->compute == CUDNN_DATA_HALF)
                              : cd->compute == CUDNN_DATA_FLOAT;
  if (!compute_ok) {
    why << "compute type " << dt_name(cd->compute) << " with data type " << dt_name(dt);
    return fail(CUDNN_STATUS_NOT_SUPPORTED, why.str());
  }
  // Uncertain: whether cuDNN runs NCHW activations with a KRSC filter (or NHWC with
  // KCRS); the backend never mixes them, so the stand-in refuses the mix.
  if (xd->fmt != yd->fmt || xd->fmt != wd->fmt) {
    why << "mixed layouts (x, y, w formats " << xd->fmt << ", " << yd->fmt << ", " << wd->fmt << ")";
    return fail(CUDNN_STATUS_NOT_SUPPORTED, why.str());
  }
  // Grouped (documented): the filter's C is x's channels per group, K a multiple of the count.
  if (xd->c != wd->c * cd->groups || wd->k % cd->groups != 0) {
    why << "x has " << xd->c << " channels, the filter " << wd->k << "x" << wd->c << " (group count "
        << cd->groups << ")";
    return fail(CUDNN_STATUS_BAD_PARAM, why.str());
  }
  const int64_t P = out_dim(xd->h, cd->pad_h, wd->r, cd->u, cd->dil_h);
  const int64_t Q = out_dim(xd->w, cd->pad_w, wd->s, cd->v, cd->dil_w);
  if (P < 1 || Q < 1) {
    why << "the dilated filter does not fit the padded input";
    return fail(CUDNN_STATUS_BAD_PARAM, why.str());
  }
  if (yd->n != xd->n || yd->c != wd->k || yd->h != P || yd->w != Q) {
    why << "y is " << yd->n << "x" << yd->c << "x" << yd->h << "x" << yd->w << ", the convolution gives "
        << xd->n << "x" << wd->k << "x" << P << "x" << Q;
    return fail(CUDNN_STATUS_BAD_PARAM, why.str());
  }
  p.dt = dt;
  p.nhwc = xd->fmt == CUDNN_TENSOR_NHWC;
  p.N = xd->n, p.C = xd->c, p.H = xd->h, p.W = xd->w, p.G = cd->groups;
  p.K = wd->k, p.R = wd->r, p.S = wd->s, p.P = static_cast<int>(P), p.Q = static_cast<int>(Q);
  p.pad_h = cd->pad_h, p.pad_w = cd->pad_w, p.u = cd->u, p.v = cd->v, p.dil_h = cd->dil_h,
  p.dil_w = cd->dil_w;
  p.flip = cd->mode == CUDNN_CONVOLUTION;
  p.xs = packed(xd->fmt, p.C, p.H, p.W);
  p.ys = packed(yd->fmt, p.K, p.P, p.Q);
  p.ws = packed(wd->fmt, p.Cg(), p.R, p.S);  // KCRS or KRSC: the same packing rule
  return CUDNN_STATUS_SUCCESS;
}

// ---- the algorithm model ------------------------------------------------------------------

size_t align256(double bytes) {
  const size_t b = static_cast<size_t>(std::ceil(bytes));
  return (b + 255) / 256 * 256;
}

struct AlgoInfo {
  bool supported = false;
  size_t workspace = 0;
  float time = -1.f;
  cudnnDeterminism_t determinism = CUDNN_DETERMINISTIC;
  std::string why;  // when not supported
};

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

// Problem-wide support for an emulated GPU, independent of the algorithm.
std::string problem_unsupported(const Problem& p) {
  if (p.dt == CUDNN_DATA_BFLOAT16 && rd::emu::device_spec().major < 8)
    return "bf16 convolutions need sm_80 or later";  // no bf16 kernels before Ampere
  // Uncertain: cuDNN's legacy API may have no bf16 NHWC kernel when C or K is not a
  // multiple of 8. Unknown without a GPU, so it is a switch:
  // RD_EMU_CUDNN_STRICT_BF16=1 makes every algorithm refuse such shapes, so the
  // backend's fallback can be tested; otherwise they run.
  if (p.dt == CUDNN_DATA_BFLOAT16 && p.nhwc && (p.C % 8 || p.K % 8) &&
      env_is("RD_EMU_CUDNN_STRICT_BF16", "1"))
    return "bf16 NHWC with channel counts not a multiple of 8 (RD_EMU_CUDNN_STRICT_BF16=1)";
  return {};
}

// Long because: one switch over every (direction, algorithm) pair, so the whole model
// of cuDNN's algorithm set (support, workspace, speed, determinism) reads in one place.
AlgoInfo algo_info(const Problem& p, Dir dir, int algo, const Math& m) {
  AlgoInfo a;
  const std::string problem = problem_unsupported(p);
  if (!problem.empty()) {
    a.why = problem;
    return a;
  }
  const double e = static_cast<double>(elem_size(p.dt));
  const double CRS = static_cast<double>(p.C) * p.R * p.S, KRS = static_cast<double>(p.K) * p.R * p.S;
  const double PQ = static_cast<double>(p.P) * p.Q;
  const bool unit = p.u == 1 && p.v == 1 && p.dil_h == 1 && p.dil_w == 1;
  const bool k3 = p.R == 3 && p.S == 3;
  const bool nchw = !p.nhwc;
  const double tiles = std::ceil(p.P / 4.0) * std::ceil(p.Q / 4.0);
  // FFT sizes: the padded input rounded up to a power of two per dimension.
  auto pow2 = [](double x) { return std::exp2(std::ceil(std::log2(std::max(1.0, x)))); };
  const double fft_hw = pow2(p.H + 2.0 * p.pad_h) * pow2(p.W + 2.0 * p.pad_w);
  const double fft_ws =
      8.0 *
      (static_cast<double>(p.N) * p.C + static_cast<double>(p.K) * p.C + static_cast<double>(p.N) * p.K) *
      fft_hw;
  const bool fft_ok = unit && nchw && p.dt != CUDNN_DATA_BFLOAT16 && p.dt != CUDNN_DATA_DOUBLE &&
                      p.H + 2 * p.pad_h <= 256 && p.W + 2 * p.pad_w <= 256 && p.R > 1;
  const bool wino_ok = unit && nchw && k3 && (p.dt == CUDNN_DATA_FLOAT || p.dt == CUDNN_DATA_HALF);
  // Uncertain: under DEFAULT/TENSOR_OP math a real cuDNN may also run algorithms
  // that have no tensor-op kernel (FMA kernels, reported with the requested math);
  // here GEMM, FFT and fused Winograd exist only as non-tensor variants.
  double base = -1, factor = 1;  // base < 0: not supported
  bool nondet = false;
  switch (dir) {
    case Dir::Fwd:
      switch (algo) {
        case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM:
          base = 0, factor = 1.5;
          break;
        case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM:
          base = 4 * CRS + 1024, factor = 1.0;
          break;
        case CUDNN_CONVOLUTION_FWD_ALGO_GEMM:
          if (!m.tensor) base = e * CRS * PQ, factor = 1.3;  // im2col of one image, FMA kernels only
          break;
        case CUDNN_CONVOLUTION_FWD_ALGO_FFT:
          if (fft_ok && !m.tensor) base = fft_ws, factor = 1.2;
          break;
        case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD:
          if (wino_ok && !m.tensor) base = 0, factor = 0.9;
          break;
        case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED:
          if (wino_ok)
            base = e * 36 * (static_cast<double>(p.C) * p.K + (p.N * tiles) * (p.C + p.K)), factor = 0.8;
          break;
        default:
          break;  // DIRECT, FFT_TILING: not modelled, reported unsupported
      }
      break;
    case Dir::BwdData:
      switch (algo) {
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_0:
          base = 0, factor = 1.4, nondet = true;
          break;
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_1:
          base = 4 * KRS + 1024, factor = 1.0;
          break;
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT:
          if (fft_ok && !m.tensor) base = fft_ws, factor = 1.2;
          break;
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD:
          if (wino_ok && !m.tensor) base = 0, factor = 0.9;
          break;
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED:
          if (wino_ok)
            base = e * 36 * (static_cast<double>(p.C) * p.K + (p.N * tiles) * (p.C + p.K)), factor = 0.8;
          break;
        default:
          break;  // FFT_TILING: not modelled
      }
      break;
    case Dir::BwdFilter:
      switch (algo) {
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0:
          base = 0, factor = 1.5, nondet = true;
          break;
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1:
          base = e * CRS * 4 + 1024, factor = 1.0;
          break;
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3:
          base = 4 * CRS + 512, factor = 1.1, nondet = true;
          break;
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT:
          if (fft_ok && !m.tensor) base = fft_ws, factor = 1.2;
          break;
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED:
          if (wino_ok)
            base = e * 36 * (static_cast<double>(p.C) * p.K + (p.N * tiles) * (p.C + p.K)), factor = 0.8;
          break;
        default:
          break;  // WINOGRAD (documented "not implemented"), FFT_TILING
      }
      break;
  }
  if (base < 0) {
    a.why = "algorithm " + std::to_string(algo) + " is not available for this problem and math type";
    return a;
  }
  a.supported = true;
  // The tensor-op variant of an algorithm needs 3/4 of the FMA variant's workspace
  // (a model; what matters is that the two differ, so a size found for one math
  // type is too small for the other).
  a.workspace = base == 0 ? 0 : align256(m.tensor ? base * 0.75 : base);
  // Fake milliseconds: deterministic, tensor ops 4x faster, ties broken by algo.
  a.time = static_cast<float>(p.flops() * 1e-9 * factor * (m.tensor ? 0.25 : 1.0) + 1e-4 * (algo + 1));
  a.determinism = nondet ? CUDNN_NON_DETERMINISTIC : CUDNN_DETERMINISTIC;
  return a;
}

int algo_count(Dir d) {
  switch (d) {
    case Dir::Fwd:
      return CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    case Dir::BwdData:
      return CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    default:
      return CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  }
}

// Find and Get_v7 results: each algorithm with the descriptor's math type and, if
// different, DEFAULT_MATH (documented for Find), fastest first, failures last,
// cut to requestedAlgoCount.
// Uncertain: whether cuDNN 9 reports both math variants of one algorithm within
// the *_ALGO_COUNT entries callers size their arrays with; failures may be dropped
// by the cut here, the successes never are unless more succeed than requested.
template <class Perf, class Algo>
cudnnStatus_t search(const char* call, Dir dir, cudnnHandle_t h, cudnnTensorDescriptor_t xd,
                     cudnnFilterDescriptor_t wd, cudnnConvolutionDescriptor_t cd, cudnnTensorDescriptor_t yd,
                     int requested, int* returned, Perf* perf, bool measured) {
  Problem p;
  const cudnnStatus_t st = validate(call, h, xd, wd, cd, yd, p);
  if (st != CUDNN_STATUS_SUCCESS) return st;
  if (requested <= 0 || !returned || !perf)
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": requestedAlgoCount <= 0 or a NULL output");
  rd::emu::require_stream(h->stream, call);
  std::vector<cudnnMathType_t> maths{cd->math};
  if (cd->math != CUDNN_DEFAULT_MATH) maths.push_back(CUDNN_DEFAULT_MATH);
  // Find (not the heuristics) allocates its own x, w, y buffers and each workspace
  // with cudaMalloc (documented): buffers that do not fit the free device memory
  // fail the call with ALLOC_FAILED, a workspace that does not fit beside them
  // fails that entry (ALLOC_FAILED in its status, as the perf struct documents).
  // Uncertain: whether cuDNN allocates all three buffers at once.
  // Those cudaMalloc calls are unsafe during a stream capture: plan before capturing.
  if (measured && rd::emu::capture_forbids(std::string(call) + " (its cudaMalloc)"))
    return fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED,
                std::string(call) + ": cudaMalloc of its test buffers failed: a stream capture is in progress");
  size_t free_b = ~size_t{0}, total_b = 0;
  if (measured && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
    const size_t buffers = (p.x_elems() + p.w_elems() + p.y_elems()) * elem_size(p.dt);
    if (buffers > free_b)
      return fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED,  // == CUDNN_STATUS_ALLOC_FAILED
                  std::string(call) + ": " + std::to_string(buffers) + " B of test buffers do not fit in " +
                      std::to_string(free_b) + " B of free device memory");
    free_b -= buffers;
  } else {
    free_b = ~size_t{0};
  }
  std::vector<Perf> all;
  for (int algo = 0; algo < algo_count(dir); ++algo)
    for (cudnnMathType_t mt : maths) {
      const AlgoInfo a = algo_info(p, dir, algo, resolve_math(mt, p.dt));
      Perf r{};
      r.algo = static_cast<Algo>(algo);
      r.mathType = mt;
      r.determinism = a.determinism;
      if (!a.supported) {
        r.status = CUDNN_STATUS_NOT_SUPPORTED;
        r.time = -1.f;
        r.memory = 0;
      } else if (measured && a.workspace > free_b) {
        r.status = CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;  // == CUDNN_STATUS_ALLOC_FAILED
        r.time = -1.f;
        r.memory = a.workspace;
      } else {
        r.status = CUDNN_STATUS_SUCCESS;
        // Uncertain: the heuristics (Get_v7) measure nothing; we report time -1
        // there and the fake time for Find, in the same order.
        r.time = measured ? a.time : -1.f;
        r.memory = a.workspace;
      }
      all.push_back(r);
    }
  // Order by the fake time (the same order for Find and Get_v7), failures last.
  std::vector<float> key(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    const AlgoInfo a = algo_info(p, dir, static_cast<int>(all[i].algo), resolve_math(all[i].mathType, p.dt));
    key[i] = all[i].status == CUDNN_STATUS_SUCCESS ? a.time : 1e30f;
  }
  std::vector<size_t> order(all.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key[a] < key[b]; });
  const int n = std::min<int>(requested, static_cast<int>(all.size()));
  for (int i = 0; i < n; ++i) perf[i] = all[order[static_cast<size_t>(i)]];
  *returned = n;
  return CUDNN_STATUS_SUCCESS;
}

// ---- element access and the arithmetic ----------------------------------------------------

double load(const void* base, size_t i, cudnnDataType_t dt) {
  switch (dt) {
    case CUDNN_DATA_FLOAT:
      return static_cast<const float*>(base)[i];
    case CUDNN_DATA_DOUBLE:
      return static_cast<const double*>(base)[i];
    case CUDNN_DATA_HALF:
      return static_cast<double>(__half2float(static_cast<const __half*>(base)[i]));
    case CUDNN_DATA_BFLOAT16:
      return static_cast<double>(__bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]));
    default:
      return 0.0;
  }
}

void store(void* base, size_t i, cudnnDataType_t dt, double v) {
  switch (dt) {
    case CUDNN_DATA_FLOAT:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case CUDNN_DATA_DOUBLE:
      static_cast<double*>(base)[i] = v;
      break;
    // One rounding, double -> fp16/bf16 directly (nearest even), no fp32 step.
    case CUDNN_DATA_HALF:
      static_cast<__half*>(base)[i] = __double2half(v);
      break;
    case CUDNN_DATA_BFLOAT16:
      static_cast<__nv_bfloat16*>(base)[i] = __double2bfloat16(v);
      break;
    default:
      break;
  }
}

// TF32: 10 explicit mantissa bits, to nearest with ties away from zero as the
// hardware conversion (cvt.rna.tf32.f32).
// Uncertain: whether cuDNN's TF32 kernels round (rna) or truncate their inputs.
double to_tf32(double d) {
  float f = static_cast<float>(d);
  if (!std::isfinite(f)) return f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x1000u) & ~0x1fffu;
  std::memcpy(&f, &u, 4);
  return f;
}

double round_input(double d, Rounding r) {
  switch (r) {
    case Rounding::TF32:
      return to_tf32(d);
    case Rounding::FP16:
      return static_cast<double>(__half2float(__double2half(d)));
    default:
      return d;
  }
}

size_t idx(const Strides& s, int64_t a, int64_t b, int64_t c, int64_t d) {
  return static_cast<size_t>(a * s.n + b * s.c + c * s.h + d * s.w);
}

// An activation as a dense NCHW double array.
std::vector<double> load_act(const void* p, const Strides& s, int N, int C, int H, int W, cudnnDataType_t dt,
                             Rounding r) {
  std::vector<double> out(static_cast<size_t>(N) * C * H * W);
  size_t o = 0;
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      for (int h = 0; h < H; ++h)
        for (int w = 0; w < W; ++w) out[o++] = round_input(load(p, idx(s, n, c, h, w), dt), r);
  return out;
}

// The filter as a dense K x C/G x R x S double array, flipped for true convolution so that
// the loops below are always cross-correlations.
std::vector<double> load_filter(const void* p, const Problem& pr, Rounding r) {
  std::vector<double> out(pr.w_elems());
  size_t o = 0;
  for (int k = 0; k < pr.K; ++k)
    for (int c = 0; c < pr.Cg(); ++c)
      for (int y = 0; y < pr.R; ++y)
        for (int x = 0; x < pr.S; ++x) {
          const int sy = pr.flip ? pr.R - 1 - y : y, sx = pr.flip ? pr.S - 1 - x : x;
          out[o++] = round_input(load(p, idx(pr.ws, k, c, sy, sx), pr.dt), r);
        }
  return out;
}


// The three convolutions as GEMMs over an image's column matrix
// col[pq][crs] = x[n, c, p*u-pad+r*dil, q*v-pad+s*dil] (0 in the padding), with the
// innermost loop over a channel dimension: late ResNet layers have 1x1..4x4 outputs,
// where loops over pixels would be all overhead. Sums in double (the error model).
namespace conv_gemm {

void im2col(const Problem& p, const double* xn, std::vector<double>& col) {
  const int64_t CRS = static_cast<int64_t>(p.C) * p.R * p.S;
  col.assign(static_cast<size_t>(p.P) * p.Q * CRS, 0.0);
  for (int op = 0; op < p.P; ++op)
    for (int oq = 0; oq < p.Q; ++oq) {
      double* row = &col[(static_cast<size_t>(op) * p.Q + oq) * CRS];
      for (int c = 0; c < p.C; ++c)
        for (int r = 0; r < p.R; ++r) {
          const int64_t ih = static_cast<int64_t>(op) * p.u - p.pad_h + static_cast<int64_t>(r) * p.dil_h;
          if (ih < 0 || ih >= p.H) continue;
          for (int s = 0; s < p.S; ++s) {
            const int64_t iw = static_cast<int64_t>(oq) * p.v - p.pad_w + static_cast<int64_t>(s) * p.dil_w;
            if (iw < 0 || iw >= p.W) continue;
            row[(static_cast<size_t>(c) * p.R + r) * p.S + s] = xn[(static_cast<size_t>(c) * p.H + ih) * p.W + iw];
          }
        }
    }
}

// The reverse: dx += col (positions read twice get both contributions).
void col2im_add(const Problem& p, const std::vector<double>& col, double* dxn) {
  const int64_t CRS = static_cast<int64_t>(p.C) * p.R * p.S;
  for (int op = 0; op < p.P; ++op)
    for (int oq = 0; oq < p.Q; ++oq) {
      const double* row = &col[(static_cast<size_t>(op) * p.Q + oq) * CRS];
      for (int c = 0; c < p.C; ++c)
        for (int r = 0; r < p.R; ++r) {
          const int64_t ih = static_cast<int64_t>(op) * p.u - p.pad_h + static_cast<int64_t>(r) * p.dil_h;
          if (ih < 0 || ih >= p.H) continue;
          for (int s = 0; s < p.S; ++s) {
            const int64_t iw = static_cast<int64_t>(oq) * p.v - p.pad_w + static_cast<int64_t>(s) * p.dil_w;
            if (iw < 0 || iw >= p.W) continue;
            dxn[(static_cast<size_t>(c) * p.H + ih) * p.W + iw] += row[(static_cast<size_t>(c) * p.R + r) * p.S + s];
          }
        }
    }
}

}  // namespace conv_gemm

// y[n,k,p,q] = sum_{c,r,s} x[n,c,p*u-pad+r*dil, q*v-pad+s*dil] * g[k,c,r,s]
std::vector<double> conv_fwd(const Problem& p, const std::vector<double>& x, const std::vector<double>& g) {
  const size_t PQ = static_cast<size_t>(p.P) * p.Q, CRS = static_cast<size_t>(p.C) * p.R * p.S, K = p.K;
  std::vector<double> y(p.y_elems(), 0.0), col, gt(CRS * K), t(PQ * K);
  for (size_t k = 0; k < K; ++k)
    for (size_t j = 0; j < CRS; ++j) gt[j * K + k] = g[k * CRS + j];
  for (int n = 0; n < p.N; ++n) {
    conv_gemm::im2col(p, &x[static_cast<size_t>(n) * p.C * p.H * p.W], col);
    std::fill(t.begin(), t.end(), 0.0);
    for (size_t i = 0; i < PQ; ++i) {
      double* ti = &t[i * K];
      for (size_t j = 0; j < CRS; ++j) {
        const double a = col[i * CRS + j];
        if (a == 0.0) continue;  // padding
        const double* gj = &gt[j * K];
        for (size_t k = 0; k < K; ++k) ti[k] += a * gj[k];
      }
    }
    double* yn = &y[static_cast<size_t>(n) * K * PQ];
    for (size_t i = 0; i < PQ; ++i)
      for (size_t k = 0; k < K; ++k) yn[k * PQ + i] = t[i * K + k];
  }
  return y;
}

// dx[n,c,ih,iw] = sum over the (k,r,s,p,q) that read it of g[k,c,r,s] * dy[n,k,p,q]
std::vector<double> conv_bwd_data(const Problem& p, const std::vector<double>& dy,
                                  const std::vector<double>& g) {
  const size_t PQ = static_cast<size_t>(p.P) * p.Q, CRS = static_cast<size_t>(p.C) * p.R * p.S, K = p.K;
  std::vector<double> dx(p.x_elems(), 0.0), dcol(PQ * CRS);
  for (int n = 0; n < p.N; ++n) {
    const double* dyn = &dy[static_cast<size_t>(n) * K * PQ];
    std::fill(dcol.begin(), dcol.end(), 0.0);
    for (size_t i = 0; i < PQ; ++i) {
      double* di = &dcol[i * CRS];
      for (size_t k = 0; k < K; ++k) {
        const double a = dyn[k * PQ + i];
        if (a == 0.0) continue;
        const double* gk = &g[k * CRS];
        for (size_t j = 0; j < CRS; ++j) di[j] += a * gk[j];
      }
    }
    conv_gemm::col2im_add(p, dcol, &dx[static_cast<size_t>(n) * p.C * p.H * p.W]);
  }
  return dx;
}

// dg[k,c,r,s] = sum_{n,p,q} x[n,c,p*u-pad+r*dil, q*v-pad+s*dil] * dy[n,k,p,q]
std::vector<double> conv_bwd_filter(const Problem& p, const std::vector<double>& x,
                                    const std::vector<double>& dy) {
  const size_t PQ = static_cast<size_t>(p.P) * p.Q, CRS = static_cast<size_t>(p.C) * p.R * p.S, K = p.K;
  std::vector<double> dg(p.w_elems(), 0.0), col;
  for (int n = 0; n < p.N; ++n) {
    conv_gemm::im2col(p, &x[static_cast<size_t>(n) * p.C * p.H * p.W], col);
    const double* dyn = &dy[static_cast<size_t>(n) * K * PQ];
    for (size_t k = 0; k < K; ++k) {
      double* dgk = &dg[k * CRS];
      for (size_t i = 0; i < PQ; ++i) {
        const double a = dyn[k * PQ + i];
        if (a == 0.0) continue;
        const double* ci = &col[i * CRS];
        for (size_t j = 0; j < CRS; ++j) dgk[j] += a * ci[j];
      }
    }
  }
  return dg;
}

// Grouped convolutions as one dense convolution per group: group g reads channels
// [g C/G, (g+1) C/G) of x, writes [g K/G, (g+1) K/G) of y, and owns filter rows
// [g K/G, (g+1) K/G) (contiguous in the dense K x C/G x R x S array).
namespace grouped {

Problem slice(const Problem& p) {
  Problem q = p;
  q.C = p.C / p.G;
  q.K = p.K / p.G;
  q.G = 1;
  return q;
}

// Channels [c0, c0 + cn) of a dense N x C x HW array.
std::vector<double> take(const std::vector<double>& a, int N, int C, size_t HW, int c0, int cn) {
  std::vector<double> out(static_cast<size_t>(N) * cn * HW);
  for (int n = 0; n < N; ++n)
    std::copy_n(&a[(static_cast<size_t>(n) * C + c0) * HW], cn * HW, &out[static_cast<size_t>(n) * cn * HW]);
  return out;
}

void put(std::vector<double>& a, int N, int C, size_t HW, int c0, int cn, const std::vector<double>& part) {
  for (int n = 0; n < N; ++n)
    std::copy_n(&part[static_cast<size_t>(n) * cn * HW], cn * HW, &a[(static_cast<size_t>(n) * C + c0) * HW]);
}

// x: dense N x C x H x W, g: dense filter, dy: dense N x K x P x Q (as the callers load them).
std::vector<double> run(Dir dir, const Problem& p, const std::vector<double>& a, const std::vector<double>& b) {
  auto dense = [&](const Problem& q, const std::vector<double>& u, const std::vector<double>& v) {
    return dir == Dir::Fwd ? conv_fwd(q, u, v) : dir == Dir::BwdData ? conv_bwd_data(q, u, v) : conv_bwd_filter(q, u, v);
  };
  if (p.G == 1) return dense(p, a, b);
  const Problem q = slice(p);
  const size_t HW = static_cast<size_t>(p.H) * p.W, PQ = static_cast<size_t>(p.P) * p.Q, wg = q.w_elems();
  std::vector<double> out(dir == Dir::Fwd ? p.y_elems() : dir == Dir::BwdData ? p.x_elems() : p.w_elems());
  for (int grp = 0; grp < p.G; ++grp) {
    const std::vector<double> filter_part(b.begin() + static_cast<std::ptrdiff_t>(grp * wg),
                                          b.begin() + static_cast<std::ptrdiff_t>((grp + 1) * wg));
    if (dir == Dir::Fwd) {
      put(out, p.N, p.K, PQ, grp * q.K, q.K, dense(q, take(a, p.N, p.C, HW, grp * q.C, q.C), filter_part));
    } else if (dir == Dir::BwdData) {  // a = dy, b = filter
      put(out, p.N, p.C, HW, grp * q.C, q.C, dense(q, take(a, p.N, p.K, PQ, grp * q.K, q.K), filter_part));
    } else {  // a = x, b = dy: the group's filter rows
      const auto dg = dense(q, take(a, p.N, p.C, HW, grp * q.C, q.C), take(b, p.N, p.K, PQ, grp * q.K, q.K));
      std::copy(dg.begin(), dg.end(), out.begin() + static_cast<std::ptrdiff_t>(grp * wg));
    }
  }
  return out;
}

}  // namespace grouped

// out = alpha * result + beta * out; beta == 0 does not read out (documented), so
// NaN there does not propagate.
void blend_act(void* out, const Strides& s, int N, int C, int H, int W, cudnnDataType_t dt,
               const std::vector<double>& r, double alpha, double beta) {
  size_t o = 0;
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c)
      for (int h = 0; h < H; ++h)
        for (int w = 0; w < W; ++w) {
          const size_t i = idx(s, n, c, h, w);
          const double prior = beta == 0.0 ? 0.0 : beta * load(out, i, dt);
          store(out, i, dt, alpha * r[o++] + prior);
        }
}

void blend_filter(void* out, const Problem& p, const std::vector<double>& dg, double alpha, double beta) {
  size_t o = 0;
  for (int k = 0; k < p.K; ++k)
    for (int c = 0; c < p.Cg(); ++c)
      for (int y = 0; y < p.R; ++y)
        for (int x = 0; x < p.S; ++x) {
          const int sy = p.flip ? p.R - 1 - y : y, sx = p.flip ? p.S - 1 - x : x;
          const size_t i = idx(p.ws, k, c, sy, sx);
          const double prior = beta == 0.0 ? 0.0 : beta * load(out, i, p.dt);
          store(out, i, p.dt, alpha * dg[o++] + prior);
        }
}

// alpha/beta are host pointers (documented): double for double data, else float.
double host_scalar(const void* p, cudnnDataType_t dt, const char* call, const char* role) {
  const rd::emu::Allocation* a = rd::emu::find_allocation(p);
  if (a && a->kind == rd::emu::MemKind::Device)
    rd::emu::fault(std::string(call) + ": " + role + " is " + rd::emu::describe_pointer(p) +
                   "; cuDNN reads alpha and beta from host memory");
  return dt == CUDNN_DATA_DOUBLE ? *static_cast<const double*>(p)
                                 : static_cast<double>(*static_cast<const float*>(p));
}

// The common part of the three convolution calls: checks, then the work queued on
// the handle's stream with everything captured by value.
cudnnStatus_t convolve(Dir dir, cudnnHandle_t h, const void* alpha, cudnnTensorDescriptor_t xd, const void* x,
                       cudnnFilterDescriptor_t wd, const void* w, cudnnConvolutionDescriptor_t cd, int algo,
                       void* workspace, size_t ws_bytes, const void* beta, cudnnTensorDescriptor_t yd,
                       const void* y) {
  const char* call = dir_call(dir);
  Problem p;
  const cudnnStatus_t st = validate(call, h, xd, wd, cd, yd, p);
  if (st != CUDNN_STATUS_SUCCESS) return st;
  if (!alpha || !beta) return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": alpha or beta is NULL");
  if (algo < 0 || algo >= algo_count(dir))
    return fail(CUDNN_STATUS_BAD_PARAM,
                std::string(call) + ": algorithm " + std::to_string(algo) + " out of range");
  const cudnnMathType_t mt = cd->math;
  const Math math = resolve_math(mt, p.dt);
  const AlgoInfo a = algo_info(p, dir, algo, math);
  if (!a.supported) return fail(CUDNN_STATUS_NOT_SUPPORTED, std::string(call) + ": " + a.why);
  if (ws_bytes < a.workspace || (!workspace && ws_bytes > 0)) {
    std::ostringstream why;
    why << call << ": algorithm " << algo << " with " << math_name(mt) << " needs a workspace of "
        << a.workspace << " B, got " << ws_bytes << " B at " << workspace;
    return fail(CUDNN_STATUS_BAD_PARAM, why.str());
  }
  const double al = host_scalar(alpha, p.dt, call, "alpha");
  const double be = host_scalar(beta, p.dt, call, "beta");
  const size_t e = elem_size(p.dt);
  const char* xname = dir == Dir::BwdData ? "dx" : "x";
  const char* yname = dir == Dir::Fwd ? "y" : "dy";
  rd::emu::require_device(x, p.x_elems() * e, call, xname);
  rd::emu::require_device(y, p.y_elems() * e, call, yname);
  rd::emu::require_device(w, p.w_elems() * e, call, dir == Dir::BwdFilter ? "dw" : "w");
  if (ws_bytes > 0) rd::emu::require_device(workspace, ws_bytes, call, "workSpace");
  rd::emu::require_stream(h->stream, call);  // a destroyed stream: a fault naming this call
  const Rounding rnd = math.rounding;
  const size_t scribble = a.workspace;
  std::ostringstream what;
  what << call << " (algo " << algo << ", " << math_name(mt) << ")";
  rd::emu::enqueue(h->stream, what.str(), [=] {
    // The algorithm owns its workspace while it runs: overwrite it, so a workspace
    // shared with live data or with concurrent work shows up as wrong numbers.
    if (scribble) std::memset(workspace, 0xA5, scribble);
    switch (dir) {
      case Dir::Fwd: {
        const auto xv = load_act(x, p.xs, p.N, p.C, p.H, p.W, p.dt, rnd);
        const auto gv = load_filter(w, p, rnd);
        blend_act(const_cast<void*>(y), p.ys, p.N, p.K, p.P, p.Q, p.dt, grouped::run(dir, p, xv, gv), al, be);
        break;
      }
      case Dir::BwdData: {
        const auto dyv = load_act(y, p.ys, p.N, p.K, p.P, p.Q, p.dt, rnd);
        const auto gv = load_filter(w, p, rnd);
        blend_act(const_cast<void*>(x), p.xs, p.N, p.C, p.H, p.W, p.dt, grouped::run(dir, p, dyv, gv), al, be);
        break;
      }
      case Dir::BwdFilter: {
        const auto xv = load_act(x, p.xs, p.N, p.C, p.H, p.W, p.dt, rnd);
        const auto dyv = load_act(y, p.ys, p.N, p.K, p.P, p.Q, p.dt, rnd);
        blend_filter(const_cast<void*>(w), p, grouped::run(dir, p, xv, dyv), al, be);
        break;
      }
    }
  });
  return CUDNN_STATUS_SUCCESS;
}

template <class Algo>
cudnnStatus_t workspace_size(Dir dir, const char* call, cudnnHandle_t h, cudnnTensorDescriptor_t xd,
                             cudnnFilterDescriptor_t wd, cudnnConvolutionDescriptor_t cd,
                             cudnnTensorDescriptor_t yd, Algo algo, size_t* bytes) {
  Problem p;
  const cudnnStatus_t st = validate(call, h, xd, wd, cd, yd, p);
  if (st != CUDNN_STATUS_SUCCESS) return st;
  if (!bytes) return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": sizeInBytes is NULL");
  const int a = static_cast<int>(algo);
  if (a < 0 || a >= algo_count(dir))
    return fail(CUDNN_STATUS_BAD_PARAM,
                std::string(call) + ": algorithm " + std::to_string(a) + " out of range");
  // The size for the descriptor's current math type, as the convolution call checks it.
  const AlgoInfo info = algo_info(p, dir, a, resolve_math(cd->math, p.dt));
  if (!info.supported) return fail(CUDNN_STATUS_NOT_SUPPORTED, std::string(call) + ": " + info.why);
  *bytes = info.workspace;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

// ---- library and handle --------------------------------------------------------------------

size_t CUDNNWINAPI cudnnGetVersion(void) { return CUDNN_VERSION; }

const char* CUDNNWINAPI cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS:
      return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED:
      return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM:
      return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER:
      return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_INTERNAL_ERROR:
      return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED:
      return "CUDNN_STATUS_ALLOC_FAILED";
    case CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED:
      return "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED";
    case CUDNN_STATUS_EXECUTION_FAILED:
      return "CUDNN_STATUS_EXECUTION_FAILED";
    default:
      break;
  }
  switch (CUDNN_STATUS_CATEGORY(status)) {
    case CUDNN_STATUS_BAD_PARAM:
      return "CUDNN_STATUS_BAD_PARAM (subcode)";
    case CUDNN_STATUS_NOT_SUPPORTED:
      return "CUDNN_STATUS_NOT_SUPPORTED (subcode)";
    case CUDNN_STATUS_INTERNAL_ERROR:
      return "CUDNN_STATUS_INTERNAL_ERROR (subcode)";
    case CUDNN_STATUS_EXECUTION_FAILED:
      return "CUDNN_STATUS_EXECUTION_FAILED (subcode)";
    default:
      return "CUDNN_STATUS_UNKNOWN";
  }
}

// The calling thread's last error message, truncated to max_size - 1 characters.
// Uncertain: whether cuDNN clears the message once read; it is kept here.
void CUDNNWINAPI cudnnGetLastErrorString(char* message, size_t max_size) {
  if (!message || max_size == 0) return;
  const size_t n = std::min(max_size - 1, last_error.size());
  std::memcpy(message, last_error.data(), n);
  message[n] = '\0';
}

cudnnStatus_t CUDNNWINAPI cudnnCreate(cudnnHandle_t* handle) {
  Lock lock(rd::emu::api_lock());
  if (!handle) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnCreate: handle is NULL");
  *handle = make_object<cudnnContext>(kHandle);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnDestroy(cudnnHandle_t handle) {
  Lock lock(rd::emu::api_lock());
  if (!handle) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnDestroy: handle is NULL");
  rd::emu::retire_handle(handle, kHandle, "cudnnDestroy");
  // Documented (cudnnCreate): releasing the handle implicitly calls
  // cudaDeviceSynchronize. Uncertain: whether cuDNN 9 still does.
  cudaDeviceSynchronize();
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
  Lock lock(rd::emu::api_lock());
  if (!handle) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: handle is NULL");
  rd::emu::require_handle(handle, kHandle, "cudnnSetStream");
  rd::emu::require_stream(streamId, "cudnnSetStream");
  handle->stream = streamId;
  return CUDNN_STATUS_SUCCESS;
}

// ---- descriptors -------------------------------------------------------------------------------

cudnnStatus_t CUDNNWINAPI cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* d) {
  Lock lock(rd::emu::api_lock());
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnCreateTensorDescriptor: NULL");
  *d = make_object<cudnnTensorStruct>(kTensor);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format,
                                                     cudnnDataType_t dataType, int n, int c, int h, int w) {
  Lock lock(rd::emu::api_lock());
  static const char* call = "cudnnSetTensor4dDescriptor";
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": descriptor is NULL");
  rd::emu::require_handle(d, kTensor, call);
  if (n <= 0 || c <= 0 || h <= 0 || w <= 0)
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": a dimension is not positive");
  if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC) {
    // NCHW_VECT_C (int8 vectors) is valid cuDNN but not modelled here.
    return fail(format == CUDNN_TENSOR_NCHW_VECT_C ? CUDNN_STATUS_NOT_SUPPORTED : CUDNN_STATUS_BAD_PARAM,
                std::string(call) + ": format not modelled by the emulator");
  }
  // Deviation: cuDNN accepts the integer and fp8 types here; the emulator models
  // float, double, half and bfloat16 only and says so at once.
  if (elem_size(dataType) == 0)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, std::string(call) + ": data type not modelled by the emulator");
  if (static_cast<int64_t>(n) * c * h * w > 2147483647LL)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, std::string(call) + ": more than 2^31-1 elements");
  d->set = true, d->fmt = format, d->dt = dataType, d->n = n, d->c = c, d->h = h, d->w = w;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) {
  Lock lock(rd::emu::api_lock());
  if (!d) return CUDNN_STATUS_SUCCESS;  // destroying NULL is a no-op
  rd::emu::retire_handle(d, kTensor, "cudnnDestroyTensorDescriptor");
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* d) {
  Lock lock(rd::emu::api_lock());
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnCreateFilterDescriptor: NULL");
  *d = make_object<cudnnFilterStruct>(kFilter);
  return CUDNN_STATUS_SUCCESS;
}

// format NCHW: the filter is KCRS; NHWC: KRSC (documented).
cudnnStatus_t CUDNNWINAPI cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t dataType,
                                                     cudnnTensorFormat_t format, int k, int c, int h, int w) {
  Lock lock(rd::emu::api_lock());
  static const char* call = "cudnnSetFilter4dDescriptor";
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": descriptor is NULL");
  rd::emu::require_handle(d, kFilter, call);
  if (k <= 0 || c <= 0 || h <= 0 || w <= 0)
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": a dimension is not positive");
  if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC)
    return fail(format == CUDNN_TENSOR_NCHW_VECT_C ? CUDNN_STATUS_NOT_SUPPORTED : CUDNN_STATUS_BAD_PARAM,
                std::string(call) + ": format not modelled by the emulator");
  if (elem_size(dataType) == 0)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, std::string(call) + ": data type not modelled by the emulator");
  d->set = true, d->dt = dataType, d->fmt = format, d->k = k, d->c = c, d->r = h, d->s = w;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) {
  Lock lock(rd::emu::api_lock());
  if (!d) return CUDNN_STATUS_SUCCESS;
  rd::emu::retire_handle(d, kFilter, "cudnnDestroyFilterDescriptor");
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* d) {
  Lock lock(rd::emu::api_lock());
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnCreateConvolutionDescriptor: NULL");
  *d = make_object<cudnnConvolutionStruct>(kConv);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h,
                                                          int pad_w, int u, int v, int dilation_h,
                                                          int dilation_w, cudnnConvolutionMode_t mode,
                                                          cudnnDataType_t computeType) {
  Lock lock(rd::emu::api_lock());
  static const char* call = "cudnnSetConvolution2dDescriptor";
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": descriptor is NULL");
  rd::emu::require_handle(d, kConv, call);
  if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0)
    return fail(CUDNN_STATUS_BAD_PARAM,
                std::string(call) + ": negative padding or non-positive stride/dilation");
  if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION)
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(call) + ": invalid mode");
  if (elem_size(computeType) == 0 || computeType == CUDNN_DATA_BFLOAT16)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, std::string(call) + ": compute type not supported");
  d->set = true;
  d->pad_h = pad_h, d->pad_w = pad_w, d->u = u, d->v = v, d->dil_h = dilation_h, d->dil_w = dilation_w;
  d->mode = mode, d->compute = computeType;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d,
                                                      cudnnMathType_t mathType) {
  Lock lock(rd::emu::api_lock());
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionMathType: descriptor is NULL");
  rd::emu::require_handle(d, kConv, "cudnnSetConvolutionMathType");
  if (!valid_math(mathType))
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionMathType: invalid math type");
  d->math = mathType;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int groupCount) {
  Lock lock(rd::emu::api_lock());
  if (!d) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionGroupCount: descriptor is NULL");
  rd::emu::require_handle(d, kConv, "cudnnSetConvolutionGroupCount");
  if (groupCount < 1) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionGroupCount: group count < 1");
  d->groups = groupCount;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int* groupCount) {
  Lock lock(rd::emu::api_lock());
  if (!d || !groupCount) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetConvolutionGroupCount: NULL argument");
  rd::emu::require_handle(d, kConv, "cudnnGetConvolutionGroupCount");
  *groupCount = d->groups;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) {
  Lock lock(rd::emu::api_lock());
  if (!d) return CUDNN_STATUS_SUCCESS;
  rd::emu::retire_handle(d, kConv, "cudnnDestroyConvolutionDescriptor");
  return CUDNN_STATUS_SUCCESS;
}

// ---- algorithm searches ------------------------------------------------------------------------
// Uncertain: real Find runs every algorithm on the handle's stream and blocks the
// host; this one queues nothing and does not synchronise, so no caller can come to
// rely on a Find draining its stream.

cudnnStatus_t CUDNNWINAPI cudnnFindConvolutionForwardAlgorithm(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
    const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t y, const int requested, int* returned,
    cudnnConvolutionFwdAlgoPerf_t* perf) {
  Lock lock(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::CudnnFind);
  return search<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
      "cudnnFindConvolutionForwardAlgorithm", Dir::Fwd, h, x, w, c, y, requested, returned, perf, true);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
    const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t y, const int requested, int* returned,
    cudnnConvolutionFwdAlgoPerf_t* perf) {
  Lock lock(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::CudnnFind);
  return search<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
      "cudnnGetConvolutionForwardAlgorithm_v7", Dir::Fwd, h, x, w, c, y, requested, returned, perf, false);
}

// Backward data: the "x" of the problem is dx, "y" is dy.
cudnnStatus_t CUDNNWINAPI cudnnFindConvolutionBackwardDataAlgorithm(
    cudnnHandle_t h, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t dx, const int requested,
    int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  Lock lock(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::CudnnFind);
  return search<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
      "cudnnFindConvolutionBackwardDataAlgorithm", Dir::BwdData, h, dx, w, c, dy, requested, returned, perf,
      true);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t h, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t dx, const int requested,
    int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  Lock lock(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::CudnnFind);
  return search<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
      "cudnnGetConvolutionBackwardDataAlgorithm_v7", Dir::BwdData, h, dx, w, c, dy, requested, returned, perf,
      false);
}

cudnnStatus_t CUDNNWINAPI cudnnFindConvolutionBackwardFilterAlgorithm(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t c, const cudnnFilterDescriptor_t dw, const int requested,
    int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  Lock lock(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::CudnnFind);
  return search<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
      "cudnnFindConvolutionBackwardFilterAlgorithm", Dir::BwdFilter, h, x, dw, c, dy, requested, returned,
      perf, true);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t c, const cudnnFilterDescriptor_t dw, const int requested,
    int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  Lock lock(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::CudnnFind);
  return search<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
      "cudnnGetConvolutionBackwardFilterAlgorithm_v7", Dir::BwdFilter, h, x, dw, c, dy, requested, returned,
      perf, false);
}

// ---- workspace sizes ---------------------------------------------------------------------------

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionForwardWorkspaceSize(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
    const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t y, cudnnConvolutionFwdAlgo_t algo,
    size_t* bytes) {
  Lock lock(rd::emu::api_lock());
  return workspace_size(Dir::Fwd, "cudnnGetConvolutionForwardWorkspaceSize", h, x, w, c, y, algo, bytes);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t h, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t dx,
    cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
  Lock lock(rd::emu::api_lock());
  return workspace_size(Dir::BwdData, "cudnnGetConvolutionBackwardDataWorkspaceSize", h, dx, w, c, dy, algo,
                        bytes);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t c, const cudnnFilterDescriptor_t dw,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
  Lock lock(rd::emu::api_lock());
  return workspace_size(Dir::BwdFilter, "cudnnGetConvolutionBackwardFilterWorkspaceSize", h, x, dw, c, dy,
                        algo, bytes);
}

// ---- convolutions: output = alpha * op(inputs) + beta * output -------------------------------------

cudnnStatus_t CUDNNWINAPI cudnnConvolutionForward(cudnnHandle_t h, const void* alpha,
                                                  const cudnnTensorDescriptor_t xd, const void* x,
                                                  const cudnnFilterDescriptor_t wd, const void* w,
                                                  const cudnnConvolutionDescriptor_t cd,
                                                  cudnnConvolutionFwdAlgo_t algo, void* workSpace,
                                                  size_t workSpaceSizeInBytes, const void* beta,
                                                  const cudnnTensorDescriptor_t yd, void* y) {
  Lock lock(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::KernelLaunches);
  return convolve(Dir::Fwd, h, alpha, xd, x, wd, w, cd, static_cast<int>(algo), workSpace,
                  workSpaceSizeInBytes, beta, yd, y);
}

cudnnStatus_t CUDNNWINAPI cudnnConvolutionBackwardData(cudnnHandle_t h, const void* alpha,
                                                       const cudnnFilterDescriptor_t wd, const void* w,
                                                       const cudnnTensorDescriptor_t dyd, const void* dy,
                                                       const cudnnConvolutionDescriptor_t cd,
                                                       cudnnConvolutionBwdDataAlgo_t algo, void* workSpace,
                                                       size_t workSpaceSizeInBytes, const void* beta,
                                                       const cudnnTensorDescriptor_t dxd, void* dx) {
  Lock lock(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::KernelLaunches);
  return convolve(Dir::BwdData, h, alpha, dxd, dx, wd, w, cd, static_cast<int>(algo), workSpace,
                  workSpaceSizeInBytes, beta, dyd, dy);
}

cudnnStatus_t CUDNNWINAPI cudnnConvolutionBackwardFilter(
    cudnnHandle_t h, const void* alpha, const cudnnTensorDescriptor_t xd, const void* x,
    const cudnnTensorDescriptor_t dyd, const void* dy, const cudnnConvolutionDescriptor_t cd,
    cudnnConvolutionBwdFilterAlgo_t algo, void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
    const cudnnFilterDescriptor_t dwd, void* dw) {
  Lock lock(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::KernelLaunches);
  return convolve(Dir::BwdFilter, h, alpha, xd, x, dwd, dw, cd, static_cast<int>(algo), workSpace,
                  workSpaceSizeInBytes, beta, dyd, dy);
}

}  // extern "C"
