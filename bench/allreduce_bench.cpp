// All-reduce bandwidth and correctness, nccl-tests convention:
//   algbw = bytes / time,  busbw = algbw * 2 (n - 1) / n
// (busbw is comparable across rank counts: what each link carries).
//   mpirun -np 2 ./allreduce_bench [--comm mpi|nccl] [--min-kb 4] [--max-mb 256] [--seconds 0.3]
// Columns: Comm::allreduce (MPI: MPI_Iallreduce polled, what DDP and SyncBN use; NCCL:
// the NcclComm on device memory), plain blocking MPI_Allreduce (MPI only), and #wrong:
// as in nccl-tests, every timed operation is also run once on a known pattern and its
// result checked exactly (elements wrong, summed over ranks and over the row's
// operations; anything but 0 is a bug). The process exits 1 when any row had a wrong
// element. With MPI, an overlap check follows: an Iallreduce left alone during 300 ms
// of compute vs driven by Comm::progress().
// The NCCL path runs on a GPU build, and on the emulated device
// (build/gpu_emu/allreduce_bench; ctest allreduce_bench_emu_np2, label gpu_emu).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/backend/nccl_comm.h"
#include "resnet_ddp/dist/comm.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/flags.h"

using Clock = std::chrono::steady_clock;
using rd::dist::ReduceOp;

namespace {

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// Seconds per call, timed over at least `budget_s` (and >= 3 calls), the slowest
// rank's time: a collective ends when its last rank does. `control` (host MPI)
// carries the bench's own agreement, so a device communicator's pointers stay
// device pointers.
double time_op(rd::dist::Comm& control, double budget_s, const std::function<void()>& op) {
  op();  // warm-up: connections, buffers
  control.barrier();
  int iters = 0;
  const double t0 = now_s();
  double t = 0;
  do {
    op();
    ++iters;
    t = now_s() - t0;
    // Every rank must run the same number of iterations: decide on rank 0's clock.
    int64_t go_on = t < budget_s || iters < 3;
    control.broadcast(&go_on, sizeof go_on, 0);
    if (!go_on) break;
  } while (true);
  double per = t / iters;
  MPI_Allreduce(MPI_IN_PLACE, &per, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return per;
}

// The check pattern: rank r holds r + 1 + (i mod 7) at element i, small integers, so
// the sum over n ranks, n (n + 1) / 2 + n (i mod 7), is exact in float.
float pattern(int rank, size_t i) { return static_cast<float>(rank + 1 + static_cast<int>(i % 7)); }
float pattern_sum(int n, size_t i) { return static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7)); }

// Where the data lives: host memory (MPI) or a device's (NCCL), with the copies
// the check needs.
struct Buffer {
  float* data = nullptr;
  size_t count = 0;
  std::vector<float> host_storage;
  std::shared_ptr<void> device_storage;
  rd::Backend* device = nullptr;

  Buffer(rd::Backend* be, size_t n) : count(n), device(be) {
    if (be) {
      device_storage = be->allocate(std::max<size_t>(n, 1) * sizeof(float));
      data = static_cast<float*>(device_storage.get());
    } else {
      host_storage.assign(n, 1.0f);
      data = host_storage.data();
    }
  }
  void load(const std::vector<float>& v) {
    if (device)
      device->copy_from_host(data, v.data(), v.size() * sizeof(float));
    else
      std::copy(v.begin(), v.end(), data);
  }
  std::vector<float> read() const {
    std::vector<float> v(count);
    if (device)
      device->copy_to_host(v.data(), data, count * sizeof(float));
    else
      std::copy(data, data + count, v.begin());
    return v;
  }
};

// Runs `op` once on the pattern; this rank's number of wrong elements.
int64_t wrong_elements(Buffer& buf, int rank, int n, const std::function<void()>& op) {
  std::vector<float> v(buf.count);
  for (size_t i = 0; i < v.size(); ++i) v[i] = pattern(rank, i);
  buf.load(v);
  op();
  const std::vector<float> got = buf.read();
  int64_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) wrong += got[i] != pattern_sum(n, i);
  return wrong;
}

void burn(double seconds, rd::dist::Comm* progress) {
  const double end = now_s() + seconds;
  volatile double sink = 0;
  while (now_s() < end) {
    for (int i = 0; i < 20000; ++i) sink = sink + std::sqrt(static_cast<double>(i));
    if (progress) progress->progress();
  }
}

// Does an in-flight MPI all-reduce advance while the rank computes?
void overlap_check(rd::dist::Comm& comm, double max_mb, int rank) {
  const size_t big =
      std::min<size_t>(static_cast<size_t>(16.0 * 1024 * 1024 / 4), static_cast<size_t>(max_mb * 1024 * 1024 / 4));
  std::vector<float> buf(big, 1.0f);
  for (int mode = 0; mode < 2; ++mode) {
    comm.barrier();
    auto req = comm.iallreduce(buf.data(), big, ReduceOp::Sum);
    burn(0.3, mode == 1 ? &comm : nullptr);
    const double t0 = now_s();
    req->wait();
    double wait_s = now_s() - t0;
    comm.allreduce(&wait_s, 1, ReduceOp::Sum);
    if (rank == 0)
      std::printf("# overlap: %zu MB iallreduce, 300 ms compute %s -> wait afterwards %.1f ms (mean of ranks)\n",
                  big * 4 / (1024 * 1024), mode ? "calling progress()" : "without MPI calls",
                  wait_s / comm.size() * 1e3);
  }
}

