#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/conv_plan.h"
#include "resnet_ddp/errors.h"

namespace rd::cuda {

// ---- error reporting ------------------------------------------------------------

namespace {

std::string where(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return std::string(" (") + (base ? base + 1 : file) + ":" + std::to_string(line) + ")";
}

}  // namespace

void fail_cuda(cudaError_t e, const char* call, const char* file, int line) {
  cudaGetLastError();  // clear a sticky non-fatal error so later calls report their own
  throw Error(std::string("CUDA call ") + call + " failed: " + cudaGetErrorName(e) + " (" +
              cudaGetErrorString(e) + ")" + where(file, line));
}

void fail_cudnn(cudnnStatus_t s, const char* call, const char* file, int line) {
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  throw Error(std::string("cuDNN call ") + call + " failed: " + cudnnGetErrorString(s) +
              (detail[0] ? std::string(" [") + detail + "]" : std::string()) + where(file, line));
}

void fail_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  throw Error(std::string("cuBLAS call ") + call + " failed: " + cublasGetStatusName(s) + " (" +
              cublasGetStatusString(s) + ")" + where(file, line));
}

void fail_oom(size_t asked, const char* what, const char* file, int line) {
  cudaGetLastError();
  size_t free_b = 0, total_b = 0;
  int dev = -1;
  cudaGetDevice(&dev);
  std::string mem = "free memory unknown";
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
    mem = "free " + mib(free_b) + " of " + mib(total_b);
  throw Error(std::string("CUDA out of memory allocating ") + what + ": asked " + mib(asked) + ", " +
              mem + " on device " + std::to_string(dev) + where(file, line));
}

namespace {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::FP32: return "fp32";
    case Precision::TF32: return "tf32";
    case Precision::FP16: return "fp16";
    case Precision::BF16: return "bf16";
  }
  return "?";
}

}  // namespace

// ---- construction -----------------------------------------------------------------------

