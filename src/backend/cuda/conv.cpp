// cuDNN convolutions of the CUDA backend: the device buffers they draw on (Scratch), one
// plan per shape (descriptors and, per direction, the algorithms cudnnFind ranked), the
// search and its out-of-memory and no-algorithm fallbacks, the staged (NHWC / 16-bit)
// weights, and RD_CONV_REPORT's lines. The CPU backend's counterpart is
// src/backend/cpu/conv.cpp.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cuda/conv_plan.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "resnet_ddp/errors.h"

namespace rd::cuda {

// ---- Scratch ----------------------------------------------------------------------

Scratch::~Scratch() { release(); }

bool wait_stream_bounded(cudaStream_t s, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e != cudaErrorNotReady) {
      if (e != cudaSuccess) cudaGetLastError();
      return true;  // done, or failed (nothing left to wait for)
    }
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void Scratch::release() {
  if (!ptr_) return;
  // The buffer may still be in use by queued work: wait for its streams (or the
  // device when unbound) first; if they never finish, leak it rather than hang.
  if (streams_[0]) {
    for (cudaStream_t s : streams_)
      if (s && !wait_stream_bounded(s, wait_s_)) {
        ptr_ = nullptr;
        bytes_ = 0;
        return;
      }
  } else {
    cudaDeviceSynchronize();
  }
  if (pinned_)
    cudaFreeHost(ptr_);
  else
    cudaFree(ptr_);
  count_memory_event();
  ptr_ = nullptr;
  bytes_ = 0;
}

void* Scratch::try_get(size_t bytes) {
  if (bytes <= bytes_ && ptr_) return ptr_;
  const size_t want = std::max<size_t>(bytes, 256);
  void* fresh = nullptr;
  const cudaError_t e = pinned_ ? cudaMallocHost(&fresh, want) : cudaMalloc(&fresh, want);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it so later calls report their own errors
    return nullptr;
  }
  if (e != cudaSuccess) fail_cuda(e, pinned_ ? "cudaMallocHost" : "cudaMalloc", __FILE__, __LINE__);
  count_memory_event();
  release();
  ptr_ = fresh;
  bytes_ = want;
  return ptr_;
}

void* Scratch::get(size_t bytes, const char* what) {
  if (bytes <= bytes_ && ptr_) return ptr_;
  release();
  const size_t want = std::max<size_t>(bytes, 256);
  cudaError_t e = pinned_ ? cudaMallocHost(&ptr_, want) : cudaMalloc(&ptr_, want);
  if (e == cudaErrorMemoryAllocation && on_oom_) {
    // As CudaBackend::allocate: the workspace was sized while memory was free;
    // give it back and retry once (convolutions then take smaller algorithms).
    cudaGetLastError();
    ptr_ = nullptr;
    if (on_oom_()) e = pinned_ ? cudaMallocHost(&ptr_, want) : cudaMalloc(&ptr_, want);
  }
  if (e == cudaErrorMemoryAllocation) {
    ptr_ = nullptr;
    fail_oom(want, what, __FILE__, __LINE__);
  }
  if (e != cudaSuccess) {
    ptr_ = nullptr;
    fail_cuda(e, pinned_ ? "cudaMallocHost" : "cudaMalloc", __FILE__, __LINE__);
  }
  count_memory_event();
  bytes_ = want;
  return ptr_;
}

// ---- convolution plans --------------------------------------------------------------

size_t CudaBackend::ConvKeyHash::operator()(const ConvKey& k) const {
  size_t h = 1469598103934665603ull;
  auto mix = [&](int64_t v) { h = (h ^ static_cast<size_t>(v)) * 1099511628211ull; };
  mix(k.n), mix(k.c), mix(k.h), mix(k.w), mix(k.o), mix(k.kh), mix(k.kw), mix(k.stride), mix(k.pad), mix(k.groups);
  mix(k.nhwc), mix(static_cast<int64_t>(k.dtype));
  return h;
}

namespace {

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::F16: return CUDNN_DATA_HALF;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    default: RD_FAIL("cuDNN: unsupported element type " << dtype_name(t));
  }
}

// One result of cudnnFind* / cudnnGet*_v7, whatever the direction.
struct Found {
  int algo;
  cudnnStatus_t status;
  size_t memory;
  cudnnMathType_t math;
  float time;  // ms measured by cudnnFind (negative from the heuristics)
};

template <class Perf>
std::vector<Found> found_of(const Perf* perf, int n) {
  std::vector<Found> out;
  for (int i = 0; i < n; ++i)
    out.push_back({static_cast<int>(perf[i].algo), perf[i].status, perf[i].memory, perf[i].mathType, perf[i].time});
  return out;
}

