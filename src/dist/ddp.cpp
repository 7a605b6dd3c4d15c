// Gradient buckets (PyTorch DDP's reducer, on flat arenas), model broadcast,
// SyncBatchNorm's reducer and the cross-rank checksum.
#include "resnet_ddp/dist/ddp.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "resnet_ddp/errors.h"

namespace rd::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

std::vector<Bucket> plan_buckets(const Arena& grads, double first_bucket_mb, double bucket_mb) {
  RD_CHECK(first_bucket_mb > 0 && bucket_mb > 0,
           "bucket sizes must be positive (got " << first_bucket_mb << " and " << bucket_mb << " MB)");
  const auto& slices = grads.slices();
  std::vector<Bucket> out;
  if (slices.empty()) return out;
  auto close = [&](size_t first, size_t last) {
    Bucket b;
    b.first_slice = first;
    b.last_slice = last;
    b.offset = slices[first].offset;
    b.count = slices[last].offset + slices[last].count - b.offset;
    out.push_back(b);
  };
  size_t last = slices.size() - 1;  // highest slice of the open bucket
  for (size_t i = slices.size(); i-- > 0;) {
    const double cap = (out.empty() ? first_bucket_mb : bucket_mb) * kMiB;
    const double bytes =
        double(slices[last].offset + slices[last].count - slices[i].offset) * sizeof(float);
    if (bytes >= cap || i == 0) {
      close(i, last);
      last = i - 1;  // wraps only when i == 0, and then the loop ends
    }
  }
  return out;
}

// Drives MPI progress while buckets are in flight.
struct GradientBucketer::ProgressThread {
  explicit ProgressThread(Comm& comm) : comm(comm), thread([this] { run(); }) {}
  ~ProgressThread() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }
  void set_active(bool on) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      active = on;
    }
    cv.notify_all();
  }
  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop) {
      cv.wait(lock, [this] { return stop || active; });
      while (active && !stop) {
        lock.unlock();
        comm.progress();
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        lock.lock();
      }
    }
  }
  Comm& comm;
  std::mutex mutex;
  std::condition_variable cv;
  bool active = false;
  bool stop = false;
  std::thread thread;
};

GradientBucketer::GradientBucketer(Comm& comm, Arena& grads, const BucketOptions& opts)
    : comm_(comm), grads_(grads), opts_(opts) {
  RD_CHECK(grads.allocated(), "GradientBucketer: the gradient arena is not allocated");
  buckets_ = plan_buckets(grads, opts.first_bucket_mb, opts.bucket_mb);
  bucket_of_slice_.assign(grads.slices().size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t s = buckets_[b].first_slice; s <= buckets_[b].last_slice; ++s) bucket_of_slice_[s] = b;
  if (opts.progress_thread && comm.size() > 1) progress_ = std::make_unique<ProgressThread>(comm);
}

GradientBucketer::~GradientBucketer() {
  progress_.reset();
  // Outstanding requests complete in their destructors (buffers must outlive them).
  requests_.clear();
}

void GradientBucketer::begin_backward() {
  RD_CHECK(requests_.empty(), "GradientBucketer: begin_backward() while the previous step's "
                              "buckets are in flight (call finish() first)");
  pending_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b)
    pending_[b] = buckets_[b].last_slice - buckets_[b].first_slice + 1;
  ready_.assign(grads_.slices().size(), 0);
  next_to_fire_ = 0;
  armed_ = true;
}

void GradientBucketer::on_grad_ready(size_t index) {
  RD_CHECK(index < bucket_of_slice_.size(),
           "GradientBucketer: gradient index " << index << " out of range (" << bucket_of_slice_.size()
                                               << " parameters)");
  if (!armed_) begin_backward();
  if (!sync_ || ready_[index]) return;  // a repeated report changes nothing
  ready_[index] = 1;
  const size_t b = bucket_of_slice_[index];
  if (--pending_[b] == 0 && opts_.overlap) fire_ready_buckets();
}

void GradientBucketer::poll() {
  if (!requests_.empty()) comm_.progress();
}

// Buckets go out strictly in order: every rank must issue collectives in the
// same sequence, whatever order the hooks arrive in.
void GradientBucketer::fire_ready_buckets() {
  while (next_to_fire_ < buckets_.size() && pending_[next_to_fire_] == 0) fire(next_to_fire_++);
}

