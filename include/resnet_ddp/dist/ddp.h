// Data-parallel training pieces: gradient buckets all-reduced while backward
// still runs, the start-up broadcast of the model, SyncBatchNorm over a Comm, and
// the cross-rank parameter checksum.
//
// Typical step (see docs/distributed.md):
//   bucketer.set_sync(micro == accum_steps - 1);   // no comm on earlier micro-batches
//   bucketer.begin_backward();
//   model.backward(dlogits, accumulate, &bucketer); // buckets fire as grads are final
//   bucketer.finish();                              // wait; grads are now averaged
//   backend.adam_step(params, grads, ...);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/dist/comm.h"
#include "resnet_ddp/dist/reducer.h"
#include "resnet_ddp/nn/arena.h"
#include "resnet_ddp/nn/resnet.h"

namespace rd::dist {

struct BucketOptions {
  double bucket_mb = 25.0;       // capacity of every bucket but the first
  double first_bucket_mb = 1.0;  // small first bucket: communication starts early
  bool overlap = true;           // false: all-reduce everything in finish()
  // A thread that drives MPI progress while buckets are in flight (Open MPI does
  // not progress in the background, and poll() between layers advances a
  // multi-round all-reduce only one round per layer). It sleeps when nothing is
  // in flight. Measured on 2 ranks, ResNet-18: exposed comm ~210 ms -> ~40 ms,
  // but when compute already uses every core it slows backward more than it
  // saves (ResNet-34 @244, 2 ranks x 1 thread on 2 cores: backward 2.07 -> 2.84 s),
  // so it is opt-in (resnet_ddp --progress-thread).
  bool progress_thread = false;
};

// One bucket: arena slices [first_slice, last_slice] (forward order), covering
// the contiguous floats [offset, offset + count) of the gradient arena.
struct Bucket {
  size_t first_slice = 0;
  size_t last_slice = 0;
  size_t offset = 0;
  size_t count = 0;
};

// Builds the buckets: slices taken in reverse order (the order backward
// produces gradients); a bucket closes once it holds >= its capacity.
std::vector<Bucket> plan_buckets(const Arena& grads, double first_bucket_mb, double bucket_mb);

struct DdpStats {
  uint64_t bytes_allreduced = 0;  // gradient bytes this rank contributed
  uint64_t allreduce_calls = 0;
  uint64_t steps = 0;             // finish() calls that communicated
  double exposed_comm_s = 0.0;    // time finish() waited (all comm when not overlapped)
};

class GradientBucketer : public GradientReducer {
 public:
  GradientBucketer(Comm& comm, Arena& grads, const BucketOptions& opts = {});
  ~GradientBucketer() override;
  GradientBucketer(const GradientBucketer&) = delete;
  GradientBucketer& operator=(const GradientBucketer&) = delete;

  // false: the next backward only accumulates locally (gradient accumulation).
  void set_sync(bool sync) override { sync_ = sync; }
  bool sync() const { return sync_; }

  // Arms the buckets for one backward pass (call before model.backward).
  void begin_backward() override;
  void on_grad_ready(size_t index) override;
  void poll() override;
  // Fires whatever has not fired yet (in bucket order) and waits for all; the
  // gradient arena then holds the average over ranks.
  void finish() override;
  double exposed_comm_s() const override { return stats_.exposed_comm_s; }
  bool waits_on_device() const override { return comm_.device() == DeviceKind::CUDA; }
  void finish_on_device() override;
  void count_replayed_pass() override;

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const BucketOptions& options() const { return opts_; }
  const DdpStats& stats() const { return stats_; }

 private:
  void fire_ready_buckets();
  void fire(size_t bucket);
  // finish()'s start: the pass disarmed, the buckets not yet fired fired; false: no sync.
  bool fire_remaining();
  void start_progress_thread();
  void stop_progress_thread();

  Comm& comm_;
  Arena& grads_;
  BucketOptions opts_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_slice_;
  std::vector<size_t> pending_;  // per bucket: gradients not yet final
  std::vector<char> ready_;      // per slice: reported final in this pass
  std::vector<std::unique_ptr<Request>> requests_;
  size_t next_to_fire_ = 0;
  bool armed_ = false;
  bool sync_ = true;
  DdpStats stats_;
  struct ProgressThread;
  std::unique_ptr<ProgressThread> progress_;
};

// Rank 0's parameters and buffers (BN running stats) to every rank.
void broadcast_model(Comm& comm, Arena& params, Arena& buffers);

// SyncBatchNorm: the backend sums per-channel statistics over ranks with this.
class SyncBatchNormReducer : public ChannelReducer {
 public:
  explicit SyncBatchNormReducer(Comm& comm) : comm_(comm) {}
  void allreduce_sum(double* data, size_t count) override;
  int participants() const override { return comm_.size(); }
  uint64_t calls() const { return calls_; }
  uint64_t bytes() const { return bytes_; }

 private:
  Comm& comm_;
  uint64_t calls_ = 0;
  uint64_t bytes_ = 0;
};

// 64-bit FNV-1a-style hash of a host buffer, taken 8 bytes at a time. Chaining
// (seed = the previous call's result) over pieces whose sizes are multiples of 8
// gives the hash of the whole buffer, so large arenas can be hashed in chunks.
constexpr uint64_t kChecksumSeed = 0xcbf29ce484222325ULL;
uint64_t checksum_bytes(const void* data, size_t bytes, uint64_t seed = kChecksumSeed);

struct ChecksumReport {
  uint64_t local = 0;
  std::vector<uint64_t> per_rank;  // index = rank
  bool identical = true;
  std::string describe() const;  // "ranks differ: rank 0 = 0x..., rank 2 = 0x..."
};

// Checksums `arena` (copied to the host through `backend`) on every rank and
// compares them; all ranks get the same report. `hash_comm` must be a host
// communicator (MPI) even when training uses NCCL.
ChecksumReport compare_across_ranks(Comm& hash_comm, Backend& backend, const Arena& arena);

}  // namespace rd::dist
