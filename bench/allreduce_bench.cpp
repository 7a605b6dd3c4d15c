// All-reduce bandwidth, nccl-tests convention:
//   algbw = bytes / time,  busbw = algbw * 2 (n - 1) / n
// (busbw is comparable across rank counts: what each link carries).
//   mpirun -np 2 ./allreduce_bench [--min-kb 4] [--max-mb 256] [--seconds 0.3]
// Three columns of timings: Comm::allreduce (MPI_Iallreduce polled, what DDP
// and SyncBN use), plain blocking MPI_Allreduce, and an overlap check: an
// Iallreduce left alone during 300 ms of compute vs driven by Comm::progress().
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "resnet_ddp/dist/comm.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/flags.h"

using Clock = std::chrono::steady_clock;
using rd::dist::ReduceOp;

namespace {

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// Mean seconds per call, timed over at least `budget_s` (and >= 3 calls), the
// slowest rank's time (a collective ends when its last rank does).
template <class F> double time_op(rd::dist::Comm& comm, double budget_s, F&& op) {
  op();  // warm-up: connections, buffers
  comm.barrier();
  int iters = 0;
  const double t0 = now_s();
  double t = 0;
  do {
    op();
    ++iters;
    t = now_s() - t0;
    // Every rank must run the same number of iterations: decide on rank 0's clock.
    int64_t go_on = t < budget_s || iters < 3;
    comm.broadcast(&go_on, sizeof go_on, 0);
    if (!go_on) break;
  } while (true);
  double per = t / iters;
  comm.allreduce(&per, 1, ReduceOp::Sum);  // average the ranks' views; max would also do
  return per / comm.size();
}

void burn(double seconds, rd::dist::Comm* progress) {
  const double end = now_s() + seconds;
  volatile double sink = 0;
  while (now_s() < end) {
    for (int i = 0; i < 20000; ++i) sink = sink + std::sqrt(static_cast<double>(i));
    if (progress) progress->progress();
  }
}

}  // namespace

int main(int argc, char** argv) {
  auto env = rd::dist::init_process(argc, argv);
  double min_kb = 4, max_mb = 256, budget = 0.3;
  bool help = false;
  try {
    rd::FlagSet fs("", "allreduce_bench");
    fs.real("--min-kb", &min_kb, 0.0, true, "smallest message in KiB");
    fs.real("--max-mb", &max_mb, 0.0, true, "largest message in MiB");
    fs.real("--seconds", &budget, 0.0, true, "time per message size");
    fs.parse(std::vector<std::string>(argv + 1, argv + argc), false, &help);
    if (help && env.rank == 0) std::printf("Usage: mpirun -np N allreduce_bench [flags]\n\nFlags:\n%s", fs.help().c_str());
  } catch (const rd::UsageError& e) {
    if (env.rank == 0) std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    rd::dist::finalize_process();
    return 2;
  }
  if (help) {
    rd::dist::finalize_process();
    return 0;
  }
  auto comm = rd::dist::make_mpi_comm();
  const int n = comm->size();
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;
  if (env.rank == 0) {
    std::printf("# all-reduce (float sum), %d ranks on %s; busbw = algbw * 2(n-1)/n\n", n, env.node.c_str());
    std::printf("%12s %12s %10s %10s %12s %10s\n", "bytes", "comm_us", "algbw_GB/s", "busbw_GB/s",
                "mpi_blk_us", "busbw_blk");
  }
  for (double bytes = min_kb * 1024; bytes <= max_mb * 1024 * 1024 + 1; bytes *= 4) {
    const size_t count = static_cast<size_t>(bytes) / sizeof(float);
    std::vector<float> buf(count, 1.0f);
    const double t_comm = time_op(*comm, budget, [&] { comm->allreduce(buf.data(), count, ReduceOp::Sum); });
    const double t_blk = time_op(*comm, budget, [&] {
      MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    if (env.rank == 0) {
      const double algbw = bytes / t_comm / 1e9;
      std::printf("%12.0f %12.1f %10.3f %10.3f %12.1f %10.3f\n", bytes, t_comm * 1e6, algbw,
                  algbw * bus_factor, t_blk * 1e6, bytes / t_blk / 1e9 * bus_factor);
      std::fflush(stdout);
    }
  }

  // Overlap: does an in-flight all-reduce advance while the rank computes?
  const size_t big = std::min<size_t>(static_cast<size_t>(16.0 * 1024 * 1024 / 4),
                                      static_cast<size_t>(max_mb * 1024 * 1024 / 4));
  std::vector<float> buf(big, 1.0f);
  for (int mode = 0; mode < 2; ++mode) {
    comm->barrier();
    auto req = comm->iallreduce(buf.data(), big, ReduceOp::Sum);
    burn(0.3, mode == 1 ? comm.get() : nullptr);
    const double t0 = now_s();
    req->wait();
    double wait_s = now_s() - t0;
    comm->allreduce(&wait_s, 1, ReduceOp::Sum);
    if (env.rank == 0)
      std::printf("# overlap: %zu MB iallreduce, 300 ms compute %s -> wait afterwards %.1f ms\n",
                  big * 4 / (1024 * 1024), mode ? "calling progress()" : "without MPI calls",
                  wait_s / n * 1e3);
  }
  comm.reset();
  rd::dist::finalize_process();
  return 0;
}
