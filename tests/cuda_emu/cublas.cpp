// cuBLAS stand-in of the emulated device (tests only): exactly the calls the CUDA
// backend makes (handle lifetime, stream, math mode, Sgemm), written from the
// cuBLAS documentation. Declarations are the toolkit's own (cublas_v2.h maps
// cublasCreate -> cublasCreate_v2 etc.); definitions run on the host.
//
// Error model: Sgemm accumulates exact products in double and rounds once to
// fp32, where cuBLAS accumulates in fp32: a real GPU's result differs by up to
// about k * 2^-24 * sum|a*b| (its own accumulation error, absent here).
// TF32 math rounds each input to 10 mantissa bits before multiplying, so a TF32
// result differs from the FMA one as it does on an Ampere+ GPU.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "emu.h"

// The handle type is an opaque struct in cublas_api.h; its body is ours.
struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace {

constexpr const char* kHandleKind = "cublasHandle_t";

// Handles are never freed: a destroyed handle's address then cannot be reused by
// a new one, so a stale handle stays detectable (register/retire in emu.h). They
// stay reachable from here, so leak checkers do not report them; never destroyed,
// so a static destructor that still uses a handle at exit finds it.
std::vector<std::unique_ptr<cublasContext>>& graveyard() {
  static auto* g = new std::vector<std::unique_ptr<cublasContext>>;
  return *g;
}

// Operand rounding the math mode implies for fp32 inputs.
enum class Rounding { None, TF32, FP16 };

bool tf32_allowed() {
  // NVIDIA_TF32_OVERRIDE=0 disables TF32 globally (cuBLAS and cuDNN documentation);
  // TF32 tensor cores exist from sm_80 on.
  const char* o = std::getenv("NVIDIA_TF32_OVERRIDE");
  if (o && std::strcmp(o, "0") == 0) return false;
  return rd::emu::device_spec().major >= 8;
}

Rounding rounding_for(cublasMath_t mode) {
  switch (static_cast<int>(mode) & 0xf) {
    case CUBLAS_TF32_TENSOR_OP_MATH:
      return tf32_allowed() ? Rounding::TF32 : Rounding::None;
    // Uncertain: the deprecated TENSOR_OP mode is documented to use
    // CUBLAS_COMPUTE_32F_FAST_16F for single precision; we round inputs to fp16.
    case CUBLAS_TENSOR_OP_MATH:
      return Rounding::FP16;
    default:
      return Rounding::None;  // DEFAULT, PEDANTIC: plain fp32 products
  }
}

// Round to TF32 (8-bit exponent, 10-bit mantissa), to nearest with ties away from
// zero as the hardware conversion (cvt.rna.tf32.f32) does.
// Uncertain: whether cuBLAS's TF32 kernels round (rna) or truncate the inputs.
float to_tf32(float f) {
  if (!std::isfinite(f)) return f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x1000u) & ~0x1fffu;
  std::memcpy(&f, &u, 4);
  return f;
}

float to_fp16_range(float f) {
  // Round-to-nearest-even to binary16 (11-bit significand), with its range.
  if (!std::isfinite(f)) return f;
  if (std::fabs(f) >= 65520.f) return std::copysign(INFINITY, f);
  int e = 0;
  std::frexp(f, &e);
  const int exp_unbiased = std::max(e - 1, -14);  // subnormals below 2^-14
  const double q = std::ldexp(1.0, exp_unbiased - 10);
  return static_cast<float>(std::nearbyint(f / q) * q);
}

double round_input(float f, Rounding r) {
  switch (r) {
    case Rounding::TF32:
      return to_tf32(f);
    case Rounding::FP16:
      return to_fp16_range(f);
    default:
      return f;
  }
}

// A host pointer mode handle reads alpha/beta on the host at call time; a device
// pointer there is a bug the GPU would answer with garbage or a crash.
void require_host_scalar(const void* p, const char* call, const char* role) {
  const rd::emu::Allocation* a = rd::emu::find_allocation(p);
  if (a && a->kind == rd::emu::MemKind::Device)
    rd::emu::fault(std::string(call) + ": " + role + " is " + rd::emu::describe_pointer(p) +
                   ", but the pointer mode is host (CUBLAS_POINTER_MODE_HOST)");
}

