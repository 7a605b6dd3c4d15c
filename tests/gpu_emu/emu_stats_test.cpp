// The emulated device's counters (emu.h, "counters"; RD_EMU_STATS in docs/cuda.md):
// each call moves exactly its own counter and nothing else, and the file written
// at exit holds every name, sorted, with this process's counts.
#include "cuda_emu/device.h"  // first: the kernel below is emulated CUDA

#include <cublas_v2.h>
#include <cudnn.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda_emu/emu.h"
#include "gpu_emu/emu_test_support.h"

namespace {

using rd::emu_test::ChildResult;
using rd::emu_test::device_floats;
using rd::emu_test::in_child;

using Counts = std::map<std::string, uint64_t>;

__global__ void fill_kernel(float* out, float v, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = v;
}

// Runs `call` and returns the counters that moved, by how much (all others must not).
template <class F> Counts moved_by(F call) {
  const Counts before = rd::emu::stats_snapshot();
  call();
  const Counts after = rd::emu::stats_snapshot();
  REQUIRE(after.size() == before.size());
  Counts diff;
  for (const auto& [name, v] : after)
    if (v != before.at(name)) diff[name] = v - before.at(name);
  return diff;
}

const Counts kNothing{};
Counts host_wait(const std::string& kind) { return {{"host_waits", 1}, {"host_waits." + kind, 1}}; }
Counts nccl_call(const std::string& kind) { return {{"nccl", 1}, {"nccl." + kind, 1}}; }

std::string temp_dir() {
  char templ[] = "/tmp/rd_emu_stats_XXXXXX";
  REQUIRE(mkdtemp(templ) != nullptr);
  return templ;
}

}  // namespace

TEST_CASE("emu stats: allocations and frees, each call counted once", "[gpu_emu][stats]") {
  void *d = nullptr, *h1 = nullptr, *h2 = nullptr;
  CHECK(moved_by([&] { REQUIRE(cudaMalloc(&d, 64) == cudaSuccess); }) == Counts{{"allocs", 1}});
  CHECK(moved_by([&] { REQUIRE(cudaMallocHost(&h1, 64) == cudaSuccess); }) == Counts{{"allocs", 1}});
  CHECK(moved_by([&] { REQUIRE(cudaHostAlloc(&h2, 64, cudaHostAllocDefault) == cudaSuccess); }) ==
        Counts{{"allocs", 1}});
  // cudaFree synchronises the device, but it is counted as a free, not a host wait.
  CHECK(moved_by([&] { REQUIRE(cudaFree(d) == cudaSuccess); }) == Counts{{"frees", 1}});
  CHECK(moved_by([&] { REQUIRE(cudaFreeHost(h1) == cudaSuccess); }) == Counts{{"frees", 1}});
  CHECK(moved_by([&] { REQUIRE(cudaFreeHost(h2) == cudaSuccess); }) == Counts{{"frees", 1}});
}

TEST_CASE("emu stats: synchronisations are host waits of their own kind", "[gpu_emu][stats]") {
  cudaStream_t s;
  cudaEvent_t e;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  float* d = device_floats(256);
  CHECK(moved_by([&] { RD_LAUNCH(fill_kernel, 1, 256, 0, s)(d, 1.f, 256); }) == Counts{{"kernel_launches", 1}});
  CHECK(moved_by([&] { REQUIRE(cudaStreamSynchronize(s) == cudaSuccess); }) == host_wait("stream_sync"));
  CHECK(moved_by([&] { REQUIRE(cudaEventRecord(e, s) == cudaSuccess); }) == kNothing);
  CHECK(moved_by([&] { REQUIRE(cudaEventSynchronize(e) == cudaSuccess); }) == host_wait("event_sync"));
  CHECK(moved_by([&] { REQUIRE(cudaDeviceSynchronize() == cudaSuccess); }) == host_wait("device_sync"));
  // A query that finds the work done (or runs it to completion) is no wait.
  CHECK(moved_by([&] { REQUIRE(cudaStreamQuery(s) == cudaSuccess); }) == kNothing);
  CHECK(moved_by([&] { REQUIRE(cudaEventQuery(e) == cudaSuccess); }) == kNothing);
  CHECK(moved_by([&] { REQUIRE(cudaStreamWaitEvent(s, e, 0) == cudaSuccess); }) == kNothing);
  REQUIRE(cudaFree(d) == cudaSuccess);
  cudaEventDestroy(e);
  cudaStreamDestroy(s);
}

