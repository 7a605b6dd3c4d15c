// The proof that DDP is right: N ranks with per-rank batch b train exactly like
// one process with the combined batch of N*b samples.
//   - SyncBN on: 1 process, batch N*b, plain BN  ==  N ranks, batch b, SyncBN.
//   - SyncBN off: 1 process accumulating N micro-batches of b  ==  N ranks, batch b
//     (each BN then sees b samples in both).
// Each for overlap on/off and bucket sizes that split parameters oddly; after
// every step all ranks hold bit-identical parameters. Runs under mpirun with
// 2, 3 and 4 ranks; every rank also computes the single-process reference.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/dist/comm.h"
#include "resnet_ddp/dist/ddp.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/train/optimizer.h"
#include "resnet_ddp/train/train_step.h"

using namespace rd;
using namespace rd::dist;

namespace {

// 64 px, not 32: at 32 px the last stage is 1x1, and batch norm over b = 2 single
// pixels outputs exactly +-1 whatever its input, so the gradients feeding it are
// pure rounding noise that Adam (which normalises by |g|) turns into +-lr steps.
constexpr int kPixels = 64;
constexpr int kPerRank = 2;  // b
constexpr int kClasses = 3;
constexpr int kSteps = 3;
constexpr float kLr = 1e-3f;

Comm& world() {
  static std::unique_ptr<Comm> comm = make_mpi_comm();
  return *comm;
}
Backend& backend() {
  static std::unique_ptr<Backend> be = [] {
    BackendOptions o;
    o.threads = 1;
    // Direct convolution: its rounding does not depend on the batch split, so N ranks
    // match the one-process reference to 1e-5 after several Adam steps. (Winograd's
    // larger rounding differences get amplified by Adam on near-zero gradients.)
    o.conv_algo = ConvAlgo::Direct;
    return make_cpu_backend(o);
  }();
  return *be;
}

// A fixed set of samples per step, the same on every rank.
struct Batch {
  std::vector<float> images;  // n x 3 x 32 x 32, NCHW
  std::vector<int32_t> labels;
};
Batch make_batch(int step, int n) {
  std::mt19937 gen(1000 + step);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Batch b;
  b.images.resize(static_cast<size_t>(n) * 3 * kPixels * kPixels);
  for (float& x : b.images) x = u(gen);
  for (int i = 0; i < n; ++i) b.labels.push_back((i * 7 + step) % kClasses);
  return b;
}

// Samples [first, first + n) of `batch` in the model's input buffer.
const Tensor& load(ResNet& model, const Batch& batch, int first, int n) {
  const size_t per_image = 3 * kPixels * kPixels;
  Tensor& in = model.input_buffer(n, kPixels, kPixels);
  model.backend().copy_from_host_nchw(batch.images.data() + first * per_image, in);
  return in;
}

train::OptimizerConfig adam_config() {
  train::OptimizerConfig c;  // Adam
  c.lr = kLr;
  return c;
}

std::vector<float> host_copy(const Arena& a) {
  std::vector<float> v(a.size());
  backend().copy_to_host(v.data(), a.data(), a.bytes());
  return v;
}

ResNetConfig tiny_config(uint64_t seed) {
  ResNetConfig c;
  c.arch = "resnet_tiny";
  c.head = HeadKind::Mlp;
  c.num_classes = kClasses;
  c.init_seed = seed;
  return c;
}

// Single process. sync_bn: one batch of N*b; otherwise N accumulated micro-batches of b.
struct Reference {
  std::vector<float> params, buffers;
  std::vector<float> first_grads;  // gradient of step 0, before any update
};
Reference train_reference(int ranks, bool sync_bn) {
  ResNet model(backend(), tiny_config(7));
  model.train(true);
  train::Optimizer adam(backend(), model.params(), model.grads(), adam_config());
  train::TrainStep one_process(model, adam, nullptr, 0.0f);
  std::vector<float> first_grads;
  for (int step = 0; step < kSteps; ++step) {
    Batch batch = make_batch(step, ranks * kPerRank);
    if (sync_bn) {
      one_process.forward(load(model, batch, 0, ranks * kPerRank), batch.labels.data());
      one_process.backward_and_reduce();
    } else {
      for (int r = 0; r < ranks; ++r) {
        one_process.forward(load(model, batch, r * kPerRank, kPerRank), batch.labels.data() + r * kPerRank, r, ranks);
        one_process.backward_and_reduce();
      }
    }
    if (step == 0) first_grads = host_copy(model.grads());
    one_process.update();
  }
  return {host_copy(model.params()), host_copy(model.buffers()), first_grads};
}

// Relative difference of each parameter tensor, ||a - b|| / ||b||. Element-wise
// ratios are no use after Adam: an element whose gradient is ~0 moves by +-lr
// whatever its size, so rounding-level gradient noise shows up as a large ratio
// on a single element while the tensor as a whole agrees.
struct Relative {
  double max_abs = 0;     // max |a - b| over all elements
  double whole = 0;       // over the whole arena
  double worst = 0;       // worst single tensor
  std::string worst_name;
};
Relative compare(const Arena& arena, const std::vector<float>& got, const std::vector<float>& want) {
  Relative r;
  double all_d2 = 0, all_w2 = 0;
  for (const ParamSlice& s : arena.slices()) {
    double d2 = 0, w2 = 0;
    for (size_t i = s.offset; i < s.offset + s.count; ++i) {
      const double d = double(got[i]) - want[i];
      r.max_abs = std::max(r.max_abs, std::fabs(d));
      d2 += d * d;
      w2 += double(want[i]) * want[i];
    }
    const double rel = std::sqrt(d2 / std::max(w2, 1e-30));
    if (rel > r.worst) r.worst = rel, r.worst_name = s.name;
    all_d2 += d2;
    all_w2 += w2;
  }
  r.whole = std::sqrt(all_d2 / std::max(all_w2, 1e-30));
  return r;
}

struct Case {
  bool sync_bn;
  bool overlap;
  double bucket_mb;
  bool progress_thread = false;
  int accum_steps = 1;  // per-rank micro-batches per step (SyncBN off only)
};

void run_case(const Case& cs) {
  Comm& comm = world();
  const int n = comm.size();
  CAPTURE(n, cs.sync_bn, cs.overlap, cs.bucket_mb, cs.progress_thread, cs.accum_steps);

  // The reference sees the same samples: N ranks x accum micro-batches of b.
  Reference ref = train_reference(n * cs.accum_steps, cs.sync_bn && cs.accum_steps == 1);

  // Each rank starts from a different initialisation: broadcast must fix that.
  ResNet model(backend(), tiny_config(7 + 100 * static_cast<uint64_t>(comm.rank())));
  model.train(true);
  broadcast_model(comm, model.params(), model.buffers());
  SyncBatchNormReducer reducer(comm);
  if (cs.sync_bn) model.set_batchnorm_reducer(&reducer);
  BucketOptions bo;
  bo.bucket_mb = cs.bucket_mb;
  bo.first_bucket_mb = std::min(1.0, cs.bucket_mb);
  bo.overlap = cs.overlap;
  bo.progress_thread = cs.progress_thread;
  GradientBucketer bucketer(comm, model.grads(), bo);
  train::Optimizer adam(backend(), model.params(), model.grads(), adam_config());
  train::TrainStep ddp(model, adam, &bucketer, 0.0f);

  for (int step = 0; step < kSteps; ++step) {
    Batch batch = make_batch(step, n * cs.accum_steps * kPerRank);
    for (int micro = 0; micro < cs.accum_steps; ++micro) {
      // Reference order: micro-batch index = micro * n + rank... any fixed
      // assignment works because the reference sums all of them.
      const int first = (micro * n + comm.rank()) * kPerRank;
      ddp.forward(load(model, batch, first, kPerRank), batch.labels.data() + first, micro, cs.accum_steps);
      ddp.backward_and_reduce();
    }
    if (step == 0) {
      Relative g = compare(model.grads(), host_copy(model.grads()), ref.first_grads);
      INFO("step-0 gradients: whole " << g.whole << ", worst tensor " << g.worst_name << " "
                                      << g.worst);
      CHECK(g.worst <= 1e-5);
      if (std::getenv("RD_DDP_TEST_VERBOSE") && comm.rank() == 0)
        std::printf("  grads (syncbn %d overlap %d bucket %.2f accum %d): whole %.2e worst %s %.2e\n",
                    cs.sync_bn, cs.overlap, cs.bucket_mb, cs.accum_steps, g.whole,
                    g.worst_name.c_str(), g.worst);
    }
    ddp.update();
    ChecksumReport rep = compare_across_ranks(comm, backend(), model.params());
    INFO("step " << step << ": " << rep.describe());
    CHECK(rep.identical);
  }

  Relative p = compare(model.params(), host_copy(model.params()), ref.params);
  INFO("params: whole " << p.whole << ", worst tensor " << p.worst_name << " " << p.worst
                        << ", max_abs " << p.max_abs);
  CHECK(p.whole <= 1e-5);
  // Per element: no parameter moved differently by more than a tenth of one
  // Adam step (an element with a ~0 gradient may legitimately differ by less).
  CHECK(p.max_abs <= 0.1 * kLr);
  if (cs.sync_bn) {
    // Global batch statistics: running stats match the big-batch reference too.
    Relative b = compare(model.buffers(), host_copy(model.buffers()), ref.buffers);
    INFO("buffers: whole " << b.whole << ", worst tensor " << b.worst_name << " " << b.worst);
    CHECK(b.worst <= 1e-5);
    CHECK(reducer.calls() > 0);
  }
  if (std::getenv("RD_DDP_TEST_VERBOSE") && comm.rank() == 0)
    std::printf("n=%d syncbn=%d overlap=%d bucket=%.2fMB buckets=%zu accum=%d: params rel %.2e, "
                "worst %s %.2e, max_abs %.2e\n", n, cs.sync_bn, cs.overlap, cs.bucket_mb,
                bucketer.buckets().size(), cs.accum_steps, p.whole, p.worst_name.c_str(), p.worst,
                p.max_abs);
  const DdpStats& st = bucketer.stats();
  CHECK(st.steps == static_cast<uint64_t>(kSteps));
  size_t param_floats = 0;
  for (const ParamSlice& s : model.params().slices()) param_floats += s.count;
  CHECK(st.bytes_allreduced >= static_cast<uint64_t>(kSteps) * param_floats * sizeof(float));
}

}  // namespace

