// The NCCL communicator (src/backend/cuda/nccl_comm.cpp) on the emulated device
// when a peer never joins: rank 0's all-reduce must fail by the collective deadline
// (RD_COLLECTIVE_TIMEOUT_S, set short by the test) with an error that names it,
// abort the communicator with the operation still pending, and tear down without
// hanging; the other ranks' communicators are destroyed normally. Twice: a blocking
// all-reduce, then a gradient bucket the device alone waits for (Request::wait_on_device,
// as a replayed backward does), which the host meets at its next read-back of queued
// copies (Backend::wait_queued_copies): that wait must be bounded by the same deadline.
// 2+ ranks.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/backend/nccl_comm.h"
#include "resnet_ddp/dist/comm.h"

namespace {

// Rank 0's error must say the wait timed out and the communicator was aborted.
int check_timeout_error(const char* what, const std::exception& e) {
  std::printf("rank 0: expected error (%s): %s\n", what, e.what());
  if (std::strstr(e.what(), "timed out") && std::strstr(e.what(), "aborted")) return 0;
  std::fprintf(stderr, "rank 0: FAILED (%s): the error does not say 'timed out' and 'aborted'\n", what);
  return 1;
}

// A bucket all-reduce rank 0 alone joins, waited for by the device; the host's wait for a
// copy queued behind it must end by the deadline.
int bucket_waited_on_device(rd::Backend& be, void* mem, int rank) {
  int failed = 0;
  auto comm = rd::make_nccl_comm(MPI_COMM_WORLD, be);
  if (rank == 0) {
    double host = 0;
    try {
      auto request = comm->iallreduce(static_cast<float*>(mem), 1024, rd::dist::ReduceOp::Average);
      request->wait_on_device();
      be.copy_to_host_queued(&host, mem, sizeof host);
      be.wait_queued_copies();
      std::fprintf(stderr, "rank 0: FAILED: a read-back behind an all-reduce without its peers returned\n");
      failed = 1;
    } catch (const std::exception& e) {
      failed = check_timeout_error("read-back", e);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return failed;
}

}  // namespace

int main(int argc, char** argv) {
  auto env = rd::dist::init_process(argc, argv);
  int failed = 0;
  {
    rd::BackendOptions bo;
    bo.device_index = env.local_rank;
    bo.collective_timeout_s = rd::dist::collective_timeout_s();  // RD_COLLECTIVE_TIMEOUT_S, short here
    auto be = rd::make_cuda_backend(bo);
    auto mem = be->allocate(1024 * sizeof(float));
    const auto t0 = std::chrono::steady_clock::now();
    {
      auto comm = rd::make_nccl_comm(MPI_COMM_WORLD, *be);
      if (env.rank == 0) {
        try {
          comm->allreduce(static_cast<float*>(mem.get()), 1024, rd::dist::ReduceOp::Sum);
          std::fprintf(stderr, "rank 0: FAILED: an all-reduce without its peers returned\n");
          failed = 1;
        } catch (const std::exception& e) {
          failed = check_timeout_error("all-reduce", e);
        }
      }
      // Plain MPI: the other ranks wait here, never joining the all-reduce (a
      // Comm barrier would run out of the same short deadline).
      MPI_Barrier(MPI_COMM_WORLD);
    }  // rank 0 tears down an aborted communicator with a pending operation
    failed |= bucket_waited_on_device(*be, mem.get(), env.rank);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rank %d: done after %.1f s\n", env.rank, s);
    if (s > 60) {
      std::fprintf(stderr, "rank %d: FAILED: took %.1f s\n", env.rank, s);
      failed = 1;
    }
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (env.rank == 0) std::printf("nccl_timeout_test: %s\n", any ? "FAILED" : "passed");
  rd::dist::finalize_process();
  return any;
}