TEST_CASE("emu stats: blocking and pageable copies, pinned ones are free", "[gpu_emu][stats]") {
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  const size_t n = 64, bytes = n * sizeof(float);
  float* d = device_floats(n);
  float* d2 = device_floats(n);
  void* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, bytes) == cudaSuccess);
  std::vector<float> pageable(n, 2.f);
  // The synchronous API: one blocking copy each (not also a stream synchronisation).
  CHECK(moved_by([&] { REQUIRE(cudaMemcpy(d, pageable.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess); }) ==
        host_wait("blocking_copy"));
  CHECK(moved_by([&] { REQUIRE(cudaMemcpy(pageable.data(), d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess); }) ==
        host_wait("blocking_copy"));
  CHECK(moved_by([&] { REQUIRE(cudaMemset(d, 0, bytes) == cudaSuccess); }) == host_wait("blocking_copy"));
  // Asynchronous copies with a pageable host side wait (or stage) on the host.
  CHECK(moved_by([&] {
          REQUIRE(cudaMemcpyAsync(d, pageable.data(), bytes, cudaMemcpyHostToDevice, s) == cudaSuccess);
        }) == host_wait("pageable_copy"));
  CHECK(moved_by([&] {
          REQUIRE(cudaMemcpyAsync(pageable.data(), d, bytes, cudaMemcpyDeviceToHost, s) == cudaSuccess);
        }) == host_wait("pageable_copy"));
  CHECK(moved_by([&] { REQUIRE(cudaMemcpyAsync(d, pageable.data(), bytes, cudaMemcpyDefault, s) == cudaSuccess); }) ==
        host_wait("pageable_copy"));
  // Pinned host memory and device-to-device: queued, no wait.
  CHECK(moved_by([&] { REQUIRE(cudaMemcpyAsync(d, pinned, bytes, cudaMemcpyHostToDevice, s) == cudaSuccess); }) ==
        kNothing);
  CHECK(moved_by([&] { REQUIRE(cudaMemcpyAsync(pinned, d, bytes, cudaMemcpyDeviceToHost, s) == cudaSuccess); }) ==
        kNothing);
  CHECK(moved_by([&] { REQUIRE(cudaMemcpyAsync(d2, d, bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess); }) ==
        kNothing);
  CHECK(moved_by([&] { REQUIRE(cudaMemsetAsync(d2, 0, bytes, s) == cudaSuccess); }) == kNothing);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  cudaFreeHost(pinned);
  cudaFree(d);
  cudaFree(d2);
  cudaStreamDestroy(s);
}

TEST_CASE("emu stats: NCCL calls by kind, and queries that answered not ready", "[gpu_emu][stats]") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm;
  REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);  // one rank: no MPI needed
  cudaStream_t a, b;
  REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  float* x = device_floats(8);
  float* y = device_floats(8);
  REQUIRE(cudaMemset(x, 0, 8 * sizeof(float)) == cudaSuccess);
  CHECK(moved_by([&] { REQUIRE(ncclAllReduce(x, y, 8, ncclFloat32, ncclSum, comm, a) == ncclSuccess); }) ==
        nccl_call("allreduce"));
  CHECK(moved_by([&] { REQUIRE(ncclBroadcast(x, y, 8, ncclFloat32, 0, comm, a) == ncclSuccess); }) ==
        nccl_call("broadcast"));
  CHECK(moved_by([&] { REQUIRE(ncclBcast(y, 8, ncclFloat32, 0, comm, a) == ncclSuccess); }) == nccl_call("broadcast"));
  CHECK(moved_by([&] { REQUIRE(ncclReduce(x, y, 8, ncclFloat32, ncclSum, 0, comm, a) == ncclSuccess); }) ==
        nccl_call("reduce"));
  CHECK(moved_by([&] { REQUIRE(ncclAllGather(x, y, 8, ncclFloat32, comm, a) == ncclSuccess); }) ==
        nccl_call("allgather"));
  CHECK(moved_by([&] { REQUIRE(ncclReduceScatter(x, y, 8, ncclFloat32, ncclSum, comm, a) == ncclSuccess); }) ==
        nccl_call("reducescatter"));
  REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);

  // A receive from self with no send yet: the stream cannot finish, so a query
  // answers cudaErrorNotReady, and that (only that) counts as a host wait.
  CHECK(moved_by([&] { REQUIRE(ncclRecv(y, 8, ncclFloat32, 0, comm, a) == ncclSuccess); }) == nccl_call("recv"));
  cudaEvent_t after_recv;
  REQUIRE(cudaEventCreateWithFlags(&after_recv, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventRecord(after_recv, a) == cudaSuccess);
  // Each starts a poll (the query before it was of another handle, or none).
  Counts first_poll = host_wait("query_not_ready");
  first_poll["query_not_ready_first"] = 1;
  CHECK(moved_by([&] { REQUIRE(cudaStreamQuery(a) == cudaErrorNotReady); }) == first_poll);
  CHECK(moved_by([&] { REQUIRE(cudaEventQuery(after_recv) == cudaErrorNotReady); }) == first_poll);
  // Polled again after a pause: the same poll, and the host time between the two not-ready
  // answers is counted (what a poller's sleeps cost), the emulated work inside the queries is not.
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  Counts polled_again = moved_by([&] { REQUIRE(cudaEventQuery(after_recv) == cudaErrorNotReady); });
  CHECK(polled_again["query_not_ready_gap_us"] >= 3000);
  CHECK(polled_again["query_not_ready_gap_us"] < 3'000'000);
  polled_again.erase("query_not_ready_gap_us");
  CHECK(polled_again == host_wait("query_not_ready"));
  CHECK(moved_by([&] { REQUIRE(ncclSend(x, 8, ncclFloat32, 0, comm, b) == ncclSuccess); }) == nccl_call("send"));
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);
  CHECK(moved_by([&] { REQUIRE(cudaStreamQuery(a) == cudaSuccess); }) == kNothing);
  CHECK(moved_by([&] { REQUIRE(cudaEventQuery(after_recv) == cudaSuccess); }) == kNothing);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  cudaEventDestroy(after_recv);
  cudaFree(x);
  cudaFree(y);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST_CASE("emu stats: cuDNN plans and cuBLAS/cuDNN compute calls", "[gpu_emu][stats]") {
  cudnnHandle_t dnn;
  REQUIRE(cudnnCreate(&dnn) == CUDNN_STATUS_SUCCESS);
  cudnnTensorDescriptor_t xd, yd;
  cudnnFilterDescriptor_t wd;
  cudnnConvolutionDescriptor_t cd;
  REQUIRE(cudnnCreateTensorDescriptor(&xd) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnCreateTensorDescriptor(&yd) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnCreateFilterDescriptor(&wd) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnCreateConvolutionDescriptor(&cd) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 2, 5, 5) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 3, 5, 5) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 3, 2, 3, 3) == CUDNN_STATUS_SUCCESS);
  REQUIRE(cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT) ==
          CUDNN_STATUS_SUCCESS);
  float* x = device_floats(50);
  float* w = device_floats(54);
  float* y = device_floats(75);
  REQUIRE(cudaMemset(x, 0, 50 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemset(w, 0, 54 * sizeof(float)) == cudaSuccess);
  int got = 0;
  cudnnConvolutionFwdAlgoPerf_t perf[8];
  const Counts plan{{"cudnn_find", 1}};
  CHECK(moved_by([&] {
          REQUIRE(cudnnGetConvolutionForwardAlgorithm_v7(dnn, xd, wd, cd, yd, 8, &got, perf) == CUDNN_STATUS_SUCCESS);
        }) == plan);
  CHECK(moved_by([&] {
          REQUIRE(cudnnFindConvolutionForwardAlgorithm(dnn, xd, wd, cd, yd, 8, &got, perf) == CUDNN_STATUS_SUCCESS);
        }) == plan);
  cudnnConvolutionBwdDataAlgoPerf_t dperf[8];
  CHECK(moved_by([&] {
          REQUIRE(cudnnFindConvolutionBackwardDataAlgorithm(dnn, wd, yd, cd, xd, 8, &got, dperf) ==
                  CUDNN_STATUS_SUCCESS);
        }) == plan);
  cudnnConvolutionBwdFilterAlgoPerf_t fperf[8];
  CHECK(moved_by([&] {
          REQUIRE(cudnnGetConvolutionBackwardFilterAlgorithm_v7(dnn, xd, yd, cd, wd, 8, &got, fperf) ==
                  CUDNN_STATUS_SUCCESS);
        }) == plan);
  size_t ws = 1;
  CHECK(moved_by([&] {
          REQUIRE(cudnnGetConvolutionForwardWorkspaceSize(dnn, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                                                          &ws) == CUDNN_STATUS_SUCCESS);
        }) == kNothing);
  REQUIRE(ws == 0);
  const float one = 1.f, zero = 0.f;
  CHECK(moved_by([&] {
          REQUIRE(cudnnConvolutionForward(dnn, &one, xd, x, wd, w, cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                                          nullptr, 0, &zero, yd, y) == CUDNN_STATUS_SUCCESS);
        }) == Counts{{"kernel_launches", 1}});
  cublasHandle_t blas;
  REQUIRE(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS);
  CHECK(moved_by([&] {
          REQUIRE(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 5, 5, 2, &one, x, 5, w, 2, &zero, y, 5) ==
                  CUBLAS_STATUS_SUCCESS);
        }) == Counts{{"kernel_launches", 1}});
  // Destroying a handle synchronises the device (documented), as the counters say.
  CHECK(moved_by([&] { REQUIRE(cublasDestroy(blas) == CUBLAS_STATUS_SUCCESS); }) == host_wait("device_sync"));
  CHECK(moved_by([&] { REQUIRE(cudnnDestroy(dnn) == CUDNN_STATUS_SUCCESS); }) == host_wait("device_sync"));
  cudnnDestroyTensorDescriptor(xd);
  cudnnDestroyTensorDescriptor(yd);
  cudnnDestroyFilterDescriptor(wd);
  cudnnDestroyConvolutionDescriptor(cd);
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
}