CudaBackend::CudaBackend(const BackendOptions& opts)
    : device_(opts.device_index),
      collective_timeout_s_(opts.collective_timeout_s > 0 ? opts.collective_timeout_s : 600.0),
      precision_(opts.precision),
      layout_(opts.layout.value_or(Layout::NHWC)),
      upload_sources_(std::make_shared<UploadSources>()) {
  const int count = cuda_device_count();
  if (count == 0) {
    int dummy = 0;
    const cudaError_t e = cudaGetDeviceCount(&dummy);
    cudaGetLastError();
    throw Error(std::string("CUDA backend: no CUDA device visible (cudaGetDeviceCount: ") +
                cudaGetErrorString(e) + ")");
  }
  if (device_ < 0 || device_ >= count)
    throw UsageError("CUDA backend: device index " + std::to_string(device_) + " out of range (" +
                     std::to_string(count) + " devices visible)");
  if (layout_ != Layout::NHWC && layout_ != Layout::NCHW)
    throw UsageError(std::string("CUDA backend: layout ") + layout_name(layout_) +
                     " is not supported (use NHWC or NCHW)");
  RD_CUDA(cudaSetDevice(device_));
  RD_CUDA(cudaGetDeviceProperties(&props_, device_));
  if (precision_ == Precision::BF16 && props_.major < 8)
    throw UsageError(std::string("CUDA backend: bf16 needs compute capability 8.0+, ") + props_.name +
                     " is " + std::to_string(props_.major) + "." + std::to_string(props_.minor) +
                     " (use fp16)");
  act_dtype_ = precision_ == Precision::FP16   ? DType::F16
               : precision_ == Precision::BF16 ? DType::BF16
                                               : DType::F32;
  RD_CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  RD_CUDA(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  for (Upload& u : uploads_) {
    RD_CUDA(cudaEventCreateWithFlags(&u.ready, cudaEventDisableTiming));
    RD_CUDA(cudaEventCreateWithFlags(&u.consumed, cudaEventDisableTiming));
  }
  RD_CUDNN(cudnnCreate(&cudnn_));
  RD_CUDNN(cudnnSetStream(cudnn_, compute_));
  RD_CUBLAS(cublasCreate(&cublas_));
  RD_CUBLAS(cublasSetStream(cublas_, compute_));
  RD_CUBLAS(cublasSetMathMode(cublas_, precision_ == Precision::FP32 ? CUBLAS_DEFAULT_MATH
                                                                     : CUBLAS_TF32_TENSOR_OP_MATH));
  for (Scratch* buf : scratch_buffers()) {
    buf->bind(collective_timeout_s_, compute_);
    if (buf != &workspace_) buf->on_oom([this] { return release_workspace_for_oom(); });
  }
  for (Upload& u : uploads_) {
    u.device.bind(collective_timeout_s_, compute_, copy_);  // written by the copy stream, read by compute
    u.pinned.bind(collective_timeout_s_, copy_);
  }
  // Under compute-sanitizer cudnnFind (every algorithm, each run instrumented) takes
  // minutes: tools/gpu_check.sh's memcheck step sets RD_CUDNN_HEURISTICS=1.
  const char* heur = std::getenv("RD_CUDNN_HEURISTICS");
  cudnn_heuristics_ = heur && std::strcmp(heur, "1") == 0;
  const char* report = std::getenv("RD_CONV_REPORT");
  conv_report_ = report && std::strcmp(report, "1") == 0;
}

std::vector<Scratch*> CudaBackend::scratch_buffers() {
  return {&workspace_, &staged_grad_, &bn_sums_, &bn_packed_, &bn_scale_shift_, &bn_means_, &nchw_scratch_,
          &fallback_in_, &fallback_out_, &uploads_[0].device, &uploads_[0].pinned, &uploads_[1].device,
          &uploads_[1].pinned, &labels_device_, &row_loss_device_,
          &argmax_device_, &loss_host_, &flag_device_, &flag_host_, &norm_table_device_, &norm_table_host_,
          &step_table_device_, &step_table_host_, &partials_device_, &partials_host_, &erase_boxes_,
          &timing_x_, &timing_y_, &timing_w_, &sum_labels_device_, &graph_labels_device_, &label_slots_[0].pinned,
          &label_slots_[1].pinned, &label_slots_[2].pinned, &label_slots_[3].pinned, &queued_pinned_};
}

CudaBackend::~CudaBackend() {
  // Bounded, see Note [Bounded teardown waits] (cuda_backend.h): the watchdog or the
  // caller's error path ends the process.
  if (recording_) {  // an error left a capture open: end it, or the stream refuses every wait
    cudaGraph_t unfinished = nullptr;
    if (cudaStreamEndCapture(compute_, &unfinished) == cudaSuccess && unfinished) cudaGraphDestroy(unfinished);
    cudaGetLastError();
    recording_ = nullptr;
  }
  const bool idle = wait_stream_bounded(compute_, collective_timeout_s_) &&
                    wait_stream_bounded(copy_, collective_timeout_s_);
  if (!idle) {
    std::fprintf(stderr, "resnet_ddp: CUDA device %d still busy at shutdown; not waiting any longer\n", device_);
    // Leak handles and buffers rather than block in their destruction.
    for (Scratch* buf : scratch_buffers()) buf->abandon();
    for (auto& entry : staged_weights_) entry.second.buffer->abandon();
    return;
  }
  // Buffers first: Scratch::release queries the streams it is bound to, so it must
  // run while they exist (members are destroyed only after this body).
  drop_all_graphs();
  staged_weights_.clear();
  for (Scratch* buf : scratch_buffers()) buf->release();
  plans_.clear();
  if (cublas_) cublasDestroy(cublas_);
  if (cudnn_) cudnnDestroy(cudnn_);
  for (Upload& u : uploads_) {
    if (u.ready) cudaEventDestroy(u.ready);
    if (u.consumed) cudaEventDestroy(u.consumed);
  }
  if (timing_start_) cudaEventDestroy(timing_start_);
  if (timing_stop_) cudaEventDestroy(timing_stop_);
  if (queued_done_) cudaEventDestroy(queued_done_);
  for (cudaEvent_t ev : timing_marks_)
    if (ev) cudaEventDestroy(ev);
  for (LabelSlot& slot : label_slots_)
    if (slot.uploaded) cudaEventDestroy(slot.uploaded);
  if (copy_) cudaStreamDestroy(copy_);
  if (compute_) cudaStreamDestroy(compute_);
}

std::string CudaBackend::name() const {
  const size_t v = cudnnGetVersion();
  std::ostringstream os;
  // The PCI address tells GPUs apart when each rank sees one as cuda:0 (--gpus-per-task=1).
  char pci[32];
  std::snprintf(pci, sizeof pci, "PCI %04x:%02x:%02x", props_.pciDomainID, props_.pciBusID, props_.pciDeviceID);
  os << "cuda:" << device_ << " (" << props_.name << ", " << pci << ", cc " << props_.major << "." << props_.minor << ", cuDNN "
     << v / 10000 << "." << (v % 10000) / 100 << "." << v % 100 << ", " << precision_name(precision_)
     << ", " << layout_name(layout_) << ")";
  return os.str();
}

// ---- argument checks ----------------------------------------------------------------------

kern::ActDesc CudaBackend::act(const Tensor& t, const char* op, const char* role) const {
  RD_CHECK(t.device == DeviceKind::CUDA && t.shape.rank == 4 && t.layout == layout_ &&
               t.dtype == act_dtype_ && (t.data || t.numel() == 0),
           op << ": " << role << " must be a " << dtype_name(act_dtype_) << " " << layout_name(layout_)
              << " CUDA activation, got " << t.describe());
  kern::ActDesc d;
  d.n = t.shape[0], d.c = t.shape[1], d.h = t.shape[2], d.w = t.shape[3];
  d.nhwc = layout_ == Layout::NHWC;
  d.dtype = t.dtype;
  return d;
}

void CudaBackend::check_matrix(const Tensor& t, int64_t rows, int64_t cols, const char* op,
                               const char* role) const {
  RD_CHECK(t.device == DeviceKind::CUDA && t.dtype == DType::F32 && t.shape.rank == 2 &&
               (t.data || t.numel() == 0),
           op << ": " << role << " must be a f32 CUDA matrix, got " << t.describe());
  RD_CHECK((rows < 0 || t.shape[0] == rows) && (cols < 0 || t.shape[1] == cols),
           op << ": " << role << " is " << t.shape.str() << ", expected [" << rows << ", " << cols
              << "]");
}

namespace {
bool same_dims(const kern::ActDesc& a, const kern::ActDesc& b) {
  return a.n == b.n && a.c == b.c && a.h == b.h && a.w == b.w;
}
}  // namespace

// ---- memory ---------------------------------------------------------------------------------

std::shared_ptr<void> CudaBackend::allocate(size_t bytes) {
  const size_t want = std::max<size_t>(bytes, 256);
  ++weights_version_;  // a new buffer may reuse a freed weight's address
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, want);
  // The convolution workspace was sized while memory was free, so it may hold what
  // a later tensor needs: give it back and retry; convolutions then fall back to algorithms whose workspace still
  // fits (affordable).
  if (e == cudaErrorMemoryAllocation && release_workspace_for_oom()) e = cudaMalloc(&p, want);
  if (e == cudaErrorMemoryAllocation) fail_oom(want, "a tensor", __FILE__, __LINE__);
  if (e != cudaSuccess) fail_cuda(e, "cudaMalloc", __FILE__, __LINE__);
  RD_CUDA(cudaMemsetAsync(p, 0, want, compute_));
  count_memory_event();
  // cudaFree waits for the device, so memory still used by queued work is safe.
  return std::shared_ptr<void>(p, [](void* q) {
    cudaFree(q);
    count_memory_event();
  });
}

void CudaBackend::copy_from_host(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  ++weights_version_;  // may be a weight: staged copies are stale
  RD_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, compute_));
  // Pageable sources are staged before cudaMemcpyAsync returns, but a pinned
  // source would be read later: wait so the caller may reuse `src` at once.
  RD_CUDA(cudaStreamSynchronize(compute_));
}

void CudaBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  RD_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, compute_));
  RD_CUDA(cudaStreamSynchronize(compute_));
}

void CudaBackend::fill(float* dst, float value, size_t count) {
  ++weights_version_;  // may be a weight: staged copies are stale
  kern::fill_f32(dst, value, count, compute_);
}

void CudaBackend::copy_from_host_nchw_impl(const float* src, Tensor& dst) {
  const kern::ActDesc d = act(dst, "copy_from_host_nchw", "destination");
  const size_t bytes = static_cast<size_t>(d.count()) * sizeof(float);
  if (!d.nhwc && d.dtype == DType::F32) return copy_from_host(dst.data, src, bytes);
  float* tmp = nchw_scratch_.as<float>(static_cast<size_t>(d.count()), "NCHW staging");
  RD_CUDA(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyHostToDevice, compute_));
  kern::nchw_f32_to_act(tmp, d, dst.data, compute_);
  RD_CUDA(cudaStreamSynchronize(compute_));
}

void CudaBackend::copy_to_host_nchw_impl(const Tensor& src, float* dst) {
  const kern::ActDesc d = act(src, "copy_to_host_nchw", "source");
  const size_t bytes = static_cast<size_t>(d.count()) * sizeof(float);
  if (!d.nhwc && d.dtype == DType::F32) return copy_to_host(dst, src.data, bytes);
  float* tmp = nchw_scratch_.as<float>(static_cast<size_t>(d.count()), "NCHW staging");
  kern::act_to_nchw_f32(d, src.data, tmp, compute_);
  copy_to_host(dst, tmp, bytes);
}