// cudnnFind could not allocate its own buffers: the call failed so, or every
// algorithm did.
bool find_out_of_memory(cudnnStatus_t s, const std::vector<Found>& found) {
  if (s == CUDNN_STATUS_ALLOC_FAILED) return true;
  if (s != CUDNN_STATUS_SUCCESS) return false;
  bool any_alloc_failed = false;
  for (const Found& f : found) {
    if (f.status == CUDNN_STATUS_SUCCESS) return false;
    any_alloc_failed |= f.status == CUDNN_STATUS_ALLOC_FAILED;
  }
  return any_alloc_failed;
}

}  // namespace

cudnnMathType_t CudaBackend::wanted_conv_math() const {
  switch (precision_) {
    case Precision::FP32: return CUDNN_FMA_MATH;  // no TF32: exact fp32 products
    case Precision::TF32: return CUDNN_DEFAULT_MATH;  // cuDNN 8+: TF32 on Ampere+
    default: return CUDNN_TENSOR_OP_MATH;
  }
}

size_t CudaBackend::find_workspace_limit() const {
  size_t free_b = 0, total_b = 0;
  RD_CUDA(cudaMemGetInfo(&free_b, &total_b));
  // Leave room for the activations still to be allocated, keep what is already ours;
  // never more than a quarter of the GPU (16 GB cards: 4 GB). A later shortage is
  // handled by the fallbacks (affordable) and by allocate() releasing the workspace.
  return std::max(workspace_.capacity(), std::min(free_b / 2, total_b / 4));
}

CudaBackend::ConvChoice CudaBackend::affordable(std::vector<ConvChoice>& list, void*& ws, const char* op) {
  for (;;) {
    RD_CHECK(!list.empty(), op << ": no convolution algorithm's workspace fits in the free GPU memory");
    const ConvChoice c = list.front();
    ws = c.ws ? workspace_.try_get(c.ws) : nullptr;
    if (!c.ws || ws) return c;
    // Out of memory for this one: drop it for good, try the next (smaller or slower) one.
    list.erase(list.begin());
  }
}

CudaBackend::ConvPlan& CudaBackend::plan(const kern::ActDesc& x, const Tensor& w,
                                         const ConvGeometry& g, const char* op) {
  RD_CHECK(w.device == DeviceKind::CUDA && w.dtype == DType::F32 && w.shape.rank == 4 && w.data,
           op << ": weight must be a f32 (O, I / groups, kh, kw) CUDA tensor, got " << w.describe());
  return plan_shape(x, w.shape, g, op);
}