bool valid_op(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

}  // namespace

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  std::lock_guard<std::recursive_mutex> lock(rd::emu::api_lock());
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  graveyard().push_back(std::make_unique<cublasContext>());
  *handle = graveyard().back().get();
  rd::emu::register_handle(*handle, kHandleKind);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  std::lock_guard<std::recursive_mutex> lock(rd::emu::api_lock());
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  rd::emu::retire_handle(handle, kHandleKind, "cublasDestroy");
  // Documented: cublasDestroy implicitly calls cudaDeviceSynchronize, so work
  // already queued through this handle completes.
  cudaDeviceSynchronize();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  std::lock_guard<std::recursive_mutex> lock(rd::emu::api_lock());
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  rd::emu::require_handle(handle, kHandleKind, "cublasSetStream");
  rd::emu::require_stream(streamId, "cublasSetStream");
  handle->stream = streamId;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  std::lock_guard<std::recursive_mutex> lock(rd::emu::api_lock());
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  rd::emu::require_handle(handle, kHandleKind, "cublasSetMathMode");
  const int base = static_cast<int>(mode) & 0xf, flags = static_cast<int>(mode) & ~0xf;
  if (flags & ~static_cast<int>(CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION))
    return CUBLAS_STATUS_INVALID_VALUE;
  switch (base) {
    case CUBLAS_DEFAULT_MATH:
    case CUBLAS_TENSOR_OP_MATH:
    case CUBLAS_PEDANTIC_MATH:
    case CUBLAS_TF32_TENSOR_OP_MATH:
      break;
    // The emulated fp32/fp64 modes are not modelled: refuse rather than guess.
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

// C = alpha * op(A) op(B) + beta * C, column-major: C is m x n, op(A) m x k,
// op(B) k x n; A is m x k (N) or k x m (T), B is k x n (N) or n x k (T).
cublasStatus_t CUBLASWINAPI cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                                           const float* A, int lda, const float* B, int ldb,
                                           const float* beta, float* C, int ldc) {
  static const char* call = "cublasSgemm";
  std::lock_guard<std::recursive_mutex> lock(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::KernelLaunches);
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  rd::emu::require_handle(handle, kHandleKind, call);
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  const int a_rows = ta ? k : m, b_rows = tb ? n : k;
  // The documented INVALID_VALUE conditions.
  if (!valid_op(transa) || !valid_op(transb) || m < 0 || n < 0 || k < 0 || lda < std::max(1, a_rows) ||
      ldb < std::max(1, b_rows) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  require_host_scalar(alpha, call, "alpha");
  require_host_scalar(beta, call, "beta");
  // Pointer mode host: the scalars are read now, not when the work runs.
  const double al = *alpha, be = *beta;
  if (m == 0 || n == 0 || ((al == 0.0 || k == 0) && be == 1.0)) return CUBLAS_STATUS_SUCCESS;
  const bool reads_ab = al != 0.0 && k > 0;
  const int a_cols = ta ? m : k, b_cols = tb ? k : n;
  if (reads_ab) {
    rd::emu::require_device(A, (static_cast<size_t>(a_cols - 1) * lda + a_rows) * sizeof(float), call, "A");
    rd::emu::require_device(B, (static_cast<size_t>(b_cols - 1) * ldb + b_rows) * sizeof(float), call, "B");
  }
  rd::emu::require_device(C, (static_cast<size_t>(n - 1) * ldc + m) * sizeof(float), call, "C");
  rd::emu::require_stream(handle->stream, call);  // a destroyed stream: a fault naming this call
  const Rounding rnd = rounding_for(handle->math);
  rd::emu::enqueue(handle->stream, call, [=] {
    std::vector<double> acc(static_cast<size_t>(m) * n, 0.0);
    if (reads_ab) {
      // op(A) as an m x k column-major double matrix, op(B) as k x n.
      std::vector<double> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n);
      for (int l = 0; l < k; ++l)
        for (int i = 0; i < m; ++i)
          a[static_cast<size_t>(l) * m + i] = round_input(
              ta ? A[static_cast<size_t>(i) * lda + l] : A[static_cast<size_t>(l) * lda + i], rnd);
      for (int j = 0; j < n; ++j)
        for (int l = 0; l < k; ++l)
          b[static_cast<size_t>(j) * k + l] = round_input(
              tb ? B[static_cast<size_t>(l) * ldb + j] : B[static_cast<size_t>(j) * ldb + l], rnd);
      for (int j = 0; j < n; ++j) {
        double* cj = &acc[static_cast<size_t>(j) * m];
        for (int l = 0; l < k; ++l) {
          const double blj = b[static_cast<size_t>(j) * k + l];
          const double* al_col = &a[static_cast<size_t>(l) * m];
          for (int i = 0; i < m; ++i) cj[i] += al_col[i] * blj;
        }
      }
    }
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float& c = C[static_cast<size_t>(j) * ldc + i];
        // beta == 0: C is not read (documented), so NaN/Inf there does not propagate.
        const double prior = be == 0.0 ? 0.0 : be * static_cast<double>(c);
        c = static_cast<float>(al * acc[static_cast<size_t>(j) * m + i] + prior);
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}

const char* CUBLASWINAPI cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "error detected trying to check the license";
  }
  return "unknown error";
}

}  // extern "C"