struct Options {
  std::string comm = "mpi";
  double min_kb = 4, max_mb = 256, budget = 0.3;
};

// The table; returns the wrong elements over all rows and ranks.
int64_t run_table(rd::dist::Comm& control, rd::dist::Comm& comm, rd::Backend* device, const Options& o,
                  const rd::dist::ProcessEnv& env) {
  const int n = comm.size();
  const bool mpi = device == nullptr;
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 0.0;
  if (env.rank == 0) {
    std::printf("# all-reduce (float sum, %s), %d ranks on %s; busbw = algbw * 2(n-1)/n; time: slowest rank\n",
                comm.name().c_str(), n, env.node.c_str());
    std::printf("%12s %12s %10s %10s", "bytes", "comm_us", "algbw_GB/s", "busbw_GB/s");
    if (mpi) std::printf(" %12s %10s", "mpi_blk_us", "busbw_blk");
    std::printf(" %8s\n", "#wrong");
  }
  int64_t total_wrong = 0;
  for (double bytes = o.min_kb * 1024; bytes <= o.max_mb * 1024 * 1024 + 1; bytes *= 4) {
    const size_t count = static_cast<size_t>(bytes) / sizeof(float);
    Buffer buf(device, count);
    const std::function<void()> comm_op = [&] {
      comm.allreduce(buf.data, count, ReduceOp::Sum);
      if (device) device->synchronize();
    };
    const std::function<void()> blk_op = [&] {
      MPI_Allreduce(MPI_IN_PLACE, buf.data, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    const double t_comm = time_op(control, o.budget, comm_op);
    int64_t wrong = wrong_elements(buf, env.rank, n, comm_op);
    double t_blk = 0;
    if (mpi) {
      t_blk = time_op(control, o.budget, blk_op);
      wrong += wrong_elements(buf, env.rank, n, blk_op);
    }
    control.allreduce(&wrong, 1, ReduceOp::Sum);
    total_wrong += wrong;
    if (env.rank == 0) {
      const double algbw = bytes / t_comm / 1e9;
      std::printf("%12.0f %12.1f %10.3f %10.3f", bytes, t_comm * 1e6, algbw, algbw * bus_factor);
      if (mpi) std::printf(" %12.1f %10.3f", t_blk * 1e6, bytes / t_blk / 1e9 * bus_factor);
      std::printf(" %8lld\n", static_cast<long long>(wrong));
      std::fflush(stdout);
    }
  }
  return total_wrong;
}

}  // namespace

int main(int argc, char** argv) {
  auto env = rd::dist::init_process(argc, argv);
  Options o;
  bool help = false;
  try {
    rd::FlagSet fs("", "allreduce_bench");
    fs.choice("--comm", &o.comm, {"mpi", "nccl"}, "communicator: host MPI, or NCCL on each rank's GPU");
    fs.real("--min-kb", &o.min_kb, 0.0, true, "smallest message in KiB");
    fs.real("--max-mb", &o.max_mb, 0.0, true, "largest message in MiB");
    fs.real("--seconds", &o.budget, 0.0, true, "time per message size");
    fs.parse(std::vector<std::string>(argv + 1, argv + argc), false, &help);
    if (help && env.rank == 0)
      std::printf("Usage: mpirun -np N allreduce_bench [flags]\n\nFlags:\n%s", fs.help().c_str());
  } catch (const rd::UsageError& e) {
    if (env.rank == 0) std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    rd::dist::finalize_process();
    return 2;
  }
  if (help) {
    rd::dist::finalize_process();
    return 0;
  }
  int rc = 0;
  try {
    auto control = rd::dist::make_mpi_comm();
    std::unique_ptr<rd::Backend> device;
    std::unique_ptr<rd::dist::Comm> comm;
    if (o.comm == "nccl") {
#ifdef RESNET_DDP_HAVE_CUDA
      rd::BackendOptions bo;
      bo.device_index = env.local_rank;
      device = rd::make_cuda_backend(bo);
      comm = rd::make_nccl_comm(MPI_COMM_WORLD, *device);
#else
      throw rd::Error("--comm nccl: this build has no CUDA backend (configure with -DRESNET_DDP_CUDA=ON)");
#endif
    } else {
      comm = rd::dist::make_mpi_comm();
    }
    const int64_t wrong = run_table(*control, *comm, device.get(), o, env);
    if (!device) overlap_check(*comm, o.max_mb, env.rank);
    if (wrong != 0) {
      if (env.rank == 0) std::fprintf(stderr, "allreduce_bench: %lld wrong elements\n", static_cast<long long>(wrong));
      rc = 1;
    }
    comm.reset();
    device.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: rank %d: %s\n", env.rank, e.what());
    rc = 1;
  }
  rd::dist::finalize_process();
  return rc;
}
