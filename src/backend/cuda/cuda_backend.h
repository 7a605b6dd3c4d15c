// CudaBackend: rd::Backend on one GPU. Convolutions through cuDNN (conv.cpp; algorithms
// chosen once per shape with cudnnFind*, or cuDNN's heuristics under
// RD_CUDNN_HEURISTICS=1; one shared workspace grown on demand and given back when
// another allocation runs out of memory; a shape with no algorithm in the
// activation type and layout runs in f32 NCHW), linear layers through cuBLAS,
// everything else through kernels/ whose per-element math is
// include/resnet_ddp/math/*.h.
//
// Streams: all work runs in order on one compute stream; input images go
// host -> device on a copy stream, into one of two device buffers (batch k+1
// copies while step k computes; event-ordered), straight from pinned memory when
// the loader's slots come from allocate_upload_source, else through a pinned
// staging copy; NcclComm runs
// collectives on its own stream ordered against compute_stream() with events
// (make_nccl_comm is handed this backend).
//
// Precision: FP32 (no TF32 anywhere), TF32 (tensor-core math for convs and
// GEMMs, Ampere+), FP16 / BF16 mixed precision: activations stored F16/BF16,
// parameters, gradients, optimizer state, BN statistics, matrices and the
// loss stay F32 (weights are converted per call, weight gradients come back
// as F32). Loss scaling for FP16 is the trainer's (softmax_xent's grad_scale,
// then unscale_and_check / all_finite).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/launch.cuh"
#include "resnet_ddp/backend/backend.h"

namespace rd::cuda {

// Grow-only device (or pinned host) scratch buffer.
class Scratch {
 public:
  explicit Scratch(bool pinned_host = false) : pinned_(pinned_host) {}
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  // Ensures >= bytes; the previous content is lost when it grows. `what`
  // names the buffer in an out-of-memory error.
  void* get(size_t bytes, const char* what);
  // As get, but nullptr (and the old buffer kept) when the device is out of memory.
  void* try_get(size_t bytes);
  // Frees the buffer now (after the device finished with it); the next get grows it again.
  void release();
  template <class T> T* as(size_t count, const char* what) {
    return static_cast<T*>(get(count * sizeof(T), what));
  }
  size_t capacity() const { return bytes_; }
  // The streams that use the buffer: release() waits for them, for at most
  // `wait_s` seconds (the backend's teardown bound), instead of for the whole device.
  void bind(double wait_s, cudaStream_t first, cudaStream_t second = nullptr) {
    wait_s_ = wait_s, streams_[0] = first, streams_[1] = second;
  }
  // Forgets the buffer without freeing it (its streams never finished).
  void abandon() { ptr_ = nullptr, bytes_ = 0; }
  // get() calls this once when the device is out of memory, then retries if it
  // returned true (it freed something: the backend's convolution workspace).
  void on_oom(std::function<bool()> release_other) { on_oom_ = std::move(release_other); }

 private:
  bool pinned_;
  std::function<bool()> on_oom_;
  cudaStream_t streams_[2] = {nullptr, nullptr};
  double wait_s_ = 600.0;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Device and pinned allocations and frees by this process's CUDA backends and scratch
// buffers so far (Backend::memory_events): a recorded graph must not outlive memory it uses.
uint64_t memory_events_so_far();
void count_memory_event();

// Waits until `s` finished its queued work, for at most `seconds`; false on
// timeout. Destructors and buffer releases use it, bounded by the collective
// deadline (BackendOptions::collective_timeout_s).
//
// Note [Bounded teardown waits]
// A collective whose peer died can block a stream for ever, so no destructor waits
// for a stream without a bound: past it, the owner leaks its stream, events and
// buffers (or aborts its NCCL communicator) and returns. A leak at shutdown beats
// a hang; the watchdog or the caller's error path ends the process.
bool wait_stream_bounded(cudaStream_t s, double seconds);

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& opts);
  ~CudaBackend() override;

  DeviceKind device() const override { return DeviceKind::CUDA; }
  std::string name() const override;
  Layout activation_layout() const override { return layout_; }
  DType activation_dtype() const override { return act_dtype_; }

