// Threaded loader. Workers claim single samples in epoch order (so a batch is
// spread over all workers and arrives with low latency), decode and transform
// them straight into the batch's pool buffer, and the consumer takes batches in
// order. At most `prefetch` batches are in flight or ready at any time.
#include "resnet_ddp/data/loader.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "resnet_ddp/errors.h"

namespace rd::data {

struct Loader::Slot {
  std::shared_ptr<void> storage;
  uint8_t* images = nullptr;
  std::vector<int32_t> labels;
  std::vector<int64_t> indices;
  std::vector<int32_t> erase_boxes;  // 4 per sample when the transform erases
  int64_t batch = -1;
  int count = 0;      // samples in the batch
  int remaining = 0;  // samples still being produced
  bool ready = false;
};

static_assert(sizeof(CropBox) == 4 * sizeof(int32_t), "the loader copies a CropBox as four int32");

int loader_workers_for_cores(int allowed_cores, int sharers) {
  return std::max(1, std::max(1, allowed_cores) / std::max(1, sharers) - 1);
}

int default_loader_workers(int ranks_sharing_mask) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  int cores = 0;
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) cores = CPU_COUNT(&mask);
  if (cores < 1) {
    const unsigned hw = std::thread::hardware_concurrency();
    cores = hw ? static_cast<int>(hw) : 1;
  }
  return loader_workers_for_cores(cores, ranks_sharing_mask);
}

namespace {
std::shared_ptr<void> aligned_host(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) throw Error("loader: out of host memory allocating " + std::to_string(bytes) + " bytes");
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}
}  // namespace

Loader::Loader(const Dataset& dataset, const TransformPipeline& transform, const LoaderOptions& opts,
               std::vector<int64_t> indices, int64_t epoch)
    : dataset_(dataset), transform_(transform), opts_(opts) {
  if (opts_.batch_size < 1)
    throw UsageError("--batch-size " + std::to_string(opts_.batch_size) + ": must be at least 1");
  opts_.prefetch = std::clamp(opts_.prefetch, 1, 8);
  const int workers = opts_.workers > 0 ? opts_.workers : default_loader_workers(1);
  const int s = transform_.output_size();
  const size_t bytes = static_cast<size_t>(opts_.batch_size) * s * s * 3;
  // prefetch batches in flight or ready, plus the one the consumer holds.
  for (int i = 0; i < opts_.prefetch + 1; ++i) {
    auto slot = std::make_unique<Slot>();
    slot->storage = opts_.allocator ? opts_.allocator(bytes) : aligned_host(bytes);
    if (!slot->storage) throw Error("loader: allocator returned no memory");
    slot->images = static_cast<uint8_t*>(slot->storage.get());
    slot->labels.resize(static_cast<size_t>(opts_.batch_size));
    slot->indices.resize(static_cast<size_t>(opts_.batch_size));
    if (erases()) slot->erase_boxes.resize(static_cast<size_t>(opts_.batch_size) * 4);
    slots_.push_back(std::move(slot));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    reset_epoch_locked(std::move(indices), epoch);
  }
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { worker_loop(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void Loader::reset_epoch_locked(std::vector<int64_t> indices, int64_t epoch) {
  for (int64_t i : indices)
    if (i < 0 || static_cast<size_t>(i) >= dataset_.size())
      throw UsageError("loader: index " + std::to_string(i) + " outside the dataset (size " +
                       std::to_string(dataset_.size()) + ")");
  indices_ = std::move(indices);
  epoch_ = epoch;
  ++generation_;
  const size_t b = static_cast<size_t>(opts_.batch_size);
  num_batches_ = opts_.drop_last ? indices_.size() / b : (indices_.size() + b - 1) / b;
  num_positions_ = std::min(indices_.size(), num_batches_ * b);
  next_claim_ = 0;
  next_deliver_ = 0;
  batch_slot_.assign(num_batches_, -1);
  free_slots_.clear();
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i]->ready = false;
    slots_[i]->batch = -1;
    free_slots_.push_back(static_cast<int>(i));
  }
  consumer_slot_ = -1;
  error_ = nullptr;
}

void Loader::restart(std::vector<int64_t> indices, int64_t epoch) {
  // The batch last handed out is the only slot an upload may still read (the
  // consumer's slot, which this thread owns); every slot is refilled from here on.
  if (consumer_slot_ >= 0 && opts_.before_reuse)
    opts_.before_reuse(slots_[static_cast<size_t>(consumer_slot_)]->storage.get());
  {
    std::unique_lock<std::mutex> lock(mu_);
    ++generation_;  // in-flight samples of the old epoch are dropped on completion
    next_claim_ = num_positions_;  // and no new ones start
    idle_cv_.wait(lock, [&] { return in_flight_ == 0; });
    reset_epoch_locked(std::move(indices), epoch);
  }
  work_cv_.notify_all();
}

size_t Loader::num_batches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_batches_;
}