CudaBackend::ConvPlan& CudaBackend::plan_shape(const kern::ActDesc& x, const Shape& ws, const ConvGeometry& g,
                                               const char* op) {
  RD_CHECK(ws.rank == 4 && g.groups > 0 && ws[1] * g.groups == x.c && ws[0] % g.groups == 0 &&
               ws[2] == g.kernel && ws[3] == g.kernel,
           op << ": weight " << ws.str() << " does not match input channels " << x.c << ", kernel "
              << g.kernel << " and " << g.groups << " groups");
  RD_CHECK(g.kernel > 0 && g.stride > 0 && g.pad >= 0,
           op << ": bad geometry kernel " << g.kernel << " stride " << g.stride << " pad " << g.pad);
  const ConvKey key{x.n, x.c, x.h, x.w, ws[0], ws[2], ws[3],
                    g.stride, g.pad, g.groups, x.nhwc, x.dtype};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;

  auto p = std::make_unique<ConvPlan>();
  const cudnnDataType_t dt = cudnn_type(x.dtype);
  const cudnnTensorFormat_t fmt = x.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  p->yh = conv_out_size(x.h, g.kernel, g.stride, g.pad);
  p->yw = conv_out_size(x.w, g.kernel, g.stride, g.pad);
  p->key = key;
  p->dtype = x.dtype;
  p->x_count = x.n * x.c * x.h * x.w;
  p->y_count = x.n * ws[0] * p->yh * p->yw;
  p->w_count = ws[0] * ws[1] * ws[2] * ws[3];
  RD_CHECK(p->yh > 0 && p->yw > 0, op << ": input " << x.h << "x" << x.w << " too small for kernel "
                                      << g.kernel << " stride " << g.stride << " pad " << g.pad);
  RD_CUDNN(cudnnCreateTensorDescriptor(&p->x));
  RD_CUDNN(cudnnCreateTensorDescriptor(&p->y));
  RD_CUDNN(cudnnCreateFilterDescriptor(&p->w));
  RD_CUDNN(cudnnCreateConvolutionDescriptor(&p->conv));
  RD_CUDNN(cudnnSetTensor4dDescriptor(p->x, fmt, dt, narrow(x.n, "batch"), narrow(x.c, "channels"),
                                      narrow(x.h, "height"), narrow(x.w, "width")));
  RD_CUDNN(cudnnSetTensor4dDescriptor(p->y, fmt, dt, narrow(x.n, "batch"),
                                      narrow(ws[0], "channels"), narrow(p->yh, "height"),
                                      narrow(p->yw, "width")));
  // Staged weights are OHWI next to NHWC activations (see stage_conv_weight). Grouped:
  // the filter is (O, I / groups, k, k), as PyTorch's, with the group count on the
  // convolution descriptor.
  const cudnnTensorFormat_t wfmt = stages_weights() && x.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  RD_CUDNN(cudnnSetFilter4dDescriptor(p->w, dt, wfmt, narrow(ws[0], "out channels"),
                                      narrow(ws[1], "in channels per group"), g.kernel, g.kernel));
  RD_CUDNN(cudnnSetConvolution2dDescriptor(p->conv, g.pad, g.pad, g.stride, g.stride, 1, 1,
                                           CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  if (g.groups != 1) RD_CUDNN(cudnnSetConvolutionGroupCount(p->conv, g.groups));
  RD_CUDNN(cudnnSetConvolutionMathType(p->conv, wanted_conv_math()));
  auto& ref = *p;
  plans_.emplace(key, std::move(p));
  return ref;
}

bool CudaBackend::stages_weights() const {
  return layout_ == Layout::NHWC || act_dtype_ != DType::F32;
}

// One staged copy per weight buffer, re-staged only when something may have written
// weights since (weights_version_: optimizer steps, EMA copies, host copies, fills, new
// allocations, collectives that write device memory), so a training step converts each
// weight once, not twice, and evaluation converts it once for all its batches. Copies unused for a whole
// optimizer step are released (prune_staged_weights), so reloaded models and
// finite-difference tests do not keep stale device copies.
const void* CudaBackend::staged_weight(const Tensor& w) {
  if (!stages_weights()) return w.data;
  // Without optimizer steps (inference, tests) nothing is pruned: bound the count
  // instead, far above any ResNet's conv layers (ResNet-152: 155).
  if (staged_weights_.size() >= 1024 && !staged_weights_.count(w.data)) staged_weights_.clear();
  StagedWeight& slot = staged_weights_[w.data];
  const size_t bytes = static_cast<size_t>(w.numel()) * dtype_size(act_dtype_);
  const bool fresh = slot.buffer && slot.version == weights_version_ && slot.bytes == bytes;
  slot.last_used_step = optimizer_steps_;
  convs_since_step_ = true;
  if (recording_) {
    // A graph may not allocate: its weights were staged by the run before it was recorded.
    RD_CHECK(slot.buffer && slot.buffer->capacity() >= bytes,
             "a convolution weight had no staged copy when a graph was recorded: run the work once first");
    (fresh ? recording_->relies : recording_->converts).push_back(w.data);
  }
  if (fresh) return slot.buffer->get(bytes, "staged conv weight");
  if (!slot.buffer) {
    slot.buffer = std::make_unique<Scratch>();
    slot.buffer->bind(collective_timeout_s_, compute_);
    slot.buffer->on_oom([this] { return release_workspace_for_oom(); });
  }
  if (slot.buffer->capacity() < bytes) ++staged_weight_allocations_;
  void* dst = slot.buffer->get(bytes, "staged conv weight");
  ++weight_stagings_;
  kern::stage_conv_weight(w.f32(), w.shape[0], w.shape[1], w.shape[2], w.shape[3],
                          layout_ == Layout::NHWC, act_dtype_, dst, compute_);
  slot.version = weights_version_;
  slot.bytes = bytes;
  return dst;
}

void CudaBackend::prune_staged_weights() {
  for (auto it = staged_weights_.begin(); it != staged_weights_.end();)
    it = it->second.last_used_step + 1 < optimizer_steps_ ? staged_weights_.erase(it) : std::next(it);
}

// ---- convolution -------------------------------------------------------------------------------

bool CudaBackend::release_workspace_for_oom() {
  cudaGetLastError();  // the failed allocation's error is not sticky: clear it
  if (workspace_.capacity() == 0) return false;
  workspace_.release();
  return true;
}

cudnnStatus_t CudaBackend::workspace_size(ConvPlan& p, int d, int algo, cudnnMathType_t math, size_t& ws) {
  const cudnnStatus_t s = cudnnSetConvolutionMathType(p.conv, math);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  switch (d) {
    case kFwd:
      return cudnnGetConvolutionForwardWorkspaceSize(cudnn_, p.x, p.w, p.conv, p.y,
                                                     static_cast<cudnnConvolutionFwdAlgo_t>(algo), &ws);
    case kBwdData:
      return cudnnGetConvolutionBackwardDataWorkspaceSize(cudnn_, p.w, p.y, p.conv, p.x,
                                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), &ws);
    default:
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnn_, p.x, p.y, p.conv, p.w,
                                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), &ws);
  }
}

