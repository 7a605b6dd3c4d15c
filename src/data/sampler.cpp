#include "resnet_ddp/data/sampler.h"

#include <random>

#include "resnet_ddp/errors.h"

namespace rd::data {

namespace {
void check_ranks(int world, int rank) {
  if (world < 1) throw UsageError("sampler: world size " + std::to_string(world) + " < 1");
  if (rank < 0 || rank >= world)
    throw UsageError("sampler: rank " + std::to_string(rank) + " outside [0, " +
                     std::to_string(world) + ")");
}
}  // namespace

std::vector<int64_t> torch_randperm(size_t n, uint64_t seed) {
  std::vector<int64_t> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = static_cast<int64_t>(i);
  // torch's CPU generator is MT19937 seeded with the low 32 bits of the seed; randperm
  // (n < 2^24) swaps r[i] with r[i + random() % (n - i)].
  std::mt19937 gen(static_cast<uint32_t>(seed));
  for (size_t i = 0; i + 1 < n; ++i) {
    const size_t z = static_cast<size_t>(gen()) % (n - i);
    std::swap(r[i], r[i + z]);
  }
  return r;
}

DistributedSampler::DistributedSampler(size_t n, int world, int rank, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : n_(n), world_(world), rank_(rank), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  check_ranks(world, rank);
  const size_t w = static_cast<size_t>(world);
  num_samples_ = (drop_last && n % w != 0) ? n / w : (n + w - 1) / w;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all;
  if (shuffle_) {
    all = torch_randperm(n_, seed_ + static_cast<uint64_t>(epoch_));
  } else {
    all.resize(n_);
    for (size_t i = 0; i < n_; ++i) all[i] = static_cast<int64_t>(i);
  }
  const size_t total = total_size();
  if (!drop_last_) {
    // Pad by repeating the list from the start (several times if n < padding).
    const size_t base = all.size();
    for (size_t i = 0; all.size() < total && base > 0; ++i) all.push_back(all[i % base]);
  } else {
    all.resize(total);
  }
  std::vector<int64_t> mine;
  mine.reserve(num_samples_);
  for (size_t i = static_cast<size_t>(rank_); i < total; i += static_cast<size_t>(world_))
    mine.push_back(all[i]);
  return mine;
}

RASampler::RASampler(size_t n, int world, int rank, int repetitions, bool shuffle, uint64_t seed)
    : n_(n), world_(world), rank_(rank), repetitions_(repetitions), shuffle_(shuffle), seed_(seed) {
  check_ranks(world, rank);
  if (repetitions < 1) throw UsageError("--ra-reps " + std::to_string(repetitions) + " must be >= 1");
  const size_t w = static_cast<size_t>(world);
  num_samples_ = (n * static_cast<size_t>(repetitions) + w - 1) / w;  // ceil(n * reps / world)
  num_selected_ = n / 256 * 256 / w;                                  // floor(n // 256 * 256 / world)
  if (num_selected_ == 0)
    throw UsageError("--ra-sampler: RASampler visits floor((n // 256) * 256 / world) samples per rank, which is 0 "
                     "for the training set's " + std::to_string(n) + " samples on " + std::to_string(world) +
                     " ranks (it needs at least 256 samples, and (n // 256) * 256 >= world)");
}

std::vector<int64_t> RASampler::indices() const {
  std::vector<int64_t> perm;
  if (shuffle_) {
    perm = torch_randperm(n_, seed_ + static_cast<uint64_t>(epoch_));
  } else {
    perm.resize(n_);
    for (size_t i = 0; i < n_; ++i) perm[i] = static_cast<int64_t>(i);
  }
  const size_t reps = static_cast<size_t>(repetitions_), w = static_cast<size_t>(world_);
  const size_t total = num_samples_ * w, repeated = n_ * reps;
  // Position p of the repeated list (each index `reps` times in a row), padded by
  // repeating its start: element (p mod repeated) of it.
  std::vector<int64_t> mine;
  mine.reserve(num_selected_);
  for (size_t p = static_cast<size_t>(rank_); p < total && mine.size() < num_selected_; p += w)
    mine.push_back(perm[(p % repeated) / reps]);
  return mine;
}

std::vector<int64_t> shard_exact(size_t n, int world, int rank) {
  check_ranks(world, rank);
  std::vector<int64_t> mine;
  for (size_t i = static_cast<size_t>(rank); i < n; i += static_cast<size_t>(world))
    mine.push_back(static_cast<int64_t>(i));
  return mine;
}

}  // namespace rd::data