struct CudaBackend::UploadSources {
  std::mutex mu;
  std::map<const char*, size_t> blocks;
};

std::shared_ptr<void> CudaBackend::allocate_upload_source(size_t bytes) {
  const size_t want = std::max<size_t>(bytes, 256);
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, want);
  if (e == cudaErrorMemoryAllocation) fail_oom(want, "a pinned loader batch slot", __FILE__, __LINE__);
  if (e != cudaSuccess) fail_cuda(e, "cudaMallocHost", __FILE__, __LINE__);
  {
    std::lock_guard<std::mutex> lock(upload_sources_->mu);
    upload_sources_->blocks[static_cast<const char*>(p)] = want;
  }
  // cudaFreeHost waits for the device, so a copy still reading the block finishes first.
  return std::shared_ptr<void>(p, [sources = upload_sources_](void* q) {
    {
      std::lock_guard<std::mutex> lock(sources->mu);
      sources->blocks.erase(static_cast<const char*>(q));
    }
    cudaFreeHost(q);
  });
}

bool CudaBackend::is_upload_source(const void* p, size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(upload_sources_->mu);
  auto it = upload_sources_->blocks.upper_bound(c);
  if (it == upload_sources_->blocks.begin()) return false;
  --it;
  return c >= it->first && c + bytes <= it->first + it->second;
}

namespace {
// Waits for `e` only if it has not completed: a completed event costs a query, not a wait.
void wait_event_if_pending(cudaEvent_t e) {
  const cudaError_t q = cudaEventQuery(e);
  if (q == cudaSuccess) return;
  if (q != cudaErrorNotReady) fail_cuda(q, "cudaEventQuery", __FILE__, __LINE__);
  RD_CUDA(cudaEventSynchronize(e));
}
}  // namespace

void CudaBackend::wait_upload_source(const void* host) {
  for (Upload& u : uploads_)
    if (host && u.source == host) {
      wait_event_if_pending(u.ready);
      u.source = nullptr;
    }
}

void CudaBackend::images_u8_to_activation_impl(const uint8_t* src, Tensor& dst, const float* mean,
                                          const float* std) {
  const kern::ActDesc d = act(dst, "images_u8_to_activation", "destination");
  const float zero[3] = {0.f, 0.f, 0.f}, one[3] = {1.f, 1.f, 1.f};
  const size_t bytes = static_cast<size_t>(d.count());
  if (!bytes) return;
  Upload& u = uploads_[next_upload_];
  next_upload_ ^= 1;
  void* dev = u.device.get(bytes, "uint8 image batch");
  const void* from = src;
  // An upload source nobody waited for: its copy (two uploads ago) must end before
  // the record below forgets it.
  if (u.source) wait_event_if_pending(u.ready);
  u.source = nullptr;
  if (is_upload_source(src, bytes)) {
    u.source = src;  // the caller waits for it (wait_upload_source) before overwriting it
  } else {
    // A plain host batch: staged through this buffer's pinned copy, which the copy of
    // two uploads ago may still read.
    wait_event_if_pending(u.ready);
    void* pinned = u.pinned.get(bytes, "pinned uint8 image batch");
    std::memcpy(pinned, src, bytes);
    from = pinned;
  }
  // The device buffer's previous batch (two uploads ago) must have been converted;
  // the copy stream waits for that, the host does not.
  RD_CUDA(cudaStreamWaitEvent(copy_, u.consumed, 0));
  RD_CUDA(cudaMemcpyAsync(dev, from, bytes, cudaMemcpyHostToDevice, copy_));
  RD_CUDA(cudaEventRecord(u.ready, copy_));
  RD_CUDA(cudaStreamWaitEvent(compute_, u.ready, 0));
  kern::images_u8_to_act(static_cast<const uint8_t*>(dev), d, dst.data, mean ? mean : zero,
                         std ? std : one, compute_);
  RD_CUDA(cudaEventRecord(u.consumed, compute_));
}

void CudaBackend::erase_rectangles_impl(Tensor& x, const int32_t* boxes) {
  const kern::ActDesc d = act(x, "erase_rectangles", "tensor");
  if (!d.count()) return;
  const size_t bytes = static_cast<size_t>(d.n) * 4 * sizeof(int32_t);
  int32_t* dev = erase_boxes_.as<int32_t>(static_cast<size_t>(d.n) * 4, "erase boxes");
  // From pageable memory: the call returns once `boxes` is staged, so the caller may reuse it.
  RD_CUDA(cudaMemcpyAsync(dev, boxes, bytes, cudaMemcpyHostToDevice, compute_));
  kern::erase_rectangles(d, x.data, dev, compute_);
}

void CudaBackend::synchronize() {
  RD_CUDA(cudaStreamSynchronize(copy_));
  RD_CUDA(cudaStreamSynchronize(compute_));
}

void CudaBackend::copy_to_host_queued(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  // The pinned area may grow only while no copy into it is in flight.
  if (queued_bytes_ + bytes > queued_pinned_.capacity() && !queued_copies_.empty()) wait_queued_copies();
  auto* pinned = static_cast<unsigned char*>(queued_pinned_.get(std::max(queued_bytes_ + bytes, size_t{256}), "pinned read-back"));
  RD_CUDA(cudaMemcpyAsync(pinned + queued_bytes_, src, bytes, cudaMemcpyDeviceToHost, compute_));
  if (!queued_done_) RD_CUDA(cudaEventCreateWithFlags(&queued_done_, cudaEventDisableTiming));
  RD_CUDA(cudaEventRecord(queued_done_, compute_));
  queued_copies_.push_back({dst, queued_bytes_, bytes});
  queued_bytes_ += bytes;
}

void CudaBackend::wait_queued_copies() {
  if (queued_copies_.empty()) return;
  // A query first: a copy already done costs no wait. The copies follow the step's
  // collectives, which the device alone may have waited for (a replayed backward): then
  // this is the host's wait for them, bounded by the collective deadline.
  const cudaError_t e = cudaEventQuery(queued_done_);
  if (e == cudaErrorNotReady && collective_wait_)
    collective_wait_(queued_done_, "the step's read-back (after its gradient all-reduces)");
  else if (e == cudaErrorNotReady)
    RD_CUDA(cudaEventSynchronize(queued_done_));
  else
    RD_CUDA(e);
  const auto* pinned = static_cast<const unsigned char*>(queued_pinned_.get(queued_bytes_, "pinned read-back"));
  for (const QueuedCopy& c : queued_copies_) std::memcpy(c.dst, pinned + c.offset, c.bytes);
  queued_copies_.clear();
  queued_bytes_ = 0;
}