namespace {
// cudnnFind* (measures every algorithm) or cudnnGet*_v7 (heuristics, runs nothing).
cudnnStatus_t query_algorithms(cudnnHandle_t h, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
                               const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t y, int d,
                               bool heuristics, std::vector<Found>& out) {
  int n = 0;
  cudnnStatus_t s;
  if (d == kFwd) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    s = heuristics ? cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, conv, y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf)
                   : cudnnFindConvolutionForwardAlgorithm(h, x, w, conv, y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf);
    out = found_of(perf, s == CUDNN_STATUS_SUCCESS ? n : 0);
  } else if (d == kBwdData) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    s = heuristics ? cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w, y, conv, x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                                                 &n, perf)
                   : cudnnFindConvolutionBackwardDataAlgorithm(h, w, y, conv, x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                                               &n, perf);
    out = found_of(perf, s == CUDNN_STATUS_SUCCESS ? n : 0);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    s = heuristics ? cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x, y, conv, w,
                                                                   CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf)
                   : cudnnFindConvolutionBackwardFilterAlgorithm(h, x, y, conv, w,
                                                                 CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf);
    out = found_of(perf, s == CUDNN_STATUS_SUCCESS ? n : 0);
  }
  return s;
}
}  // namespace

// Every usable algorithm of direction d within the workspace limit, fastest first;
// empty when cuDNN has none for this type and layout (the caller falls back).
std::vector<CudaBackend::ConvChoice> CudaBackend::search(ConvPlan& p, int d, const char* op) {
  // Search with the precision's own math type: the descriptor still carries the
  // math type the previous direction's chosen algorithm set.
  RD_CUDNN(cudnnSetConvolutionMathType(p.conv, wanted_conv_math()));
  ++conv_searches_;
  std::vector<Found> found;
  cudnnStatus_t s = query_algorithms(cudnn_, p.x, p.w, p.conv, p.y, d, cudnn_heuristics_, found);
  if (!cudnn_heuristics_ && find_out_of_memory(s, found)) {
    // cudnnFind allocates its own buffers: give the workspace back and retry once
    // (as allocate() does); still out of memory, the heuristics allocate nothing.
    const bool freed = release_workspace_for_oom();
    if (freed) s = query_algorithms(cudnn_, p.x, p.w, p.conv, p.y, d, false, found);
    if (find_out_of_memory(s, found)) s = query_algorithms(cudnn_, p.x, p.w, p.conv, p.y, d, true, found);
  }
  // A cudaMalloc that failed inside cudnnFind leaves its (non-sticky) error as the last
  // one, where the next kernel launch's check would report it as its own.
  if (cudaPeekAtLastError() == cudaErrorMemoryAllocation) cudaGetLastError();
  // NOT_SUPPORTED: no algorithm at all for this data type and layout (e.g. bf16 NHWC
  // with 3 channels on some GPUs): an empty list, the caller runs the fallback.
  if (s != CUDNN_STATUS_SUCCESS && s != CUDNN_STATUS_NOT_SUPPORTED) {
    const std::string call = std::string(op) + ": " + (cudnn_heuristics_ ? "cudnnGet" : "cudnnFind") +
                             "Convolution" + (d == kFwd ? "Forward" : d == kBwdData ? "BackwardData" : "BackwardFilter") +
                             "Algorithm";
    fail_cudnn(s, call.c_str(), __FILE__, __LINE__);
  }
  const size_t limit = find_workspace_limit();
  std::vector<ConvChoice> out;
  for (const Found& f : found) {
    if (f.status != CUDNN_STATUS_SUCCESS) continue;
    // FP32 never takes a TF32 variant: its math type is FMA (PyTorch does the same
    // when allow_tf32 is off). Find also reports DEFAULT (TF32) math entries, whose
    // workspace is the TF32 kernel's: the FMA kernel of that algorithm may need
    // more, so its size is asked again for the math that will run, and
    // an algorithm without an FMA kernel is dropped. The heuristics' sizes are
    // asked likewise (their memory field is not a measured requirement).
    ConvChoice c{f.algo, precision_ == Precision::FP32 ? CUDNN_FMA_MATH : f.math, f.memory, f.time};
    if (c.math != f.math || cudnn_heuristics_) {
      size_t ws = 0;
      if (workspace_size(p, d, c.algo, c.math, ws) != CUDNN_STATUS_SUCCESS) continue;
      c.ws = ws;
    }
    if (c.ws > limit) continue;
    const bool seen = std::any_of(out.begin(), out.end(),
                                  [&](const ConvChoice& o) { return o.algo == c.algo && o.math == c.math; });
    if (!seen) out.push_back(c);
  }
  // Find's times of relabelled entries are TF32 times (Note [fp32 algorithms re-timed]).
  const bool retime = precision_ == Precision::FP32 && !cudnn_heuristics_ && out.size() > 1;
  if (retime) retime_candidates(p, d, out);
  if (conv_report_)
    report_plan(p, d, out, retime ? "re-timed with CUDA events" : cudnn_heuristics_ ? "heuristics" : "cudnnFind");
  return out;
}