  std::shared_ptr<void> allocate(size_t bytes) override;
  void copy_from_host(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void fill(float* dst, float value, size_t count) override;
  void synchronize() override;
  void copy_to_host_queued(void* dst, const void* src, size_t bytes) override;
  void wait_queued_copies() override;
  void timing_mark(int index) override;
  double timing_seconds(int from, int to) override;
  size_t maxpool_workspace_bytes(const Tensor& y) override;
  void scale(float* data, float factor, size_t count) override;
  bool all_finite(const float* data, size_t count) override;
  // One pass: data *= factor and the non-finite check together.
  bool unscale_and_check(float* data, float factor, size_t count) override;
  std::shared_ptr<void> allocate_upload_source(size_t bytes) override;
  void plan_convolution(const Shape& x, const Shape& w, const ConvGeometry& g, bool backward_data,
                        bool backward_weights) override;
  void wait_upload_source(const void* host) override;
  // CUDA graphs (graphs.cpp): stream capture of the compute stream, thread-local mode.
  bool graph_begin() override;
  int graph_end() override;
  bool graph_launch(int graph) override;
  void graph_drop(int graph) override;
  uint64_t memory_events() override;

 protected:
  // Every contracted op's implementation (include/resnet_ddp/backend/ops.def).
#define RD_BACKEND_OP(name, ret, params, args, kind) ret name##_impl params override;
#include "resnet_ddp/backend/ops.def"

 public:
  // ---- CUDA-only extras ---------------------------------------------------------
  // Rows of `logits` whose first maximum equals the (host) label.
  int64_t count_correct(const Tensor& logits, const int32_t* labels);
  // All of this backend's work runs in order on it; make_nccl_comm orders its
  // collectives against it.
  cudaStream_t compute_stream() const { return compute_; }
  // BackendOptions::collective_timeout_s: the bound on teardown waits, and the
  // deadline of an NCCL communicator made for this backend.
  double collective_timeout_s() const { return collective_timeout_s_; }
  int device_index() const { return device_; }
  Precision precision() const { return precision_; }
  // Distinct convolution shapes planned so far (each ran cudnnFind once; an f32
  // NCHW fallback plan counts as one more).
  size_t conv_plans() const { return plans_.size(); }
  // Convolution directions running in the f32 NCHW fallback (no cuDNN algorithm
  // for the activation type and layout; see conv_fallback in the .cpp).
  size_t conv_fallbacks() const { return fallbacks_; }
  size_t workspace_bytes() const { return workspace_.capacity(); }
  // Device buffers allocated (or grown) for staged weights so far: constant in the
  // steady state of training, --model-ema included.
  size_t staged_weight_allocations() const { return staged_weight_allocations_; }
  // Algorithm searches (cudnnFind, or the heuristics) so far, one per plan and direction.
  size_t conv_searches() const { return conv_searches_; }
  // Weight conversions (NHWC / 16-bit staged copies) so far: one per weight and change.
  size_t weight_stagings() const { return weight_stagings_; }
  // Something outside this backend's ops (a collective) wrote device memory that may hold
  // weights: their staged copies are stale.
  void device_memory_written_elsewhere() { ++weights_version_; }
  // A communicator whose collectives the compute stream may wait for on the device alone
  // (NcclComm with several ranks) sets how the host waits for an event of that stream: with
  // the collective deadline and its health checks, never unbounded (wait_queued_copies).
  // Null: a plain wait. The communicator clears it before it goes.
  using CollectiveWait = std::function<void(cudaEvent_t, const std::string& what)>;
  void set_collective_wait(CollectiveWait wait) { collective_wait_ = std::move(wait); }

  struct ConvKey {
    int64_t n, c, h, w, o, kh, kw;
    int stride, pad, groups;
    bool nhwc;
    DType dtype;
    bool operator==(const ConvKey&) const = default;
  };
  struct ConvKeyHash {
    size_t operator()(const ConvKey& k) const;
  };
  struct ConvPlan;
  // One measured cuDNN algorithm (forward, backward-data or backward-filter enum value).
  struct ConvChoice {
    int algo;
    cudnnMathType_t math;
    size_t ws;
    float ms = -1.f;  // measured time (cudnnFind's, or re-timed in fp32); negative: none
  };

 private:
  struct StagedWeight {
    std::unique_ptr<Scratch> buffer;
    size_t bytes = 0;
    uint64_t version = 0;         // weights_version_ when staged
    uint64_t last_used_step = 0;  // optimizer_steps_ when last used
  };
  kern::ActDesc act(const Tensor& t, const char* op, const char* role) const;
  void check_matrix(const Tensor& t, int64_t rows, int64_t cols, const char* op,
                    const char* role) const;
  ConvPlan& plan(const kern::ActDesc& x, const Tensor& w, const ConvGeometry& g, const char* op);
  bool stages_weights() const;
  const void* staged_weight(const Tensor& w);
  void prune_staged_weights();
  void weights_changed_by_optimizer();
  // The fastest of `list` whose workspace can be allocated now (dropping those that cannot).
  ConvChoice affordable(std::vector<ConvChoice>& list, void*& ws, const char* op);
  size_t find_workspace_limit() const;
  cudnnMathType_t wanted_conv_math() const;
  // Direction d (forward, backward data, backward filter) of a plan: its algorithms
  // (cudnnFind, or the heuristics under RD_CUDNN_HEURISTICS=1), and running one.
  std::vector<ConvChoice> search(ConvPlan& p, int d, const char* op);
  cudnnStatus_t workspace_size(ConvPlan& p, int d, int algo, cudnnMathType_t math, size_t& ws);
  bool run_conv(ConvPlan& p, int d, const void* a, const void* b, void* out, float beta, const char* op);
  cudnnStatus_t launch_conv(ConvPlan& p, int d, const ConvChoice& c, const void* a, const void* b, void* out,
                            float beta, void* ws);
  void retime_candidates(ConvPlan& p, int d, std::vector<ConvChoice>& list);
  void report_plan(const ConvPlan& p, int d, const std::vector<ConvChoice>& list, const char* how) const;
  ConvPlan& f32_nchw_plan(const kern::ActDesc& x, const Shape& w, const ConvGeometry& g, const char* op);
  void note_fallback(ConvPlan& p, int d, const kern::ActDesc& x, const Shape& w, const char* op);
  ConvPlan& plan_shape(const kern::ActDesc& x, const Shape& w, const ConvGeometry& g, const char* op);
  // Frees the convolution workspace after an out-of-memory error; true when there was one.
  bool release_workspace_for_oom();
  std::vector<Scratch*> scratch_buffers();

  int device_ = 0;
  double collective_timeout_s_ = 600.0;
  cudaDeviceProp props_{};
  Precision precision_ = Precision::FP32;
  Layout layout_ = Layout::NHWC;
  DType act_dtype_ = DType::F32;
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  // Two upload buffers, used in turn: batch k+1 copies into one while the conversion
  // of batch k reads the other.
  struct Upload {
    Scratch device;
    Scratch pinned{true};            // staging for a source that is not an upload source
    cudaEvent_t ready = nullptr;     // copy stream: the batch is on the device
    cudaEvent_t consumed = nullptr;  // compute stream: the conversion read it
    const void* source = nullptr;    // the upload source the copy reads, until waited for
  };
  Upload uploads_[2];
  int next_upload_ = 0;
  // Live pinned blocks from allocate_upload_source (base -> bytes); shared with their
  // deleters, which may run after the backend is gone.
  struct UploadSources;
  std::shared_ptr<UploadSources> upload_sources_;
  bool is_upload_source(const void* p, size_t bytes) const;
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  bool cudnn_heuristics_ = false;  // RD_CUDNN_HEURISTICS=1: no cudnnFind (compute-sanitizer)
  bool conv_report_ = false;       // RD_CONV_REPORT=1: each plan's choice on stderr
  cudaEvent_t timing_start_ = nullptr, timing_stop_ = nullptr;
  Scratch timing_x_, timing_y_, timing_w_;  // zeroed operands of the re-timing, freed after
  size_t fallbacks_ = 0;

  std::unordered_map<ConvKey, std::unique_ptr<ConvPlan>, ConvKeyHash> plans_;
  std::unordered_map<const void*, StagedWeight> staged_weights_;
  uint64_t weights_version_ = 0;  // bumped by anything that may write a weight
  uint64_t optimizer_steps_ = 0;  // updates that followed convolutions (see weights_changed_by_optimizer)
  bool convs_since_step_ = false;  // a staged weight was used since the last counted step
  size_t staged_weight_allocations_ = 0;
  size_t conv_searches_ = 0;
  size_t weight_stagings_ = 0;
  Scratch workspace_;
  Scratch staged_grad_;
  Scratch bn_sums_, bn_packed_, bn_scale_shift_, bn_means_;
  Scratch nchw_scratch_;
  Scratch fallback_in_, fallback_out_;  // f32 NCHW operands of the convolution fallback
  Scratch labels_device_, row_loss_device_, argmax_device_, loss_host_{true};
  Scratch flag_device_, flag_host_{true};
  // softmax_xent_sums' host labels (labels, partners, accuracy targets) in pinned slots used
  // in turn: a slot is rewritten only after its upload finished (its event), so the host
  // never waits while the device is less than kLabelSlots losses behind.
  static constexpr size_t kLabelSlots = 4;
  struct LabelSlot {
    Scratch pinned{true};
    cudaEvent_t uploaded = nullptr;
    bool pending = false;
  };
  LabelSlot label_slots_[kLabelSlots];
  size_t next_label_slot_ = 0;
  Scratch sum_labels_device_, graph_labels_device_;  // eager losses' labels; stage_loss_labels'
  int32_t* stage_labels(size_t ints, const int32_t* const* parts, size_t n, Scratch& device);
  int32_t* stage_loss_arrays(const int32_t* labels, const int32_t* partner_labels, const int32_t* accuracy_targets,
                             size_t n, Scratch& device);
  // copy_to_host_queued: the copies land in pinned memory (one event after the last), and
  // wait_queued_copies moves them to their destinations.
  struct QueuedCopy {
    void* dst;
    size_t offset, bytes;
  };
  Scratch queued_pinned_{true};
  std::vector<QueuedCopy> queued_copies_;
  size_t queued_bytes_ = 0;
  cudaEvent_t queued_done_ = nullptr;
  CollectiveWait collective_wait_;
  std::vector<cudaEvent_t> timing_marks_;  // timing_mark's events (with timing), created on first use
  // Per-segment optimizer ops: the segment tables on the device (re-uploaded only when
  // their content changed: the norms' ranges; the step's ranges + decay + scale) and the
  // norms' per-block partial sums.
  Scratch norm_table_device_, norm_table_host_{true}, step_table_device_, step_table_host_{true};
  Scratch partials_device_, partials_host_{true};
  std::vector<char> norm_table_uploaded_, step_table_uploaded_;
  void* upload_segment_table(const std::vector<char>& table, Scratch& device, Scratch& host,
                             std::vector<char>& uploaded);
  Scratch erase_boxes_;  // erase_rectangles' boxes on the device
  // Recorded graphs (graphs.cpp), by id; a dropped one keeps its slot with a null exec.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    uint64_t memory_events = 0;       // memory_events() when recorded
    std::vector<const void*> converts;  // staged weights the graph converts (staged_weight's keys)
    std::vector<const void*> relies;    // staged weights it reads as they were when recorded
    bool changes_weights = false;       // holds an update: weights_changed_by_optimizer at each launch
  };
  std::vector<Graph> graphs_;
  Graph* recording_ = nullptr;  // between graph_begin and graph_end
  void drop_all_graphs();
  // The labels stage_loss_labels queued last (for a loss recorded in a graph).
  const int32_t* staged_loss_labels_ = nullptr;
  int64_t staged_loss_rows_ = -1;
  bool staged_loss_partners_ = false;
};

}  // namespace rd::cuda