void CudaBackend::timing_mark(int index) {
  RD_CHECK(index >= 0, "timing_mark: index " << index << " is negative");
  const size_t i = static_cast<size_t>(index);
  if (timing_marks_.size() <= i) timing_marks_.resize(i + 1, nullptr);
  if (!timing_marks_[i]) RD_CUDA(cudaEventCreate(&timing_marks_[i]));
  // In a graph being recorded, an event record node: each launch records the mark, so the
  // step split still times the parts of a replayed pass (a plain record there would only
  // order streams inside the graph).
  if (recording_)
    RD_CUDA(cudaEventRecordWithFlags(timing_marks_[i], compute_, cudaEventRecordExternal));
  else
    RD_CUDA(cudaEventRecord(timing_marks_[i], compute_));
}

double CudaBackend::timing_seconds(int from, int to) {
  for (int m : {from, to})
    RD_CHECK(m >= 0 && static_cast<size_t>(m) < timing_marks_.size() && timing_marks_[static_cast<size_t>(m)],
             "timing_seconds: mark " << m << " was never recorded");
  float ms = 0.f;
  cudaEvent_t a = timing_marks_[static_cast<size_t>(from)], b = timing_marks_[static_cast<size_t>(to)];
  cudaError_t e = cudaEventElapsedTime(&ms, a, b);
  if (e == cudaErrorNotReady) {
    // The caller asked before the device passed the mark: wait rather than guess.
    cudaGetLastError();
    RD_CUDA(cudaEventSynchronize(b));
    e = cudaEventElapsedTime(&ms, a, b);
  }
  RD_CUDA(e);
  return ms / 1e3;
}

// ---- batch norm ----------------------------------------------------------------------------------

void CudaBackend::batchnorm_forward_train_impl(const Tensor& x, const BatchNormArgs& a, Tensor& y,
                                               BatchNormSaved& saved) {
  ChannelReducer* sync = a.sync;
  const kern::ActDesc xd = act(x, "batchnorm_forward_train", "x");
  const kern::ActDesc yd = act(y, "batchnorm_forward_train", "y");
  RD_CHECK(same_dims(xd, yd), "batchnorm_forward_train: x " << dims(xd) << " vs y " << dims(yd));
  const size_t C = static_cast<size_t>(xd.c);
  const double count = static_cast<double>(xd.n * xd.h * xd.w);
  double* sums = bn_sums_.as<double>(2 * C, "batch-norm sums");
  float* ss = bn_scale_shift_.as<float>(2 * C, "batch-norm scale/shift");
  // Sums shifted by the running mean (the same on every rank), see Note [Shifted
  // batch-norm sums] (batchnorm.cu, with the kernels).
  kern::bn_sums_forward(xd, x.data, a.running_mean, sums, compute_);
  const double* packed = nullptr;
  if (sync) {
    double* buf = bn_packed_.as<double>(2 * C + 1, "SyncBatchNorm buffer");
    kern::bn_pack_sums(sums, xd.c, count, buf, compute_);
    // Ordered on the compute stream by events, see Note [SyncBN without a host
    // wait] (nccl_comm.cpp); the
    // kernels read the exact global count from buf[2C], the host records
    // local x participants (see BatchNormSaved::count).
    sync->allreduce_sum(buf, 2 * C + 1);
    packed = buf;
    saved.count = count * static_cast<double>(sync->participants());
  } else {
    saved.count = count;
  }
  kern::bn_finalize_forward(xd.c, sums, count, packed, a.gamma, a.beta, a.running_mean, a.running_var,
                            a.momentum, a.eps, saved.mean, saved.invstd, ss, compute_);
  kern::bn_apply(xd, x.data, ss, a.relu, y.data, compute_);
}

void CudaBackend::batchnorm_forward_eval_impl(const Tensor& x, const BatchNormArgs& a, Tensor& y) {
  const kern::ActDesc xd = act(x, "batchnorm_forward_eval", "x");
  const kern::ActDesc yd = act(y, "batchnorm_forward_eval", "y");
  RD_CHECK(same_dims(xd, yd), "batchnorm_forward_eval: x " << dims(xd) << " vs y " << dims(yd));
  float* ss = bn_scale_shift_.as<float>(2 * static_cast<size_t>(xd.c), "batch-norm scale/shift");
  kern::bn_scale_shift_eval(xd.c, a.gamma, a.beta, a.running_mean, a.running_var, a.eps, ss, compute_);
  kern::bn_apply(xd, x.data, ss, a.relu, y.data, compute_);
}

void CudaBackend::batchnorm_backward_impl(const Tensor& x, const Tensor& y, const Tensor& dy,
                                          const BatchNormArgs& a, const BatchNormSaved& saved, Tensor& dx,
                                          const BatchNormGrads& grads) {
  const bool relu = a.relu;
  ChannelReducer* sync = a.sync;
  const kern::ActDesc xd = act(x, "batchnorm_backward", "x");
  const kern::ActDesc dyd = act(dy, "batchnorm_backward", "dy");
  const kern::ActDesc dxd = act(dx, "batchnorm_backward", "dx");
  RD_CHECK(same_dims(xd, dyd) && same_dims(xd, dxd),
           "batchnorm_backward: x " << dims(xd) << ", dy " << dims(dyd) << ", dx " << dims(dxd)
                                    << " must match");
  if (relu) {
    const kern::ActDesc yd = act(y, "batchnorm_backward", "y");
    RD_CHECK(same_dims(xd, yd), "batchnorm_backward: y " << dims(yd) << " vs x " << dims(xd));
  }
  const size_t C = static_cast<size_t>(xd.c);
  const double count = static_cast<double>(xd.n * xd.h * xd.w);
  double* sums = bn_sums_.as<double>(2 * C, "batch-norm sums");
  float* means = bn_means_.as<float>(2 * C, "batch-norm gradient means");
  kern::bn_sums_backward(xd, x.data, relu ? y.data : nullptr, dy.data, relu, saved.mean, saved.invstd,
                         sums, compute_);
  // dgamma/dbeta from this rank's batch (DDP averages them like any gradient).
  kern::bn_param_grads(xd.c, sums, grads.dgamma, grads.dbeta, grads.accumulate, compute_);
  const double* packed = nullptr;
  if (sync) {
    double* buf = bn_packed_.as<double>(2 * C + 1, "SyncBatchNorm buffer");
    kern::bn_pack_sums(sums, xd.c, count, buf, compute_);
    sync->allreduce_sum(buf, 2 * C + 1);  // event-ordered, as in forward
    packed = buf;
  }
  kern::bn_finalize_backward(xd.c, sums, count, packed, means, compute_);
  kern::bn_backward_dx(xd, x.data, relu ? y.data : nullptr, dy.data, relu, a.gamma, saved.mean,
                       saved.invstd, means, dx.data, compute_);
}

