// DDP overhead: training-step time without gradient all-reduce, with buckets
// overlapped with backward, and with one all-reduce after backward; exposed
// communication (time finish() waits) as a share of the step.
//   mpirun -np 2 ./ddp_overhead_bench [--arch resnet18] [--batch 8] [--pixels 64]
//        [--steps 5] [--bucket-mb 25] [--threads N] [--no-progress-thread]
#include <chrono>
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

using Clock = std::chrono::steady_clock;
using namespace rd;
using namespace rd::dist;

namespace {

struct Options {
  std::string arch = "resnet18";
  int batch = 8;
  int pixels = 64;
  int steps = 5;
  double bucket_mb = 25;
  int threads = 0;
  bool progress_thread = true;
};

int positive_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || x < 1 || x > 1 << 20) throw UsageError(flag + " '" + v + "': expected a positive integer");
  return static_cast<int>(x);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--arch") o.arch = value(), validate_arch(o.arch);
    else if (a == "--batch") o.batch = positive_int(a, value());
    else if (a == "--pixels") o.pixels = positive_int(a, value());
    else if (a == "--steps") o.steps = positive_int(a, value());
    else if (a == "--threads") o.threads = positive_int(a, value());
    else if (a == "--bucket-mb") o.bucket_mb = parse_bucket_mb(value());
    else if (a == "--no-progress-thread") o.progress_thread = false;
    else throw UsageError("unknown argument '" + a + "'");
  }
  if (o.pixels < 32) throw UsageError("--pixels must be at least 32");
  return o;
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct Result {
  double step_s = 0;
  double exposed_s = 0;
};

// mode 0: no DDP; 1: overlapped buckets; 2: all-reduce after backward.
Result run(ResNet& model, Comm& comm, const Options& o, int mode, const std::vector<float>& images,
           const std::vector<int32_t>& labels) {
  Backend& be = model.backend();
  BucketOptions bo;
  bo.bucket_mb = o.bucket_mb;
  bo.overlap = mode == 1;
  bo.progress_thread = o.progress_thread;
  GradientBucketer bucketer(comm, model.grads(), bo);
  std::vector<float> m(model.params().size()), v(model.params().size());
  Tensor dlogits = be.matrix(o.batch, model.config().num_classes);
  Result r;
  for (int step = -1; step < o.steps; ++step) {  // step -1 warms up (allocations, plans)
    comm.barrier();
    const auto t0 = Clock::now();
    const double exposed0 = bucketer.stats().exposed_comm_s;
    Tensor& in = model.input_buffer(o.batch, o.pixels, o.pixels);
    be.copy_from_host_nchw(images.data(), in);
    const Tensor& logits = model.forward(in);
    be.softmax_xent(logits, labels.data(), 0.0f, 1.0f, &dlogits, nullptr);
    if (mode == 0) {
      model.backward(dlogits, false, nullptr);
    } else {
      bucketer.begin_backward();
      model.backward(dlogits, false, &bucketer);
      bucketer.finish();
    }
    be.adam_step(model.params().data(), model.grads().data(), m.data(), v.data(),
                 model.params().size(), rd::math::AdamArgs{.lr = 1e-4f, .step = step + 2});
    const double dt = seconds(t0, Clock::now());
    if (step >= 0) {
      r.step_s += dt;
      r.exposed_s += bucketer.stats().exposed_comm_s - exposed0;
    }
  }
  r.step_s /= o.steps;
  r.exposed_s /= o.steps;
  // The slowest rank sets the pace.
  double both[2] = {r.step_s, r.exposed_s};
  comm.allreduce(both, 2, ReduceOp::Average);
  return {both[0], both[1]};
}

}  // namespace

int main(int argc, char** argv) {
  auto env = init_process(argc, argv);
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const UsageError& e) {
    if (env.rank == 0) std::fprintf(stderr, "ddp_overhead_bench: %s\n", e.what());
    finalize_process();
    return 2;
  }
  try {
    auto comm = make_mpi_comm();
    BackendOptions bo;
    bo.threads = o.threads ? o.threads : default_threads_per_rank(env);
    auto be = make_cpu_backend(bo);
    ResNetConfig cfg;
    cfg.arch = o.arch;
    cfg.num_classes = 3;
    ResNet model(*be, cfg);
    model.train(true);
    broadcast_model(*comm, model.params(), model.buffers());

    std::mt19937 gen(42 + env.rank);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> images(static_cast<size_t>(o.batch) * 3 * o.pixels * o.pixels);
    for (float& x : images) x = u(gen);
    std::vector<int32_t> labels(o.batch);
    for (int i = 0; i < o.batch; ++i) labels[i] = i % 3;

    if (env.rank == 0)
      std::printf("# DDP overhead: %s, %d ranks x batch %d at %d px, %d threads/rank, %.1f MB of "
                  "gradients, bucket %.1f MB%s\n",
                  o.arch.c_str(), env.world, o.batch, o.pixels, bo.threads,
                  model.params().bytes() / 1048576.0, o.bucket_mb,
                  o.progress_thread ? ", progress thread" : ", no progress thread");
    const char* names[3] = {"no all-reduce", "overlap on", "overlap off"};
    Result base;
    Result results[3];
    for (int mode = 0; mode < 3; ++mode) {
      Result r = run(model, *comm, o, mode, images, labels);
      results[mode] = r;
      if (mode == 0) base = r;
      if (env.rank == 0)
        std::printf("%-14s step %8.1f ms  exposed comm %7.1f ms (%5.1f%% of step)  overhead vs no "
                    "all-reduce %+6.1f%%\n",
                    names[mode], r.step_s * 1e3, r.exposed_s * 1e3, 100 * r.exposed_s / r.step_s,
                    100 * (r.step_s / base.step_s - 1));
    }
    // Machine-readable summary for bench/run_bench.sh (milliseconds, mean over the timed steps).
    if (env.rank == 0)
      std::printf("RESULT_JSON {\"arch\": \"%s\", \"ranks\": %d, \"batch\": %d, \"pixels\": %d, "
                  "\"threads\": %d, \"steps\": %d, \"bucket_mb\": %.3f, \"grad_mb\": %.3f, "
                  "\"progress_thread\": %s, \"no_allreduce_ms\": %.3f, \"overlap_on_ms\": %.3f, "
                  "\"overlap_on_exposed_ms\": %.3f, \"overlap_off_ms\": %.3f, \"overlap_off_exposed_ms\": %.3f}\n",
                  o.arch.c_str(), env.world, o.batch, o.pixels, bo.threads, o.steps, o.bucket_mb,
                  model.params().bytes() / 1048576.0, o.progress_thread ? "true" : "false",
                  results[0].step_s * 1e3, results[1].step_s * 1e3, results[1].exposed_s * 1e3,
                  results[2].step_s * 1e3, results[2].exposed_s * 1e3);
    comm.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_overhead_bench: rank %d: %s\n", env.rank, e.what());
    abort_job(1);
  }
  finalize_process();
  return 0;
}