TEST_CASE("DDP with SyncBN equals one process on the combined batch", "[ddp]") {
  run_case({true, true, 25.0});
  run_case({true, false, 25.0});
  run_case({true, true, 0.01});
  run_case({true, false, 0.01});
}

TEST_CASE("DDP without SyncBN equals one process accumulating the per-rank batches", "[ddp]") {
  run_case({false, true, 25.0});
  run_case({false, true, 0.01});
  run_case({false, false, 0.01});
}

TEST_CASE("gradient accumulation: no communication until the last micro-batch", "[ddp]") {
  run_case({false, true, 0.01, false, 2});
  run_case({false, false, 0.01, false, 2});
  run_case({false, false, 25, false, 2});
}

TEST_CASE("a progress thread gives the same result", "[ddp]") {
  run_case({true, true, 0.01, true});
}

TEST_CASE("buckets tile the gradient arena in reverse parameter order", "[ddp]") {
  ResNet model(backend(), tiny_config(1));
  const Arena& g = model.grads();
  for (double mb : {25.0, 0.05, 0.01, 1e-6}) {
    CAPTURE(mb);
    auto buckets = plan_buckets(g, std::min(1.0, mb), mb);
    REQUIRE(!buckets.empty());
    // Bucket 0 holds the last parameters; consecutive buckets abut.
    CHECK(buckets.front().last_slice == g.slices().size() - 1);
    CHECK(buckets.back().first_slice == 0);
    CHECK(buckets.back().offset == 0);
    size_t covered = 0;
    for (size_t i = 0; i < buckets.size(); ++i) {
      const Bucket& b = buckets[i];
      CHECK(b.first_slice <= b.last_slice);
      if (i + 1 < buckets.size()) {
        CHECK(buckets[i + 1].last_slice + 1 == b.first_slice);
        CHECK(buckets[i + 1].offset + buckets[i + 1].count <= b.offset);
      }
      // Only the last-closed bucket may be under its capacity.
      if (i + 1 < buckets.size()) {
        const double cap = (i == 0 ? std::min(1.0, mb) : mb) * 1024 * 1024;
        CHECK(double(b.count) * sizeof(float) >= cap);
      }
      covered += b.last_slice - b.first_slice + 1;
    }
    CHECK(covered == g.slices().size());
  }
  // 1e-6 MB is below any parameter: one bucket per parameter.
  CHECK(plan_buckets(g, 1e-6, 1e-6).size() == g.slices().size());
  CHECK(plan_buckets(g, 1.0, 25.0).size() == 1);  // the tiny model fits the first bucket
}
