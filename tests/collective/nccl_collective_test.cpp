// The NCCL communicator on device memory: every op on sizes 0, 1, 7, 2^20+3
// against exact expected values. Exits 77 (skipped) without a CUDA build or GPU,
// or when a node has more ranks than GPUs.
#include <cstdio>
#include <cstring>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/backend/nccl_comm.h"
#include "resnet_ddp/dist/comm.h"

namespace {

constexpr int kSkip = 77;

#ifdef RESNET_DDP_HAVE_CUDA
int failures = 0;
void expect(bool ok, const char* what, size_t n, int rank) {
  if (ok) return;
  ++failures;
  std::fprintf(stderr, "rank %d: FAILED %s (n=%zu)\n", rank, what, n);
}

int run_checks(const rd::dist::ProcessEnv& env) {
  rd::BackendOptions bo;
  bo.device_index = env.local_rank;
  bo.collective_timeout_s = rd::dist::collective_timeout_s();
  auto be = rd::make_cuda_backend(bo);
  auto comm = rd::make_nccl_comm(MPI_COMM_WORLD, *be);
  const int n = comm->size(), r = comm->rank();
  const size_t sizes[] = {0, 1, 7, (size_t{1} << 20) + 3};
  for (size_t count : sizes) {
    const size_t bytes = count * sizeof(float);
    auto mem = be->allocate(std::max<size_t>(bytes, 4) * static_cast<size_t>(n));
    float* dev = static_cast<float*>(mem.get());
    std::vector<float> host(count), got(count * static_cast<size_t>(n));
    auto fill = [&](int who) {
      for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>(who + 1 + static_cast<int>(i % 7));
    };
    auto sum_at = [&](size_t i) { return static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7)); };

    for (int avg = 0; avg < 2; ++avg) {
      fill(r);
      be->copy_from_host(dev, host.data(), bytes);
      comm->allreduce(dev, count, avg ? rd::dist::ReduceOp::Average : rd::dist::ReduceOp::Sum);
      be->copy_to_host(got.data(), dev, bytes);
      bool ok = true;
      for (size_t i = 0; i < count; ++i) {
        float want = sum_at(i);
        if (avg) want /= static_cast<float>(n);
        ok = ok && got[i] == want;
      }
      expect(ok, avg ? "allreduce average" : "allreduce sum", count, r);
    }
    fill(r);
    be->copy_from_host(dev, host.data(), bytes);
    comm->iallreduce(dev, count, rd::dist::ReduceOp::Sum)->wait();
    be->copy_to_host(got.data(), dev, bytes);
    bool ok = true;
    for (size_t i = 0; i < count; ++i) ok = ok && got[i] == sum_at(i);
    expect(ok, "iallreduce", count, r);

    for (int root = 0; root < n; ++root) {
      fill(r == root ? root : 99);
      be->copy_from_host(dev, host.data(), bytes);
      comm->broadcast(dev, bytes, root);
      be->copy_to_host(got.data(), dev, bytes);
      fill(root);
      expect(std::memcmp(got.data(), host.data(), bytes) == 0, "broadcast", count, r);
    }

    if (r == 0) {
      for (int peer = 1; peer < n; ++peer) {
        fill(peer);
        be->copy_from_host(dev, host.data(), bytes);
        comm->send(dev, bytes, peer, 0);
      }
    } else {
      comm->recv(dev, bytes, 0, 0);
      be->copy_to_host(got.data(), dev, bytes);
      fill(r);
      expect(std::memcmp(got.data(), host.data(), bytes) == 0, "send/recv", count, r);
    }

    fill(r);
    auto gathered = be->allocate(std::max<size_t>(bytes, 4) * static_cast<size_t>(n));
    be->copy_from_host(dev, host.data(), bytes);
    comm->allgather(dev, gathered.get(), bytes);
    be->copy_to_host(got.data(), gathered.get(), bytes * static_cast<size_t>(n));
    ok = true;
    for (int who = 0; who < n; ++who) {
      fill(who);
      ok = ok && std::memcmp(got.data() + static_cast<size_t>(who) * count, host.data(), bytes) == 0;
    }
    expect(ok, "allgather", count, r);
    comm->barrier();
  }
  return failures;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  auto env = rd::dist::init_process(argc, argv);
  // Every rank must agree on skipping, or some would wait for the others.
  auto control = rd::dist::make_mpi_comm();
  int64_t cannot = 1;
#ifdef RESNET_DDP_HAVE_CUDA
  cannot = env.local_rank >= rd::cuda_device_count() ? 1 : 0;
#endif
  control->allreduce(&cannot, 1, rd::dist::ReduceOp::Sum);
  int rc = kSkip;
  if (cannot) {
    if (env.rank == 0) std::printf("nccl_collective_test: skipped (no CUDA build, or fewer GPUs than ranks per node)\n");
  } else {
#ifdef RESNET_DDP_HAVE_CUDA
    int64_t failed = run_checks(env) ? 1 : 0;
    control->allreduce(&failed, 1, rd::dist::ReduceOp::Sum);
    rc = failed ? 1 : 0;
    if (env.rank == 0) std::printf("nccl_collective_test: %s\n", failed ? "FAILED" : "all checks passed");
#endif
  }
  control.reset();
  rd::dist::finalize_process();
  return rc;
}