bool Loader::can_claim_locked() const {
  if (error_ || next_claim_ >= num_positions_) return false;
  const size_t batch = next_claim_ / static_cast<size_t>(opts_.batch_size);
  if (batch >= next_deliver_ + static_cast<size_t>(opts_.prefetch)) return false;
  return batch_slot_[batch] >= 0 || !free_slots_.empty();
}

void Loader::worker_loop() {
  if (opts_.nice > 0)  // per-thread on Linux; failure only leaves the default priority
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), std::min(opts_.nice, 19));
  TransformScratch scratch;
  const int s = transform_.output_size();
  const size_t image_bytes = static_cast<size_t>(s) * s * 3;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || can_claim_locked(); });
    if (stopping_) return;
    const size_t pos = next_claim_++;
    const size_t batch = pos / static_cast<size_t>(opts_.batch_size);
    const size_t j = pos % static_cast<size_t>(opts_.batch_size);
    if (batch_slot_[batch] < 0) {
      const int id = free_slots_.back();
      free_slots_.pop_back();
      Slot& fresh = *slots_[static_cast<size_t>(id)];
      fresh.batch = static_cast<int64_t>(batch);
      fresh.count = static_cast<int>(std::min(num_positions_ - batch * opts_.batch_size,
                                              static_cast<size_t>(opts_.batch_size)));
      fresh.remaining = fresh.count;
      fresh.ready = false;
      batch_slot_[batch] = id;
    }
    Slot& slot = *slots_[static_cast<size_t>(batch_slot_[batch])];
    const int64_t index = indices_[pos];
    const int64_t epoch = epoch_;
    const uint64_t generation = generation_;
    ++in_flight_;
    lock.unlock();

    uint8_t* out = slot.images + j * image_bytes;
    std::exception_ptr failure;
    try {
      try {
        dataset_.load(static_cast<size_t>(index), scratch.decoded);
      } catch (const Error& e) {
        // Possible only when scanning checked headers alone: keep the batch shape.
        const size_t n = ++failed_;
        if (opts_.log && n <= 100)
          opts_.log(std::string("warning: ") + e.what() + " (replaced by a black image)");
        {
          std::lock_guard<std::mutex> guard(mu_);
          failures_.emplace_back(index, e.what());
        }
        scratch.decoded.resize(s, s);
        std::memset(scratch.decoded.data(), 0, scratch.decoded.bytes());
      }
      CropBox erase;
      transform_.apply(scratch.decoded, opts_.seed, epoch, index, out, scratch, &erase);
      if (erases()) std::memcpy(&slot.erase_boxes[j * 4], &erase, sizeof(int32_t) * 4);
      slot.labels[j] = dataset_.label(static_cast<size_t>(index));
      slot.indices[j] = index;
    } catch (...) {
      failure = std::current_exception();
    }

    lock.lock();
    --in_flight_;
    if (generation == generation_) {
      if (failure && !error_) error_ = failure;
      if (--slot.remaining == 0) {
        slot.ready = true;
        ready_cv_.notify_all();
      }
      if (failure) ready_cv_.notify_all();
    }
    if (in_flight_ == 0) idle_cv_.notify_all();
  }
}

std::vector<std::pair<int64_t, std::string>> Loader::failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failures_;
}

bool Loader::next(Batch& batch) {
  std::unique_lock<std::mutex> lock(mu_);
  if (consumer_slot_ >= 0) {
    const int done = consumer_slot_;
    consumer_slot_ = -1;
    if (opts_.before_reuse) {  // workers never touch the consumer's slot: wait unlocked
      lock.unlock();
      opts_.before_reuse(slots_[static_cast<size_t>(done)]->storage.get());
      lock.lock();
    }
    slots_[static_cast<size_t>(done)]->ready = false;
    free_slots_.push_back(done);
    work_cv_.notify_all();
  }
  batch.n = 0;
  batch.images = nullptr;
  if (next_deliver_ >= num_batches_) return false;
  const auto start = std::chrono::steady_clock::now();
  const size_t want = next_deliver_;
  ready_cv_.wait(lock, [&] {
    return error_ || (batch_slot_[want] >= 0 && slots_[static_cast<size_t>(batch_slot_[want])]->ready);
  });
  batch.wait_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (error_) {
    std::exception_ptr e = error_;
    lock.unlock();
    try {
      std::rethrow_exception(e);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& ex) {
      throw Error(std::string("loader worker failed: ") + ex.what());
    }
  }
  const int id = batch_slot_[want];
  Slot& slot = *slots_[static_cast<size_t>(id)];
  consumer_slot_ = id;
  ++next_deliver_;
  work_cv_.notify_all();  // the prefetch window moved
  batch.n = slot.count;
  batch.h = batch.w = transform_.output_size();
  batch.images = slot.images;
  batch.labels.assign(slot.labels.begin(), slot.labels.begin() + slot.count);
  batch.indices.assign(slot.indices.begin(), slot.indices.begin() + slot.count);
  batch.erase_boxes.assign(slot.erase_boxes.begin(), slot.erase_boxes.begin() + (erases() ? slot.count * 4 : 0));
  batch.sequence = static_cast<int64_t>(want);
  return true;
}

}  // namespace rd::data