// ---- elementwise -----------------------------------------------------------------------------------

// The contract admits activations and the MLP head's F32 matrices (any
// precision): dispatch on the tensor's own dtype and element count.
void CudaBackend::relu_forward_impl(const Tensor& x, Tensor& y) {
  kern::relu_forward(x.dtype, x.data, y.data, static_cast<size_t>(x.numel()), compute_);
}

void CudaBackend::relu_backward_impl(const Tensor& y, const Tensor& dy, Tensor& dx) {
  kern::relu_backward(y.dtype, y.data, dy.data, dx.data, static_cast<size_t>(y.numel()), compute_);
}

void CudaBackend::add_forward_impl(const Tensor& a, const Tensor& b, bool relu, Tensor& y) {
  const auto ad = act(a, "add_forward", "a"), bd = act(b, "add_forward", "b");
  const auto yd = act(y, "add_forward", "y");
  RD_CHECK(same_dims(ad, bd) && same_dims(ad, yd),
           "add_forward: a " << dims(ad) << ", b " << dims(bd) << ", y " << dims(yd) << " must match");
  kern::add_forward(act_dtype_, a.data, b.data, y.data, static_cast<size_t>(ad.count()), relu, compute_);
}

void CudaBackend::add_backward_impl(const Tensor& y, const Tensor& dy, bool relu, Tensor& dsum) {
  const auto dyd = act(dy, "add_backward", "dy"), dsd = act(dsum, "add_backward", "dsum");
  RD_CHECK(same_dims(dyd, dsd), "add_backward: dy " << dims(dyd) << " vs dsum " << dims(dsd));
  if (relu) {
    const auto yd = act(y, "add_backward", "y");
    RD_CHECK(same_dims(yd, dyd), "add_backward: y " << dims(yd) << " vs dy " << dims(dyd));
    kern::relu_backward(act_dtype_, y.data, dy.data, dsum.data, static_cast<size_t>(dyd.count()), compute_);
  } else if (dsum.data != dy.data) {
    RD_CUDA(cudaMemcpyAsync(dsum.data, dy.data, dy.nbytes(), cudaMemcpyDeviceToDevice, compute_));
  }
}

void CudaBackend::accumulate_impl(const Tensor& src, Tensor& dst) {
  RD_CHECK(src.device == DeviceKind::CUDA && dst.device == DeviceKind::CUDA && src.shape == dst.shape &&
               src.layout == dst.layout && src.dtype == dst.dtype,
           "accumulate: src " << src.describe() << " and dst " << dst.describe() << " must match");
  kern::accumulate(src.dtype, src.data, dst.data, static_cast<size_t>(src.storage_elems()), compute_);
}

// ---- pooling --------------------------------------------------------------------------------------

size_t CudaBackend::maxpool_workspace_bytes(const Tensor& y) {
  return static_cast<size_t>(y.numel()) * sizeof(int32_t);
}

void CudaBackend::maxpool_forward_impl(const Tensor& x, Tensor& y, int kernel, int stride, int pad,
                                  void* workspace) {
  const auto xd = act(x, "maxpool_forward", "x"), yd = act(y, "maxpool_forward", "y");
  RD_CHECK(kernel > 0 && stride > 0 && pad >= 0 && 2 * pad <= kernel,
           "maxpool_forward: bad kernel " << kernel << " stride " << stride << " pad " << pad);
  RD_CHECK(yd.n == xd.n && yd.c == xd.c && yd.h == conv_out_size(xd.h, kernel, stride, pad) &&
               yd.w == conv_out_size(xd.w, kernel, stride, pad),
           "maxpool_forward: y " << dims(yd) << " does not match x " << dims(xd));
  RD_CHECK(workspace, "maxpool_forward: workspace missing (maxpool_workspace_bytes)");
  kern::maxpool_forward(xd, x.data, yd, y.data, kernel, stride, pad, static_cast<int32_t*>(workspace),
                        compute_);
}

void CudaBackend::maxpool_backward_impl(const Tensor& dy, Tensor& dx, int kernel, int stride, int pad,
                                   const void* workspace) {
  const auto dyd = act(dy, "maxpool_backward", "dy"), dxd = act(dx, "maxpool_backward", "dx");
  RD_CHECK(dyd.n == dxd.n && dyd.c == dxd.c && dyd.h == conv_out_size(dxd.h, kernel, stride, pad) &&
               dyd.w == conv_out_size(dxd.w, kernel, stride, pad),
           "maxpool_backward: dy " << dims(dyd) << " does not match dx " << dims(dxd));
  RD_CHECK(workspace, "maxpool_backward: workspace missing");
  kern::maxpool_backward(dyd, dy.data, dxd, dx.data, kernel, stride, pad,
                         static_cast<const int32_t*>(workspace), compute_);
}

void CudaBackend::global_avgpool_forward_impl(const Tensor& x, Tensor& y) {
  const auto xd = act(x, "global_avgpool_forward", "x");
  check_matrix(y, xd.n, xd.c, "global_avgpool_forward", "y");
  kern::global_avgpool_forward(xd, x.data, y.f32(), compute_);
}

void CudaBackend::global_avgpool_backward_impl(const Tensor& dy, Tensor& dx) {
  const auto dxd = act(dx, "global_avgpool_backward", "dx");
  check_matrix(dy, dxd.n, dxd.c, "global_avgpool_backward", "dy");
  kern::global_avgpool_backward(dy.f32(), dxd, dx.data, compute_);
}

// ---- linear (cuBLAS is column-major: a RowMajor (r, c) matrix is its (c, r) transpose) -------------

void CudaBackend::linear_forward_impl(const Tensor& x, const Tensor& w, const float* b, Tensor& y) {
  check_matrix(w, -1, -1, "linear_forward", "w");
  const int64_t out = w.shape[0], in = w.shape[1];
  check_matrix(x, -1, in, "linear_forward", "x");
  const int64_t n = x.shape[0];
  check_matrix(y, n, out, "linear_forward", "y");
  if (n == 0 || out == 0) return;
  const float alpha = 1.f, beta = 0.f;
  // y^T (out x n) = W (out x in) * x^T (in x n)
  RD_CUBLAS(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, narrow(out, "out"), narrow(n, "batch"),
                        narrow(in, "in"), &alpha, w.f32(), narrow(in, "in"), x.f32(), narrow(in, "in"),
                        &beta, y.f32(), narrow(out, "out")));
  kern::add_bias_rows(y.f32(), b, n, out, compute_);
}