namespace {
const char* conv_call_name(int d) {
  return d == kFwd ? "cudnnConvolutionForward" : d == kBwdData ? "cudnnConvolutionBackwardData"
                                                               : "cudnnConvolutionBackwardFilter";
}
const char* conv_dir_name(int d) { return d == kFwd ? "forward" : d == kBwdData ? "backward-data" : "backward-filter"; }
// cuDNN's legacy enum names (cudnn_cnn.h), without their common prefix.
const char* conv_algo_name(int d, int algo) {
  static const char* const fwd[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                    "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char* const bwd_data[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char* const bwd_filter[] = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED",
                                           "FFT_TILING"};
  if (algo < 0) return "?";
  if (d == kFwd) return algo < 8 ? fwd[algo] : "?";
  if (d == kBwdData) return algo < 6 ? bwd_data[algo] : "?";
  return algo < 7 ? bwd_filter[algo] : "?";
}
const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH: return "DEFAULT";
    case CUDNN_TENSOR_OP_MATH: return "TENSOR_OP";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "TENSOR_OP_ALLOW_CONVERSION";
    case CUDNN_FMA_MATH: return "FMA";
  }
  return "?";
}
}  // namespace

// Direction d of plan p with algorithm c; operands as run_conv's.
cudnnStatus_t CudaBackend::launch_conv(ConvPlan& p, int d, const ConvChoice& c, const void* a, const void* b,
                                       void* out, float beta, void* ws) {
  const float alpha = 1.f;
  RD_CUDNN(cudnnSetConvolutionMathType(p.conv, c.math));
  if (d == kFwd)
    return cudnnConvolutionForward(cudnn_, &alpha, p.x, a, p.w, b, p.conv,
                                   static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), ws, c.ws, &beta, p.y, out);
  if (d == kBwdData)
    return cudnnConvolutionBackwardData(cudnn_, &alpha, p.w, a, p.y, b, p.conv,
                                        static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), ws, c.ws, &beta, p.x, out);
  return cudnnConvolutionBackwardFilter(cudnn_, &alpha, p.x, a, p.y, b, p.conv,
                                        static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), ws, c.ws, &beta, p.w,
                                        out);
}

