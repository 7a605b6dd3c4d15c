// Which dataset indices each rank visits, with torch.utils.data.DistributedSampler
// semantics:
//  - shuffle: a permutation of 0..n-1 from a generator seeded with seed + epoch.
//    The generator reproduces torch's exactly (torch.randperm on a CPU
//    torch.Generator: MT19937 seeded with seed + epoch, Fisher-Yates with
//    random() % (n - i)), so the same seed gives the same order as PyTorch for
//    n < 2^24 (verified against torch in tests/data).
//  - not drop_last: padded by repeating the first indices until the total is a
//    multiple of world; drop_last: the tail is dropped instead.
//  - rank r takes positions r, r + world, r + 2*world, ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rd::data {

// What the trainer asks of a training sampler: this rank's indices for an epoch.
class EpochSampler {
 public:
  virtual ~EpochSampler() = default;
  virtual void set_epoch(int64_t epoch) = 0;
  virtual std::vector<int64_t> indices() const = 0;
};

class DistributedSampler : public EpochSampler {
 public:
  // Throws rd::UsageError when world < 1 or rank is outside [0, world).
  DistributedSampler(size_t n, int world, int rank, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  void set_epoch(int64_t epoch) override { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  size_t total_size() const { return num_samples_ * static_cast<size_t>(world_); }
  std::vector<int64_t> indices() const override;  // this rank's indices for the current epoch

 private:
  size_t n_;
  int world_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  size_t num_samples_;  // per rank
};

// Repeated augmentation (torchvision references/classification/sampler.py RASampler,
// from DeiT): each index of the seed + epoch permutation repeated `repetitions` times
// in a row, padded from the start to a multiple of world, rank r taking positions
// r, r + world, ...; of those only the first floor((n // 256) * 256 / world) are
// visited (so an epoch sees about n samples, each in `repetitions` augmentations on
// different ranks). Throws rd::UsageError for bad ranks, repetitions < 1, or when
// that count is 0 (n < 256, or n // 256 * 256 < world).
class RASampler : public EpochSampler {
 public:
  RASampler(size_t n, int world, int rank, int repetitions = 3, bool shuffle = true, uint64_t seed = 0);
  void set_epoch(int64_t epoch) override { epoch_ = epoch; }
  size_t num_selected_samples() const { return num_selected_; }
  std::vector<int64_t> indices() const override;

 private:
  size_t n_;
  int world_, rank_, repetitions_;
  bool shuffle_;
  uint64_t seed_;
  int64_t epoch_ = 0;
  size_t num_samples_, num_selected_;
};

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) for n < 2^24.
std::vector<int64_t> torch_randperm(size_t n, uint64_t seed);

// Exact, unpadded sharding for evaluation: rank r takes r, r + world, ... < n, so
// every sample is counted exactly once across ranks (ranks may differ by one).
std::vector<int64_t> shard_exact(size_t n, int world, int rank);

}  // namespace rd::data
