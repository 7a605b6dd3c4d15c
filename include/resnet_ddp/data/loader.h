// Threaded data loader: worker threads decode, augment and resize samples ahead of
// the training loop into a bounded queue of ready batches.
//
// - Batch buffers are recycled: next(batch) hands the caller's previous buffer back
//   to the pool and returns a filled one, so nothing is allocated per batch once the
//   pool exists (prefetch + 1 buffers). The memory comes from LoaderOptions::allocator
//   (e.g. pinned host memory for CUDA); default: plain aligned host memory.
// - Which sample lands where, and its random augmentation, depend only on
//   (seed, epoch, dataset index): the output is identical for any number of workers.
// - Destroying the loader mid-epoch stops and joins the workers cleanly.
// - A sample that fails to decode (possible only with ScanOptions::Verify::Header)
//   becomes a black image; the loader logs it once and counts it in failed_samples().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/data/transforms.h"

namespace rd::data {

// Returns `bytes` of host memory (at least 64-byte aligned) kept alive by the pointer.
using HostAllocator = std::function<std::shared_ptr<void>(size_t bytes)>;

struct Batch {
  int n = 0;  // samples in this batch (the last one may be short unless drop_last)
  int h = 0, w = 0;
  uint8_t* images = nullptr;     // n x h x w x 3, contiguous, HWC per image
  std::vector<int32_t> labels;   // n
  std::vector<int64_t> indices;  // n dataset indices
  // RandomErasing's boxes, n x (top, left, height, width), for Backend::erase_rectangles
  // after normalising; empty unless the transform has --random-erase > 0.
  std::vector<int32_t> erase_boxes;
  double wait_seconds = 0.0;     // time next() blocked waiting for this batch
  int64_t sequence = -1;         // batch number within the epoch

  size_t image_bytes() const { return static_cast<size_t>(n) * h * w * 3; }
};

struct LoaderOptions {
  int batch_size = 32;
  int workers = 0;   // 0 = default_loader_workers(1)
  int prefetch = 3;  // ready batches queued ahead (clamped to 1..8)
  bool drop_last = false;
  uint64_t seed = 0;
  HostAllocator allocator;  // null = aligned host memory
  // Called with a slot's memory (from `allocator`) before the loader refills it; returns
  // once nothing reads it any more (a GPU upload still copying from it). Null: no wait.
  std::function<void(const void* slot)> before_reuse;
  // Scheduling priority of the worker threads (Linux nice, 0..19; best effort). The
  // CPU trainer lowers it: workers there share the cores with compute threads that
  // meet at every SyncBatchNorm, so a worker preempting one rank stalls them all,
  // while the loader has slack (batches are prefetched).
  int nice = 0;
  LogFn log;                // decode failures (null = silent)
};

// Loader threads for a rank that may use `allowed_cores` cores (its CPU affinity), shared
// with `sharers` ranks bound to the same cores: its share minus the core the launching
// thread keeps, at least one.
int loader_workers_for_cores(int allowed_cores, int sharers);
// The same for this process's affinity mask (sched_getaffinity: what mpirun's binding or
// Slurm granted, not the machine's core count), shared by `ranks_sharing_mask` ranks.
int default_loader_workers(int ranks_sharing_mask);

class Loader {
 public:
  // `indices` are this rank's dataset indices for `epoch` (from DistributedSampler or
  // shard_exact). `dataset` and `transform` must outlive the loader.
  Loader(const Dataset& dataset, const TransformPipeline& transform, const LoaderOptions& opts,
         std::vector<int64_t> indices, int64_t epoch);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Starts another epoch with new indices, reusing threads and buffers. Any batch
  // still queued from the previous epoch is discarded.
  void restart(std::vector<int64_t> indices, int64_t epoch);

  // Fills `batch` with the next batch of this epoch; false at the end of the epoch.
  // The buffer handed out by the previous call goes back to the pool, so the caller
  // must be done with the previous batch.images (e.g. its host->device copy) first.
  // Rethrows (as rd::Error) a worker's failure.
  bool next(Batch& batch);

  size_t num_batches() const;
  int workers() const { return static_cast<int>(threads_.size()); }
  size_t failed_samples() const { return failed_.load(); }
  // The samples that failed (dataset index, error naming the file), in no particular
  // order: callers that score a model exclude them instead of counting black images.
  std::vector<std::pair<int64_t, std::string>> failures() const;

 private:
  struct Slot;
  void worker_loop();
  bool can_claim_locked() const;
  bool erases() const { return transform_.train() && transform_.config().random_erase > 0.0; }
  void reset_epoch_locked(std::vector<int64_t> indices, int64_t epoch);

  const Dataset& dataset_;
  const TransformPipeline& transform_;
  LoaderOptions opts_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // workers wait for claimable work
  std::condition_variable ready_cv_;  // the consumer waits for the next batch
  std::vector<int64_t> indices_;
  int64_t epoch_ = 0;
  uint64_t generation_ = 0;     // bumps on restart; stale work is dropped
  size_t num_batches_ = 0;
  size_t num_positions_ = 0;    // samples delivered this epoch
  size_t next_claim_ = 0;       // next sample position a worker may start
  size_t next_deliver_ = 0;     // next batch number next() returns
  size_t in_flight_ = 0;        // samples being decoded right now
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<int> free_slots_;
  std::vector<int> batch_slot_;  // batch number -> slot (-1 = none yet)
  int consumer_slot_ = -1;       // slot handed out by the last next()
  std::condition_variable idle_cv_;  // restart waits for in-flight samples
  bool stopping_ = false;
  std::exception_ptr error_;
  std::atomic<size_t> failed_{0};
  std::vector<std::pair<int64_t, std::string>> failures_;  // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace rd::data