TEST_CASE("emu stats: RD_EMU_STATS writes PATH.rank<R> when any thread calls exit()", "[gpu_emu][stats]") {
  const std::string dir = temp_dir();
  const std::string base = dir + "/stats";
  const Counts at_fork = rd::emu::stats_snapshot();
  const ChildResult c = in_child([&] {
    setenv("RD_EMU_STATS", base.c_str(), 1);
    unsetenv("PMI_RANK");
    unsetenv("SLURM_PROCID");
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    void* p = nullptr;
    if (cudaMalloc(&p, 16) != cudaSuccess) _exit(3);
    if (cudaDeviceSynchronize() != cudaSuccess) _exit(3);
    std::thread([] { std::exit(0); }).join();
  });
  INFO("child stderr: " << c.err);
  REQUIRE(c.exit_code == 0);
  std::ifstream in(base + ".rank3");
  REQUIRE(in.good());
  Counts file;
  std::vector<std::string> order;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string name;
    uint64_t value = 0;
    REQUIRE(static_cast<bool>(ls >> name >> value));
    order.push_back(name);
    file[name] = value;
  }
  std::vector<std::string> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  CHECK(order == sorted);
  Counts expected = at_fork;
  expected["allocs"] += 1;
  expected["host_waits"] += 1;
  expected["host_waits.device_sync"] += 1;
  CHECK(file == expected);
  for (const char* name : {"host_waits",
                           "host_waits.stream_sync",
                           "host_waits.event_sync",
                           "host_waits.device_sync",
                           "host_waits.blocking_copy",
                           "host_waits.pageable_copy",
                           "host_waits.query_not_ready",
                           "allocs",
                           "frees",
                           "cudnn_find",
                           "nccl",
                           "nccl.allreduce",
                           "nccl.broadcast",
                           "nccl.reduce",
                           "nccl.allgather",
                           "nccl.reducescatter",
                           "nccl.send",
                           "nccl.recv",
                           "kernel_launches",
                           "graph_launches",
                           "query_not_ready_first",
                           "query_not_ready_gap_us"})
    CHECK(file.count(name) == 1);
  std::remove((base + ".rank3").c_str());
  rmdir(dir.c_str());
}