// Note [fp32 algorithms re-timed]
// cudnnFind measures each algorithm with the math type it picks: on Ampere+ that may be
// TF32, so in fp32 (FMA math) its order ranks FMA kernels by their TF32 times. Each FMA
// candidate is therefore run and timed again with CUDA events, once per plan and
// direction (one untimed run for lazy loading, then one timed, as PyTorch's benchmark
// mode times each algorithm once), and the list sorted by those times. The operands are zeroed scratch buffers freed afterwards (planning
// happens before the epoch's timer).
void CudaBackend::retime_candidates(ConvPlan& p, int d, std::vector<ConvChoice>& list) {
  constexpr int kTimedRuns = 1;
  const size_t elem = dtype_size(p.dtype);
  const size_t xb = static_cast<size_t>(p.x_count) * elem, yb = static_cast<size_t>(p.y_count) * elem,
               wb = static_cast<size_t>(p.w_count) * elem;
  void* x = timing_x_.get(xb, "convolution timing input");
  void* y = timing_y_.get(yb, "convolution timing output");
  void* w = timing_w_.get(wb, "convolution timing filter");
  RD_CUDA(cudaMemsetAsync(x, 0, xb, compute_));
  RD_CUDA(cudaMemsetAsync(y, 0, yb, compute_));
  RD_CUDA(cudaMemsetAsync(w, 0, wb, compute_));
  if (!timing_start_) {
    RD_CUDA(cudaEventCreate(&timing_start_));
    RD_CUDA(cudaEventCreate(&timing_stop_));
  }
  const void* a = d == kBwdData ? w : x;
  const void* b = d == kFwd ? w : y;
  void* out = d == kFwd ? y : d == kBwdData ? x : w;
  for (auto it = list.begin(); it != list.end();) {
    void* ws = it->ws ? workspace_.try_get(it->ws) : nullptr;
    cudnnStatus_t s = it->ws && !ws ? CUDNN_STATUS_ALLOC_FAILED : launch_conv(p, d, *it, a, b, out, 0.f, ws);
    if (s == CUDNN_STATUS_SUCCESS) {
      RD_CUDA(cudaEventRecord(timing_start_, compute_));
      for (int r = 0; r < kTimedRuns && s == CUDNN_STATUS_SUCCESS; ++r) s = launch_conv(p, d, *it, a, b, out, 0.f, ws);
      RD_CUDA(cudaEventRecord(timing_stop_, compute_));
      RD_CUDA(cudaEventSynchronize(timing_stop_));
      float ms = 0.f;
      RD_CUDA(cudaEventElapsedTime(&ms, timing_start_, timing_stop_));
      it->ms = ms / kTimedRuns;
    }
    if (s == CUDNN_STATUS_ALLOC_FAILED) {
      it->ms = -1.f;  // not timed: kept last, affordable() may still drop it
      ++it;
      continue;
    }
    if (s != CUDNN_STATUS_SUCCESS) {
      if (s != CUDNN_STATUS_NOT_SUPPORTED) fail_cudnn(s, conv_call_name(d), __FILE__, __LINE__);
      it = list.erase(it);  // refuses the shape after all
      continue;
    }
    ++it;
  }
  std::stable_sort(list.begin(), list.end(), [](const ConvChoice& l, const ConvChoice& r) {
    return (l.ms >= 0.f) != (r.ms >= 0.f) ? l.ms >= 0.f : l.ms < r.ms;
  });
  for (Scratch* s : {&timing_x_, &timing_y_, &timing_w_}) s->release();
}

// RD_CONV_REPORT=1: one line per plan and direction, on stderr, when it is searched.
void CudaBackend::report_plan(const ConvPlan& p, int d, const std::vector<ConvChoice>& list, const char* how) const {
  char head[320];
  std::snprintf(head, sizeof head,
                "resnet_ddp: conv plan cuda:%d %s x[%lld, %lld, %lld, %lld] w[%lld, %lld, %lld, %lld] stride %d pad %d "
                "groups %d %s %s",
                device_, conv_dir_name(d), static_cast<long long>(p.key.n), static_cast<long long>(p.key.c),
                static_cast<long long>(p.key.h), static_cast<long long>(p.key.w), static_cast<long long>(p.key.o),
                static_cast<long long>(p.key.c / p.key.groups), static_cast<long long>(p.key.kh),
                static_cast<long long>(p.key.kw), p.key.stride, p.key.pad, p.key.groups, dtype_name(p.dtype),
                p.key.nhwc ? "NHWC" : "NCHW");
  if (list.empty()) {
    std::fprintf(stderr, "%s: no algorithm (runs in f32 NCHW)\n", head);
    return;
  }
  const ConvChoice& c = list.front();
  char time[64];
  if (c.ms >= 0.f)
    std::snprintf(time, sizeof time, "%.4f ms", static_cast<double>(c.ms));
  else
    std::snprintf(time, sizeof time, "not measured");
  std::fprintf(stderr, "%s: algo %s (%d) math %s workspace %s time %s (%s, %zu candidates)\n", head,
               conv_algo_name(d, c.algo), c.algo, math_name(c.math), mib(c.ws).c_str(), time, how, list.size());
}

// Runs direction d of plan p with its fastest affordable algorithm:
//   forward:         out (y)  = conv(a = x, b = w)
//   backward data:   out (dx) = conv^T(a = w, b = dy)
//   backward filter: out (dw) = corr(a = x, b = dy)        (+ beta * out)
// False when cuDNN has no algorithm for it (nothing ran): the caller falls back.
bool CudaBackend::run_conv(ConvPlan& p, int d, const void* a, const void* b, void* out, float beta, const char* op) {
  ConvPlan::Dir& dir = p.dir[d];
  if (!dir.searched) {
    dir.choices = search(p, d, op);
    dir.searched = true;
  }
  while (!dir.choices.empty()) {
    void* ws = nullptr;
    const ConvChoice c = affordable(dir.choices, ws, op);
    const cudnnStatus_t s = launch_conv(p, d, c, a, b, out, beta, ws);
    if (s == CUDNN_STATUS_SUCCESS) return true;
    if (s != CUDNN_STATUS_NOT_SUPPORTED) fail_cudnn(s, conv_call_name(d), __FILE__, __LINE__);
    // The heuristics may offer an algorithm that then refuses the shape: the next one.
    dir.choices.erase(dir.choices.begin());
  }
  return false;
}