void GradientBucketer::fire(size_t b) {
  const Bucket& bucket = buckets_[b];
  if (requests_.empty() && progress_) progress_->set_active(true);
  requests_.push_back(comm_.iallreduce(grads_.data() + bucket.offset, bucket.count, ReduceOp::Average));
  stats_.bytes_allreduced += bucket.count * sizeof(float);
  stats_.allreduce_calls += 1;
}

bool GradientBucketer::fire_remaining() {
  if (!armed_) begin_backward();
  armed_ = false;
  if (!sync_) return false;
  while (next_to_fire_ < buckets_.size()) fire(next_to_fire_++);
  return true;
}

void GradientBucketer::finish() {
  const Clock::time_point t0 = Clock::now();
  if (!fire_remaining()) return;
  for (auto& r : requests_) r->wait();
  requests_.clear();
  if (progress_) progress_->set_active(false);
  stats_.exposed_comm_s += std::chrono::duration<double>(Clock::now() - t0).count();
  stats_.steps += 1;
}

void GradientBucketer::finish_on_device() {
  if (!fire_remaining()) return;
  for (auto& r : requests_) r->wait_on_device();
  requests_.clear();
  if (progress_) progress_->set_active(false);
  stats_.steps += 1;
}

void GradientBucketer::count_replayed_pass() {
  armed_ = false;
  if (!sync_) return;
  for (const Bucket& b : buckets_) stats_.bytes_allreduced += b.count * sizeof(float);
  stats_.allreduce_calls += buckets_.size();
  stats_.steps += 1;
}

void broadcast_model(Comm& comm, Arena& params, Arena& buffers) {
  RD_CHECK(params.allocated() && buffers.allocated(), "broadcast_model: arenas not allocated");
  if (comm.size() == 1) return;
  comm.broadcast(params.data(), params.bytes(), 0);
  comm.broadcast(buffers.data(), buffers.bytes(), 0);
}

void SyncBatchNormReducer::allreduce_sum(double* data, size_t count) {
  calls_ += 1;
  bytes_ += count * sizeof(double);
  if (comm_.size() > 1) comm_.allreduce_stream_ordered(data, count, ReduceOp::Sum);
}

uint64_t checksum_bytes(const void* data, size_t bytes, uint64_t seed) {
  // FNV-1a over 64-bit words (then the tail bytes): fast enough to run every step.
  constexpr uint64_t kPrime = 0x100000001b3ULL;
  uint64_t h = seed;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * kPrime;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * kPrime;
  return h;
}

std::string ChecksumReport::describe() const {
  char buf[64];
  std::string s;
  if (identical) {
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(local));
    return "all " + std::to_string(per_rank.size()) + " ranks identical (checksum " + buf + ")";
  }
  s = "ranks differ:";
  for (size_t r = 0; r < per_rank.size(); ++r) {
    std::snprintf(buf, sizeof buf, " rank %zu = %016llx", r,
                  static_cast<unsigned long long>(per_rank[r]));
    s += buf;
  }
  return s;
}

ChecksumReport compare_across_ranks(Comm& hash_comm, Backend& backend, const Arena& arena) {
  RD_CHECK(hash_comm.device() == DeviceKind::CPU,
           "compare_across_ranks needs a host communicator, got '" << hash_comm.name() << "'");
  ChecksumReport rep;
  if (backend.device() == DeviceKind::CPU) {
    rep.local = checksum_bytes(arena.data(), arena.bytes());
  } else {
    // Device memory: hash through a small host window instead of a copy of the arena.
    constexpr size_t kChunk = size_t{1} << 20;  // floats (4 MiB)
    std::vector<float> host(std::min(arena.size(), kChunk));
    rep.local = kChecksumSeed;
    for (size_t off = 0; off < arena.size(); off += kChunk) {
      const size_t n = std::min(kChunk, arena.size() - off);
      backend.copy_to_host(host.data(), arena.data() + off, n * sizeof(float));
      rep.local = checksum_bytes(host.data(), n * sizeof(float), rep.local);
    }
  }
  rep.per_rank.assign(static_cast<size_t>(hash_comm.size()), 0);
  hash_comm.allgather(&rep.local, rep.per_rank.data(), sizeof(uint64_t));
  for (uint64_t h : rep.per_rank) rep.identical = rep.identical && h == rep.per_rank[0];
  return rep;
}

}  // namespace rd::dist