TEST_CASE("emu stats: the rank comes from PMI_RANK, then SLURM_PROCID, else 0", "[gpu_emu][stats]") {
  const std::string dir = temp_dir();
  const std::string base = dir + "/s";
  struct Case {
    const char* pmi;
    const char* slurm;
    const char* suffix;
  };
  for (const Case& k : {Case{"5", "7", ".rank5"}, Case{nullptr, "7", ".rank7"}, Case{nullptr, nullptr, ".rank0"}}) {
    const ChildResult c = in_child([&] {
      setenv("RD_EMU_STATS", base.c_str(), 1);
      unsetenv("OMPI_COMM_WORLD_RANK");
      if (k.pmi)
        setenv("PMI_RANK", k.pmi, 1);
      else
        unsetenv("PMI_RANK");
      if (k.slurm)
        setenv("SLURM_PROCID", k.slurm, 1);
      else
        unsetenv("SLURM_PROCID");
      std::exit(0);
    });
    INFO("child stderr: " << c.err);
    CHECK(c.exit_code == 0);
    CHECK(std::ifstream(base + k.suffix).good());
    std::remove((base + k.suffix).c_str());
  }
  rmdir(dir.c_str());
}

TEST_CASE("emu stats: a stats file that cannot be written fails the process, naming it", "[gpu_emu][stats]") {
  // At exit (the variable set after start-up) ...
  const ChildResult late = in_child([] {
    setenv("RD_EMU_STATS", "/nonexistent-dir/stats", 1);
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("PMI_RANK");
    unsetenv("SLURM_PROCID");
    std::exit(0);
  });
  CHECK(late.exit_code == rd::emu::kFaultExit);
  CHECK(late.err.find("RD_EMU_STATS: cannot write /nonexistent-dir/stats.rank0") != std::string::npos);
  // ... and at start-up, before the run could waste its time.
  const ChildResult early = in_child([] {
    setenv("RD_EMU_STATS", "/nonexistent-dir/stats", 1);
    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    execl("/proc/self/exe", "test_emu_stats", "--list-tests", static_cast<char*>(nullptr));
    _exit(127);
  });
  CHECK(early.exit_code == rd::emu::kFaultExit);
  CHECK(early.err.find("cuda-emu: FAULT: RD_EMU_STATS: cannot write /nonexistent-dir/stats.rank1") !=
        std::string::npos);
  // A rank variable that is not a number is refused, not guessed.
  const ChildResult bad_rank = in_child([] {
    setenv("RD_EMU_STATS", "/tmp/rd_emu_stats_bad_rank", 1);
    setenv("OMPI_COMM_WORLD_RANK", "one", 1);
    std::exit(0);
  });
  CHECK(bad_rank.exit_code == rd::emu::kFaultExit);
  CHECK(bad_rank.err.find("OMPI_COMM_WORLD_RANK='one' is not a rank number") != std::string::npos);
}