// The fallback when cuDNN has no algorithm for a convolution in the activation
// type and layout (fp16/bf16 NHWC with C or K not a multiple of 8, e.g. the stem's
// C = 3, may have none on some GPUs): run it in f32 NCHW. The existing layout
// kernels convert the operands in and the result out, the f32 OIHW master weights
// (and weight gradients) are used as they are, and f32 NCHW always has an
// algorithm (IMPLICIT_GEMM). Chosen over padding C to 8, which would need padded
// activations and weight copies per layer; here only the few layers without an
// algorithm pay the conversions. The math stays the precision's (TF32 tensor
// cores for fp16/bf16 runs: at least as precise as the reduced-precision storage).
CudaBackend::ConvPlan& CudaBackend::f32_nchw_plan(const kern::ActDesc& x, const Shape& w, const ConvGeometry& g,
                                                  const char* op) {
  RD_CHECK(x.nhwc || x.dtype != DType::F32,
           op << ": cuDNN found no algorithm for input " << dims(x) << " weight " << w.str());
  kern::ActDesc f = x;
  f.nhwc = false;
  f.dtype = DType::F32;
  return plan_shape(f, w, g, op);
}

void CudaBackend::plan_convolution(const Shape& x, const Shape& w, const ConvGeometry& g, bool backward_data,
                                   bool backward_weights) {
  const char* op = "plan_convolution";
  RD_CHECK(x.rank == 4, op << ": input shape " << x.str() << " is not (N, C, H, W)");
  kern::ActDesc xd;
  xd.n = x[0], xd.c = x[1], xd.h = x[2], xd.w = x[3];
  // The 3-channel input of a blocked layout is NCHW (Backend::layout_for_channels).
  xd.nhwc = layout_for_channels(xd.c) == Layout::NHWC;
  xd.dtype = act_dtype_;
  ConvPlan& p = plan_shape(xd, w, g, op);
  for (int d : {int{kFwd}, int{kBwdData}, int{kBwdFilter}}) {
    if ((d == kBwdData && !backward_data) || (d == kBwdFilter && !backward_weights)) continue;
    ConvPlan::Dir& dir = p.dir[d];
    if (dir.searched || dir.nchw_f32) continue;
    dir.choices = search(p, d, op);
    dir.searched = true;
    if (!dir.choices.empty()) continue;
    // As the op would: this direction runs in f32 NCHW, so that plan is the one to search.
    note_fallback(p, d, xd, w, op);
    ConvPlan& fp = f32_nchw_plan(xd, w, g, op);
    if (!fp.dir[d].searched) {
      fp.dir[d].choices = search(fp, d, op);
      fp.dir[d].searched = true;
    }
  }
}

void CudaBackend::note_fallback(ConvPlan& p, int d, const kern::ActDesc& x, const Shape& w, const char* op) {
  p.dir[d].nchw_f32 = true;
  ++fallbacks_;
  std::fprintf(stderr, "resnet_ddp: %s: cuDNN has no %s %s algorithm for input %s weight %s; running it in f32 NCHW\n",
               op, dtype_name(x.dtype), x.nhwc ? "NHWC" : "NCHW", dims(x).c_str(), w.str().c_str());
}

void CudaBackend::conv2d_forward_impl(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g) {
  const char* op = "conv2d_forward";
  const kern::ActDesc xd = act(x, op, "x"), yd = act(y, op, "y");
  ConvPlan& p = plan(xd, w, g, op);
  RD_CHECK(yd.n == xd.n && yd.c == w.shape[0] && yd.h == p.yh && yd.w == p.yw,
           "conv2d_forward: y is " << dims(yd) << ", expected [" << xd.n << ", " << w.shape[0] << ", "
                                   << p.yh << ", " << p.yw << "]");
  if (!p.dir[kFwd].nchw_f32) {
    const void* wp = staged_weight(w);
    if (run_conv(p, kFwd, x.data, wp, y.data, 0.f, op)) return;
    note_fallback(p, kFwd, xd, w.shape, op);
  }
  // Buffers before the plan runs: an out-of-memory retry in get() frees the workspace.
  float* x32 = fallback_in_.as<float>(static_cast<size_t>(xd.count()), "f32 NCHW convolution input");
  float* y32 = fallback_out_.as<float>(static_cast<size_t>(yd.count()), "f32 NCHW convolution output");
  ConvPlan& f = f32_nchw_plan(xd, w.shape, g, op);
  kern::act_to_nchw_f32(xd, x.data, x32, compute_);
  RD_CHECK(run_conv(f, kFwd, x32, w.f32(), y32, 0.f, op),
           op << ": cuDNN found no algorithm for input " << dims(xd) << " weight " << w.shape.str());
  kern::nchw_f32_to_act(y32, yd, y.data, compute_);
}