void CudaBackend::linear_backward_impl(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx,
                                  Tensor& dw, float* db, bool accumulate) {
  check_matrix(w, -1, -1, "linear_backward", "w");
  const int64_t out = w.shape[0], in = w.shape[1];
  check_matrix(x, -1, in, "linear_backward", "x");
  const int64_t n = x.shape[0];
  check_matrix(dy, n, out, "linear_backward", "dy");
  check_matrix(dw, out, in, "linear_backward", "dw");
  const float one = 1.f, zero = 0.f, acc = accumulate ? 1.f : 0.f;
  if (dx) {
    check_matrix(*dx, n, in, "linear_backward", "dx");
    // dx^T (in x n) = W^T (in x out) * dy^T (out x n)
    if (n && in)
      RD_CUBLAS(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, narrow(in, "in"), narrow(n, "batch"),
                            narrow(out, "out"), &one, w.f32(), narrow(in, "in"), dy.f32(),
                            narrow(out, "out"), &zero, dx->f32(), narrow(in, "in")));
  }
  // dW^T (in x out) = x^T (in x n) * dy (n x out)
  if (in && out)
    RD_CUBLAS(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, narrow(in, "in"), narrow(out, "out"),
                          narrow(n, "batch"), &one, x.f32(), narrow(in, "in"), dy.f32(),
                          narrow(out, "out"), &acc, dw.f32(), narrow(in, "in")));
  if (db) kern::column_sums(dy.f32(), n, out, db, accumulate, compute_);
}

// ---- loss ---------------------------------------------------------------------------------------------

double CudaBackend::softmax_xent_impl(const Tensor& logits, const int32_t* labels, float smoothing,
                                 float grad_scale, Tensor* dlogits, int32_t* predictions) {
  check_matrix(logits, -1, -1, "softmax_xent", "logits");
  const int64_t n = logits.shape[0], k = logits.shape[1];
  if (n == 0) return 0.0;
  const size_t N = static_cast<size_t>(n);
  int32_t* lab = labels_device_.as<int32_t>(N, "labels");
  float* loss = row_loss_device_.as<float>(N, "row losses");
  int32_t* amax = argmax_device_.as<int32_t>(N, "predictions");
  auto* host = static_cast<unsigned char*>(loss_host_.get(N * 12, "pinned loss results"));
  std::memcpy(host, labels, N * 4);
  RD_CUDA(cudaMemcpyAsync(lab, host, N * 4, cudaMemcpyHostToDevice, compute_));
  kern::softmax_xent(logits.f32(), lab, n, k, smoothing, kern::RowGradScale{grad_scale, nullptr},
                     dlogits ? dlogits->f32() : nullptr, loss, amax, compute_);
  RD_CUDA(cudaMemcpyAsync(host + N * 4, loss, N * 4, cudaMemcpyDeviceToHost, compute_));
  RD_CUDA(cudaMemcpyAsync(host + N * 8, amax, N * 4, cudaMemcpyDeviceToHost, compute_));
  // The one host wait a training micro-step needs: the loss (and the predictions)
  // are returned to the caller now. It also makes reusing the pinned label buffer
  // on the next call safe. Input uploads, backward and the optimizer do not wait.
  RD_CUDA(cudaStreamSynchronize(compute_));
  const float* row = reinterpret_cast<const float*>(host + N * 4);
  double total = 0.0;
  for (size_t i = 0; i < N; ++i) total += row[i];
  if (predictions) std::memcpy(predictions, host + N * 8, N * 4);
  return total;
}

// The host arrays `parts` (n ints each) copied into the next pinned slot and uploaded on the
// compute stream; returns their device copy. Waits only when that slot's previous upload
// is still queued (the device is kLabelSlots losses behind the host).
int32_t* CudaBackend::stage_labels(size_t ints, const int32_t* const* parts, size_t n, Scratch& device) {
  LabelSlot& slot = label_slots_[next_label_slot_];
  next_label_slot_ = (next_label_slot_ + 1) % kLabelSlots;
  if (!slot.uploaded) RD_CUDA(cudaEventCreateWithFlags(&slot.uploaded, cudaEventDisableTiming));
  if (slot.pending) {
    const cudaError_t e = cudaEventQuery(slot.uploaded);
    if (e == cudaErrorNotReady)
      RD_CUDA(cudaEventSynchronize(slot.uploaded));
    else
      RD_CUDA(e);
  }
  if (slot.pinned.capacity() < ints * 4)
    // All slots grow together, so the ring allocates only while the batch grows, never
    // as it first comes round to a slot.
    for (LabelSlot& other : label_slots_) {
      if (other.pending) RD_CUDA(cudaEventSynchronize(other.uploaded));
      other.pending = false;
      other.pinned.get(ints * 4, "pinned labels");
    }
  auto* host = slot.pinned.as<int32_t>(ints, "pinned labels");
  for (size_t p = 0; p * n < ints; ++p) std::memcpy(host + p * n, parts[p], n * 4);
  int32_t* dev = device.as<int32_t>(ints, "labels");
  RD_CUDA(cudaMemcpyAsync(dev, host, ints * 4, cudaMemcpyHostToDevice, compute_));
  RD_CUDA(cudaEventRecord(slot.uploaded, compute_));
  slot.pending = true;
  return dev;
}

// The loss's host arrays on the device as its kernels read them: labels, then partners
// (mixed loss), then accuracy targets, n each.
int32_t* CudaBackend::stage_loss_arrays(const int32_t* labels, const int32_t* partner_labels,
                                        const int32_t* accuracy_targets, size_t n, Scratch& device) {
  const int32_t* plain[2] = {labels, accuracy_targets};
  const int32_t* mixed[3] = {labels, partner_labels, accuracy_targets};
  return partner_labels ? stage_labels(3 * n, mixed, n, device) : stage_labels(2 * n, plain, n, device);
}

void CudaBackend::stage_loss_labels_impl(const int32_t* labels, const int32_t* partner_labels,
                                         const int32_t* accuracy_targets, int64_t n) {
  RD_CHECK(!recording_, "stage_loss_labels: called while a graph is recorded; stage before graph_begin");
  // Its own device buffer: an eager loss before the launch must not overwrite it.
  staged_loss_labels_ =
      n == 0 ? nullptr
             : stage_loss_arrays(labels, partner_labels, accuracy_targets, static_cast<size_t>(n), graph_labels_device_);
  staged_loss_rows_ = n;
  staged_loss_partners_ = partner_labels != nullptr;
}

