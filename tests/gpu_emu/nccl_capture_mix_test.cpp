// NCCL's rule for CUDA graphs on the emulated device ("Using NCCL with CUDA Graphs"): a
// collective is captured on every rank of the communicator or on none. 2 ranks.
//   uniform: both ranks capture an all-reduce and launch the graph twice; the sums are right.
//   mixed:   rank 0 runs it from a graph, rank 1 eagerly; the emulated NCCL must FAULT naming
//            the call (the test passes on that message: tests/gpu_emu/nccl.cmake).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>

namespace {

int fail(const char* what) {
  std::fprintf(stderr, "nccl_capture_mix_test: FAILED: %s\n", what);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const bool mixed = argc > 1 && std::strcmp(argv[1], "mixed") == 0;
  int failed = 0;
  if (cudaSetDevice(rank) != cudaSuccess) failed = fail("cudaSetDevice");
  ncclUniqueId id{};
  if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) failed = fail("ncclGetUniqueId");
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = nullptr;
  if (!failed && ncclCommInitRank(&comm, size, id, rank) != ncclSuccess) failed = fail("ncclCommInitRank");
  cudaStream_t s = nullptr;
  float* d = nullptr;
  if (!failed && (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
                  cudaMalloc(reinterpret_cast<void**>(&d), sizeof(float)) != cudaSuccess))
    failed = fail("stream or memory");
  const bool capture = !mixed || rank == 0;
  cudaGraphExec_t exec = nullptr;
  if (!failed && capture) {
    cudaGraph_t graph = nullptr;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess ||
        ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, comm, s) != ncclSuccess ||
        cudaStreamEndCapture(s, &graph) != cudaSuccess || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
      failed = fail("capturing the all-reduce");
  }
  // Each launch sums the ranks' values: 1 + 1 = 2, then 2 + 2 = 4.
  const float one = 1.f;
  if (!failed && cudaMemcpy(d, &one, sizeof one, cudaMemcpyHostToDevice) != cudaSuccess) failed = fail("upload");
  for (int launch = 0; launch < 2 && !failed; ++launch) {
    const bool ok = capture ? cudaGraphLaunch(exec, s) == cudaSuccess
                            : ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, comm, s) == ncclSuccess;
    if (!ok || cudaStreamSynchronize(s) != cudaSuccess) failed = fail("running the all-reduce");
  }
  float got = 0.f;
  if (!failed && cudaMemcpy(&got, d, sizeof got, cudaMemcpyDeviceToHost) != cudaSuccess) failed = fail("download");
  if (!failed && got != 4.f) failed = fail("the replayed all-reduce did not sum the ranks' values");
  if (mixed && !failed) failed = fail("a collective captured on rank 0 only ran without a FAULT");
  if (comm) ncclCommDestroy(comm);
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::printf("nccl_capture_mix_test (%s): %s\n", mixed ? "mixed" : "uniform", any ? "FAILED" : "passed");
  MPI_Finalize();
  return any;
}
