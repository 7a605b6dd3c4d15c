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
#include "resnet_ddp/flags.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/train/optimizer.h"
#include "resnet_ddp/train/train_step.h"

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

const char* kUsage =
    "Usage: mpirun -np N ddp_overhead_bench [flags]\n\n"
    "Training-step time without gradient all-reduce, with buckets overlapped with backward,\n"
    "and with one all-reduce after backward.\n\nFlags:\n";

// Throws UsageError naming the flag; *help is set for --help (rank 0 prints the text).
Options parse(int argc, char** argv, int rank, bool* help) {
  Options o;
  FlagSet fs("", "ddp_overhead_bench");
  fs.text("--arch", &o.arch, "ARCH", "resnet18 | resnet34 | resnet50 | resnet_tiny");
  fs.integer("--batch", &o.batch, 1, "images per rank per step", 1 << 20);
  fs.integer("--pixels", &o.pixels, 32, "square image size", 1 << 20);
  fs.integer("--steps", &o.steps, 1, "timed steps per mode", 1 << 20);
  fs.integer("--threads", &o.threads, 0, "compute threads per rank (0 = cores / ranks on node)", 1 << 20);
  fs.real("--bucket-mb", &o.bucket_mb, 0.0, true, "gradient bucket size in MiB");
  fs.negated("--no-progress-thread", &o.progress_thread, "no helper thread driving MPI progress");
  fs.parse(std::vector<std::string>(argv + 1, argv + argc), false, help);
  if (*help && rank == 0) std::printf("%s%s", kUsage, fs.help().c_str());
  validate_arch(o.arch);
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
  train::Optimizer adam(be, model.params(), model.grads(), train::OptimizerConfig{});  // lr 1e-4
  train::TrainStep step(model, adam, mode == 0 ? nullptr : &bucketer, 0.0f);
  Result r;
  for (int i = -1; i < o.steps; ++i) {  // step -1 warms up (allocations, plans)
    comm.barrier();
    const auto t0 = Clock::now();
    const double exposed0 = bucketer.stats().exposed_comm_s;
    Tensor& in = model.input_buffer(o.batch, o.pixels, o.pixels);
    be.copy_from_host_nchw(images.data(), in);
    step.forward(in, labels.data());
    step.backward_and_reduce();
    step.update();
    const double dt = seconds(t0, Clock::now());
    if (i >= 0) {
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
  bool help = false;
  try {
    o = parse(argc, argv, env.rank, &help);
  } catch (const UsageError& e) {
    if (env.rank == 0) std::fprintf(stderr, "ddp_overhead_bench: %s\n", e.what());
    finalize_process();
    return 2;
  }
  if (help) {
    finalize_process();
    return 0;
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