void CudaBackend::softmax_xent_sums_impl(const Tensor& logits, const int32_t* labels, const int32_t* partner_labels,
                                         float lam, float smoothing, float grad_scale, Tensor* dlogits,
                                         const int32_t* accuracy_targets, double* sums,
                                         const math::AmpStepState* amp) {
  check_matrix(logits, -1, -1, "softmax_xent_sums", "logits");
  const int64_t n = logits.shape[0], k = logits.shape[1];
  if (n == 0) return;
  const size_t N = static_cast<size_t>(n);
  const int32_t* lab = nullptr;
  if (recording_) {
    // Staging waits on the host for a free pinned slot, which a graph cannot record: the
    // graph reads the copy stage_loss_labels queued before each launch.
    RD_CHECK(staged_loss_labels_ && staged_loss_rows_ == n && staged_loss_partners_ == (partner_labels != nullptr),
             "softmax_xent_sums recorded in a graph: call stage_loss_labels with its " << n << " rows"
                                                                                     << (partner_labels ? " and partner labels" : "")
                                                                                     << " first");
    lab = staged_loss_labels_;
  } else {
    lab = stage_loss_arrays(labels, partner_labels, accuracy_targets, N, sum_labels_device_);
  }
  float* loss = row_loss_device_.as<float>(N, "row losses");
  int32_t* amax = argmax_device_.as<int32_t>(N, "predictions");
  float* dz = dlogits ? dlogits->f32() : nullptr;
  const kern::RowGradScale row_scale{grad_scale, amp};
  if (partner_labels)
    kern::softmax_xent_mixed(logits.f32(), lab, n, k, lam, smoothing, row_scale, dz, loss, amax, compute_);
  else
    kern::softmax_xent(logits.f32(), lab, n, k, smoothing, row_scale, dz, loss, amax, compute_);
  kern::loss_sums(loss, amax, lab + (partner_labels ? 2 : 1) * N, n, sums, compute_);
}

int64_t CudaBackend::count_correct(const Tensor& logits, const int32_t* labels) {
  check_matrix(logits, -1, -1, "count_correct", "logits");
  const size_t N = static_cast<size_t>(logits.shape[0]);
  if (!N) return 0;
  int32_t* lab = labels_device_.as<int32_t>(N, "labels");
  int* flag = flag_device_.as<int>(1, "correct counter");
  auto* host = static_cast<int32_t*>(loss_host_.get(N * 12, "pinned loss results"));
  std::memcpy(host, labels, N * 4);
  RD_CUDA(cudaMemcpyAsync(lab, host, N * 4, cudaMemcpyHostToDevice, compute_));
  RD_CUDA(cudaMemsetAsync(flag, 0, sizeof(int), compute_));
  kern::count_correct(logits.f32(), lab, logits.shape[0], logits.shape[1], flag, compute_);
  int* out = flag_host_.as<int>(1, "pinned counter");
  RD_CUDA(cudaMemcpyAsync(out, flag, sizeof(int), cudaMemcpyDeviceToHost, compute_));
  RD_CUDA(cudaStreamSynchronize(compute_));
  return *out;
}

// ---- MixUp / CutMix (torchvision's reference recipe) -------------------------------------------------------------------------

void CudaBackend::mix_images_impl(const Tensor& src, Tensor& dst, const math::ImageMix& mix) {
  const kern::ActDesc d = act(src, "mix_images", "src");
  kern::mix_images(d, src.data, dst.data, mix, compute_);
}

double CudaBackend::softmax_xent_mixed_impl(const Tensor& logits, const int32_t* labels,
                                            const int32_t* partner_labels, float lam, float smoothing,
                                            float grad_scale, Tensor* dlogits, int32_t* predictions) {
  check_matrix(logits, -1, -1, "softmax_xent_mixed", "logits");
  const int64_t n = logits.shape[0], k = logits.shape[1];
  if (n == 0) return 0.0;
  const size_t N = static_cast<size_t>(n);
  int32_t* lab = labels_device_.as<int32_t>(2 * N, "labels");
  float* loss = row_loss_device_.as<float>(N, "row losses");
  int32_t* amax = argmax_device_.as<int32_t>(N, "predictions");
  // Pinned: labels, partner labels, then the row losses and predictions coming back.
  auto* host = static_cast<unsigned char*>(loss_host_.get(N * 16, "pinned loss results"));
  std::memcpy(host, labels, N * 4);
  std::memcpy(host + N * 4, partner_labels, N * 4);
  RD_CUDA(cudaMemcpyAsync(lab, host, N * 8, cudaMemcpyHostToDevice, compute_));
  kern::softmax_xent_mixed(logits.f32(), lab, n, k, lam, smoothing, kern::RowGradScale{grad_scale, nullptr},
                           dlogits ? dlogits->f32() : nullptr, loss, amax, compute_);
  RD_CUDA(cudaMemcpyAsync(host + N * 8, loss, N * 4, cudaMemcpyDeviceToHost, compute_));
  RD_CUDA(cudaMemcpyAsync(host + N * 12, amax, N * 4, cudaMemcpyDeviceToHost, compute_));
  RD_CUDA(cudaStreamSynchronize(compute_));  // as softmax_xent: the loss is returned now
  const float* row = reinterpret_cast<const float*>(host + N * 8);
  double total = 0.0;
  for (size_t i = 0; i < N; ++i) total += row[i];
  if (predictions) std::memcpy(predictions, host + N * 12, N * 4);
  return total;
}

// ---- optimizers ------------------------------------------------------------------------------------------

void CudaBackend::amp_unscale_impl(float* grads, size_t count, math::AmpStepState* state,
                                   bool found_inf_elsewhere) {
  int* flag = flag_device_.as<int>(1, "non-finite flag");
  RD_CUDA(cudaMemsetAsync(flag, 0, sizeof(int), compute_));
  kern::amp_unscale(grads, count, state, flag, found_inf_elsewhere, compute_);
}

void CudaBackend::set_optimizer_scalars_impl(math::OptimizerStepScalars* dst,
                                             const math::OptimizerStepScalars& values) {
  RD_CHECK(!recording_, "set_optimizer_scalars: called while a graph is recorded (each launch would "
                        "replay the recorded values); call it before the graph's launch");
  kern::store_optimizer_scalars(dst, values, compute_);
}

void CudaBackend::adam_step_impl(float* params, const float* grads, float* m, float* v, size_t count,
                                 const math::AdamArgs& a) {
  kern::adam_step(params, grads, m, v, count, math::adam_hyper(a), a.amp, a.scalars, compute_);
  weights_changed_by_optimizer();
}

void CudaBackend::sgd_step_impl(float* params, const float* grads, float* momentum_buf, size_t count,
                                const math::SgdHyper& h) {
  kern::sgd_step(params, grads, momentum_buf, count, h, compute_);
  weights_changed_by_optimizer();
}