void CudaBackend::conv2d_backward_data_impl(const Tensor& dy, const Tensor& w, Tensor& dx,
                                       const ConvGeometry& g) {
  const char* op = "conv2d_backward_data";
  const kern::ActDesc dyd = act(dy, op, "dy");
  const kern::ActDesc dxd = act(dx, op, "dx");
  ConvPlan& p = plan(dxd, w, g, op);
  RD_CHECK(dyd.n == dxd.n && dyd.c == w.shape[0] && dyd.h == p.yh && dyd.w == p.yw,
           "conv2d_backward_data: dy is " << dims(dyd) << ", expected [" << dxd.n << ", "
                                          << w.shape[0] << ", " << p.yh << ", " << p.yw << "]");
  if (!p.dir[kBwdData].nchw_f32) {
    const void* wp = staged_weight(w);
    if (run_conv(p, kBwdData, wp, dy.data, dx.data, 0.f, op)) return;
    note_fallback(p, kBwdData, dxd, w.shape, op);
  }
  float* dy32 = fallback_in_.as<float>(static_cast<size_t>(dyd.count()), "f32 NCHW convolution gradient");
  float* dx32 = fallback_out_.as<float>(static_cast<size_t>(dxd.count()), "f32 NCHW convolution input gradient");
  ConvPlan& f = f32_nchw_plan(dxd, w.shape, g, op);
  kern::act_to_nchw_f32(dyd, dy.data, dy32, compute_);
  RD_CHECK(run_conv(f, kBwdData, w.f32(), dy32, dx32, 0.f, op),
           op << ": cuDNN found no algorithm for dx " << dims(dxd) << " weight " << w.shape.str());
  kern::nchw_f32_to_act(dx32, dxd, dx.data, compute_);
}

void CudaBackend::conv2d_backward_weights_impl(const Tensor& x, const Tensor& dy, Tensor& dw,
                                          const ConvGeometry& g, bool accumulate) {
  const char* op = "conv2d_backward_weights";
  const kern::ActDesc xd = act(x, op, "x");
  const kern::ActDesc dyd = act(dy, op, "dy");
  ConvPlan& p = plan(xd, dw, g, op);
  RD_CHECK(dyd.n == xd.n && dyd.c == dw.shape[0] && dyd.h == p.yh && dyd.w == p.yw,
           "conv2d_backward_weights: dy is " << dims(dyd) << ", expected [" << xd.n << ", "
                                             << dw.shape[0] << ", " << p.yh << ", " << p.yw << "]");
  const float beta = accumulate ? 1.f : 0.f;
  if (!p.dir[kBwdFilter].nchw_f32) {
    if (!stages_weights()) {
      if (run_conv(p, kBwdFilter, x.data, dy.data, dw.data, beta, op)) return;
    } else {
      // Gradient in the staged layout/type first, then back to the f32 OIHW arena.
      // Taken before the workspace: an out-of-memory retry in get() frees the workspace.
      void* tmp = staged_grad_.get(static_cast<size_t>(dw.numel()) * dtype_size(act_dtype_),
                                   "staged conv weight gradient");
      if (run_conv(p, kBwdFilter, x.data, dy.data, tmp, 0.f, op)) {
        kern::unstage_conv_weight_grad(tmp, dw.shape[0], dw.shape[1], dw.shape[2], dw.shape[3],
                                       layout_ == Layout::NHWC, act_dtype_, dw.f32(), accumulate, compute_);
        return;
      }
    }
    note_fallback(p, kBwdFilter, xd, dw.shape, op);
  }
  float* x32 = fallback_in_.as<float>(static_cast<size_t>(xd.count()), "f32 NCHW convolution input");
  float* dy32 = fallback_out_.as<float>(static_cast<size_t>(dyd.count()), "f32 NCHW convolution gradient");
  ConvPlan& f = f32_nchw_plan(xd, dw.shape, g, op);
  kern::act_to_nchw_f32(xd, x.data, x32, compute_);
  kern::act_to_nchw_f32(dyd, dy.data, dy32, compute_);
  // The f32 NCHW filter is the OIHW gradient arena itself: accumulate through beta.
  RD_CHECK(run_conv(f, kBwdFilter, x32, dy32, dw.data, beta, op),
           op << ": cuDNN found no algorithm for x " << dims(xd) << " dw " << dw.shape.str());
}

}  // namespace rd::cuda