namespace {
// The host table of a per-segment op: ranges, then (for a step) decay and scale.
std::vector<char> segment_table(const int64_t* ranges, size_t segments, const float* decay, const float* scale) {
  std::vector<char> t(segments * (2 * sizeof(int64_t) + (decay ? 2 * sizeof(float) : 0)));
  std::memcpy(t.data(), ranges, segments * 2 * sizeof(int64_t));
  if (decay) {
    std::memcpy(t.data() + segments * 2 * sizeof(int64_t), decay, segments * sizeof(float));
    std::memcpy(t.data() + segments * (2 * sizeof(int64_t) + sizeof(float)), scale, segments * sizeof(float));
  }
  return t;
}

int64_t longest_segment(const int64_t* ranges, size_t segments) {
  int64_t longest = 0;
  for (size_t i = 0; i < segments; ++i) longest = std::max(longest, ranges[2 * i + 1] - ranges[2 * i]);
  return longest;
}
}  // namespace

// The decays (and, outside LARS / LAMB, the scales) are the same every step: the
// table goes up once. A changed one waits for the stream first, so the pinned staging
// copy is not overwritten under a copy still queued.
void* CudaBackend::upload_segment_table(const std::vector<char>& table, Scratch& device, Scratch& host,
                                        std::vector<char>& uploaded) {
  void* dev = device.get(table.size(), "segment table");
  if (table == uploaded) return dev;
  RD_CUDA(cudaStreamSynchronize(compute_));
  void* pinned = host.get(table.size(), "pinned segment table");
  std::memcpy(pinned, table.data(), table.size());
  RD_CUDA(cudaMemcpyAsync(dev, pinned, table.size(), cudaMemcpyHostToDevice, compute_));
  uploaded = table;
  return dev;
}

void CudaBackend::segment_sum_squares_impl(const float* x, const int64_t* ranges, size_t segments, double* sums) {
  if (segments == 0) return;
  const auto* dev_ranges = static_cast<const int64_t*>(upload_segment_table(
      segment_table(ranges, segments, nullptr, nullptr), norm_table_device_, norm_table_host_, norm_table_uploaded_));
  // Up to 32 blocks of 256 threads per segment: enough to fill the device with ~100 segments.
  const unsigned gx = static_cast<unsigned>(std::clamp<int64_t>((longest_segment(ranges, segments) + 255) / 256, 1, 32));
  const size_t n = segments * gx;
  double* partials = partials_device_.as<double>(n, "segment partial sums");
  kern::segment_sum_squares(x, dev_ranges, static_cast<int64_t>(segments), gx, partials, compute_);
  double* host = partials_host_.as<double>(n, "pinned segment partial sums");
  RD_CUDA(cudaMemcpyAsync(host, partials, n * sizeof(double), cudaMemcpyDeviceToHost, compute_));
  RD_CUDA(cudaStreamSynchronize(compute_));
  for (size_t s = 0; s < segments; ++s) {  // a fixed order: every rank gets the same sums
    double acc = 0.0;
    for (unsigned b = 0; b < gx; ++b) acc += host[s * gx + b];
    sums[s] = acc;
  }
}

void CudaBackend::segment_step_impl(float* params, float* grads, float* s0, float* s1, const int64_t* ranges,
                                    size_t segments, const float* decay, const float* scale,
                                    const math::SegmentHyper& h) {
  auto* table = static_cast<char*>(upload_segment_table(segment_table(ranges, segments, decay, scale),
                                                        step_table_device_, step_table_host_, step_table_uploaded_));
  const auto* dev_ranges = reinterpret_cast<const int64_t*>(table);
  const auto* dev_decay = reinterpret_cast<const float*>(table + segments * 2 * sizeof(int64_t));
  const float* dev_scale = dev_decay + segments;
  kern::segment_step(params, grads, s0, s1, dev_ranges, dev_decay, dev_scale, static_cast<int64_t>(segments),
                     longest_segment(ranges, segments), h, compute_);
  if (h.rule != math::SegmentRule::LambMoments) weights_changed_by_optimizer();  // LAMB's first pass writes grads only
}

void CudaBackend::ema_update_impl(float* averaged, const float* current, size_t count, float decay,
                                  float one_minus_decay, bool copy) {
  if (copy)
    RD_CUDA(cudaMemcpyAsync(averaged, current, count * sizeof(float), cudaMemcpyDeviceToDevice, compute_));
  else
    kern::ema_update(averaged, current, count, decay, one_minus_decay, compute_);
  weights_changed_by_optimizer();  // the EMA is copied into the model's weights to evaluate it
}

void CudaBackend::weights_changed_by_optimizer() {
  // Recorded, the update runs at each launch of the graph: graph_launch applies this then.
  if (recording_) {
    recording_->changes_weights = true;
    return;
  }
  ++weights_version_;
  // A step is an update after convolutions ran: the optimizer's several calls, and
  // --model-ema's updates and copies, between two forwards count as one, else the
  // prune below would free (and the next forward re-allocate) every staged weight.
  if (!convs_since_step_) return;
  convs_since_step_ = false;
  ++optimizer_steps_;
  prune_staged_weights();
}

void CudaBackend::scale(float* data, float factor, size_t count) {
  ++weights_version_;  // may be a weight: staged copies are stale
  kern::scale_f32(data, factor, count, compute_);
}

bool CudaBackend::unscale_and_check(float* data, float factor, size_t count) {
  int* flag = flag_device_.as<int>(1, "non-finite flag");
  RD_CUDA(cudaMemsetAsync(flag, 0, sizeof(int), compute_));
  kern::scale_and_check(data, factor, count, flag, compute_);
  int* out = flag_host_.as<int>(1, "pinned flag");
  RD_CUDA(cudaMemcpyAsync(out, flag, sizeof(int), cudaMemcpyDeviceToHost, compute_));
  RD_CUDA(cudaStreamSynchronize(compute_));
  return *out == 0;
}

bool CudaBackend::all_finite(const float* data, size_t count) {
  return unscale_and_check(const_cast<float*>(data), 1.f, count);  // factor 1: read only
}

}  // namespace rd::cuda

// ---- factory and discovery ------------------------------------------------------------------------------

namespace rd {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // "no driver" / "insufficient driver": no GPU here
    return 0;
  }
  return n;
}

bool cuda_backend_available() { return cuda_device_count() > 0; }

bool cuda_backend_built() { return true; }

std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device visible (cudaGetDeviceCount: ") + cudaGetErrorString(e) +
           "; on a cluster: was the job given GPUs, e.g. a GPU partition or --gpus-per-node?)";
  }
  if (n == 0)
    return "no CUDA device visible (0 devices; CUDA_VISIBLE_DEVICES='" +
           std::string(std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "(unset)") +
           "'; was the job given GPUs?)";
  return "";
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts) {
  return std::make_unique<cuda::CudaBackend>(opts);
}

}  // namespace rd
