// The emulated device itself (tests/cuda_emu): work is queued, not run at
// enqueue time; only events order streams; blocks run as thread teams with
// barriers, shared memory and warp shuffles; launches are checked against the
// device's limits; and each class of misuse the emulator claims to catch is caught
// (the misuse runs in a child process, which must end with the fault exit code and
// a message naming the call).
#include "cuda_emu/device.h"  // first: the kernels below are emulated CUDA

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_emu/emu.h"
#include "gpu_emu/emu_test_support.h"

namespace {

using rd::emu_test::ChildResult;
using rd::emu_test::device_floats;
using rd::emu_test::in_child;
using rd::emu_test::to_host;

__global__ void iota_kernel(float* out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)
    out[i] = static_cast<float>(i);
}

__global__ void add_one_kernel(const float* in, float* out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)
    out[i] = in[i] + 1.f;
}

// Block sum: shared memory, a barrier, then a warp shuffle reduction.
__global__ void block_sum_kernel(const float* in, float* out, int n) {
  __shared__ float part[256];
  const int t = static_cast<int>(threadIdx.x);
  part[t] = t < n ? in[t] : 0.f;
  __syncthreads();
  float v = 0.f;
  if (t < 32) {
    for (int k = t; k < 256; k += 32) v += part[k];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (t == 0) *out = v;
  }
}

// The same without the barrier: threads read slots their neighbours have not written.
__global__ void racy_neighbour_kernel(float* out, float base) {
  __shared__ float slot[64];
  const int t = static_cast<int>(threadIdx.x);
  slot[t] = base + static_cast<float>(t);
  out[t] = slot[(t + 1) % 64];
}

__global__ void vote_kernel(const float* in, int* any_bad) {
  const bool bad = !std::isfinite(in[threadIdx.x]);
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) atomicAdd(any_bad, 1);
}

__global__ void write_at_kernel(float* p, int64_t index) { p[index] = 1.f; }

__global__ void divergent_barrier_kernel(float* p) {
  if (threadIdx.x < 16) __syncthreads();
  p[threadIdx.x] = 0.f;
}

void require_fault(const ChildResult& r, const std::string& needle) {
  INFO("child stderr: " << r.err);
  CHECK(r.exit_code == rd::emu::kFaultExit);
  CHECK(r.err.find("cuda-emu: FAULT") != std::string::npos);
  CHECK(r.err.find(needle) != std::string::npos);
}

}  // namespace

TEST_CASE("emu: queued work runs at synchronisation, not at enqueue time", "[gpu_emu]") {
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  const int64_t n = 1000;
  float* d = device_floats(n);
  RD_LAUNCH(iota_kernel, 4, 128, 0, s)(d, n);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  // Device memory is host memory here, so the test can look: nothing ran yet, the
  // fresh allocation still holds its NaN poison.
  CHECK(std::isnan(d[0]));
  CHECK(std::isnan(d[n - 1]));
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  const std::vector<float> h = to_host(d, n);
  for (int64_t i = 0; i < n; ++i) REQUIRE(h[static_cast<size_t>(i)] == static_cast<float>(i));
  cudaFree(d);
  cudaStreamDestroy(s);
}

TEST_CASE("emu: only events order streams (a missing wait reads stale data)", "[gpu_emu]") {
  cudaStream_t a, b;
  cudaEvent_t ready;
  REQUIRE(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming) == cudaSuccess);
  const int64_t n = 256;
  float* x = device_floats(n);
  float* y = device_floats(n);

  // Without the wait: b's kernel runs before a's, on x's poison.
  RD_LAUNCH(iota_kernel, 1, 256, 0, a)(x, n);
  RD_LAUNCH(add_one_kernel, 1, 256, 0, b)(x, y, n);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  CHECK(std::isnan(to_host(y, n)[5]));
  REQUIRE(cudaStreamSynchronize(a) == cudaSuccess);

  // With it: correct.
  RD_LAUNCH(iota_kernel, 1, 256, 0, a)(x, n);
  REQUIRE(cudaEventRecord(ready, a) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(b, ready, 0) == cudaSuccess);
  RD_LAUNCH(add_one_kernel, 1, 256, 0, b)(x, y, n);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  const std::vector<float> h = to_host(y, n);
  for (int64_t i = 0; i < n; ++i) REQUIRE(h[static_cast<size_t>(i)] == static_cast<float>(i) + 1.f);
  CHECK(cudaEventQuery(ready) == cudaSuccess);
  cudaFree(x);
  cudaFree(y);
  cudaEventDestroy(ready);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST_CASE("emu: a wait needs the record it saw, not a later one on another stream", "[gpu_emu]") {
  cudaStream_t a, b, c;
  cudaEvent_t e;
  for (cudaStream_t* s : {&a, &b, &c}) REQUIRE(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  const int64_t n = 64;
  float* x = device_floats(n);
  float* y = device_floats(n);
  RD_LAUNCH(iota_kernel, 1, 64, 0, a)(x, n);
  REQUIRE(cudaEventRecord(e, a) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(b, e, 0) == cudaSuccess);
  REQUIRE(cudaEventRecord(e, c) == cudaSuccess);  // re-recorded on an idle stream
  RD_LAUNCH(add_one_kernel, 1, 64, 0, b)(x, y, n);
  REQUIRE(cudaStreamSynchronize(c) == cudaSuccess);  // the newer record completes first
  CHECK(cudaEventQuery(e) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(b) == cudaSuccess);
  CHECK(to_host(y, n)[7] == 8.f);
  cudaFree(x);
  cudaFree(y);
  cudaEventDestroy(e);
  for (cudaStream_t s : {a, b, c}) cudaStreamDestroy(s);
}

TEST_CASE("emu: blocks run as teams (shared memory, barriers, shuffles, votes)", "[gpu_emu]") {
  std::vector<float> in(200);
  double expect = 0;
  for (size_t i = 0; i < in.size(); ++i) in[i] = 0.25f * static_cast<float>(i), expect += in[i];
  float* d_in = device_floats(in.size());
  float* d_out = device_floats(1);
  REQUIRE(cudaMemcpy(d_in, in.data(), in.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  RD_LAUNCH(block_sum_kernel, 1, 256, 0, nullptr)(d_in, d_out, static_cast<int>(in.size()));
  CHECK(to_host(d_out, 1)[0] == Approx(expect));

  // Threads run in reverse order: without the barrier, thread t reads slot t+1 after
  // thread t+1 wrote it, but slot 0 (read by thread 63) still holds the previous
  // launch's value. A GPU may give the right answer by luck; the emulator never does.
  float* racy = device_floats(64);
  RD_LAUNCH(racy_neighbour_kernel, 1, 64, 0, nullptr)(racy, 0.f);
  RD_LAUNCH(racy_neighbour_kernel, 1, 64, 0, nullptr)(racy, 100.f);
  const std::vector<float> r = to_host(racy, 64);
  CHECK(r[0] == 101.f);
  CHECK(r[63] == 0.f);  // not 100: the race shows

  std::vector<float> v(64, 1.f);
  v[40] = NAN;
  float* d_v = device_floats(64);
  int* d_bad = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d_bad), sizeof(int)) == cudaSuccess);
  REQUIRE(cudaMemset(d_bad, 0, sizeof(int)) == cudaSuccess);
  REQUIRE(cudaMemcpy(d_v, v.data(), 64 * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  RD_LAUNCH(vote_kernel, 1, 64, 0, nullptr)(d_v, d_bad);
  int bad = 0;
  REQUIRE(cudaMemcpy(&bad, d_bad, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(bad == 1);  // only warp 1 (lanes 32..63) saw the NaN
  for (void* p : {static_cast<void*>(d_in), static_cast<void*>(d_out), static_cast<void*>(racy),
                  static_cast<void*>(d_v), static_cast<void*>(d_bad)})
    cudaFree(p);
}

TEST_CASE("emu: launches over the device's limits fail as on the device", "[gpu_emu]") {
  float* d = device_floats(16);
  cudaGetLastError();
  RD_LAUNCH(iota_kernel, 1, 2048, 0, nullptr)(d, 16);  // > 1024 threads per block
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  RD_LAUNCH(iota_kernel, dim3(1, 70000), 32, 0, nullptr)(d, 16);  // grid.y > 65535
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  RD_LAUNCH(iota_kernel, 1, dim3(1, 1, 65), 0, nullptr)(d, 16);  // block.z > 64
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  RD_LAUNCH(iota_kernel, 1, 32, 64 * 1024, nullptr)(d, 16);  // shared memory > 48 KiB
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  RD_LAUNCH(iota_kernel, 0, 32, 0, nullptr)(d, 16);  // empty grid
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  RD_LAUNCH(iota_kernel, 1, 1024, 0, nullptr)(d, 16);
  CHECK(cudaGetLastError() == cudaSuccess);
  cudaFree(d);
}

TEST_CASE("emu: pageable copies follow the documented synchronisation", "[gpu_emu]") {
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  float* d = device_floats(4);
  std::vector<float> src{1, 2, 3, 4};
  REQUIRE(cudaMemcpyAsync(d, src.data(), 16, cudaMemcpyHostToDevice, s) == cudaSuccess);
  src.assign(4, -1.f);  // staged at the call: the device must still see 1..4
  std::vector<float> back(4, 0.f);
  // Device -> pageable host returns only once the copy is done.
  REQUIRE(cudaMemcpyAsync(back.data(), d, 16, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  CHECK(back == std::vector<float>{1, 2, 3, 4});
  // Device -> pinned host is asynchronous: nothing before the sync.
  float* pinned = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), 16) == cudaSuccess);
  std::memset(pinned, 0, 16);
  REQUIRE(cudaMemcpyAsync(pinned, d, 16, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  CHECK(pinned[2] == 0.f);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(pinned[2] == 3.f);
  cudaFreeHost(pinned);
  cudaFree(d);
  cudaStreamDestroy(s);
}

TEST_CASE("emu: the out-of-memory answer when the fake device is full", "[gpu_emu]") {
  size_t free_b = 0, total_b = 0;
  REQUIRE(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess);
  void* p = nullptr;
  CHECK(cudaMalloc(&p, total_b + 1) == cudaErrorMemoryAllocation);
  CHECK(p == nullptr);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaSuccess);  // not sticky
}

// ---- fault injection: one case per class of misuse ------------------------------------

TEST_CASE("emu fault: use of a destroyed stream", "[gpu_emu][fault]") {
  require_fault(in_child([] {
                  cudaStream_t s;
                  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
                  cudaStreamDestroy(s);
                  cudaStreamQuery(s);  // what ~CudaBackend's Scratch once did
                }),
                "cudaStreamQuery: stream #");
}

TEST_CASE("emu fault: use of a destroyed event", "[gpu_emu][fault]") {
  require_fault(in_child([] {
                  cudaStream_t s;
                  cudaEvent_t e;
                  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
                  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
                  cudaEventDestroy(e);
                  cudaEventRecord(e, s);
                }),
                "was destroyed by cudaEventDestroy");
}

TEST_CASE("emu fault: a host pointer passed as a device pointer", "[gpu_emu][fault]") {
  require_fault(in_child([] {
                  std::vector<float> host(64);
                  RD_LAUNCH(iota_kernel, 1, 64, 0, nullptr)(host.data(), 64);
                }),
                "kernel iota_kernel: pointer argument 1 is host memory");
  require_fault(in_child([] {
                  std::vector<float> host(64);
                  float* d = nullptr;
                  cudaMalloc(reinterpret_cast<void**>(&d), 256);
                  // Direction says device -> host, but the pointers are the other way round.
                  cudaMemcpy(d, host.data(), 256, cudaMemcpyDeviceToHost);
                }),
                "cudaMemcpyAsync(DeviceToHost): src is host memory");
}

TEST_CASE("emu fault: a device write past the end of an allocation", "[gpu_emu][fault]") {
  // Into the slack of the 256-byte granule (a canary), and onto the guard page.
  require_fault(in_child([] {
                  float* d = nullptr;
                  cudaMalloc(reinterpret_cast<void**>(&d), 100 * sizeof(float));
                  RD_LAUNCH(write_at_kernel, 1, 1, 0, nullptr)(d, 100);
                  cudaDeviceSynchronize();
                }),
                "write past the end of allocation");
  require_fault(in_child([] {
                  float* d = nullptr;
                  cudaMalloc(reinterpret_cast<void**>(&d), 64 * sizeof(float));
                  RD_LAUNCH(write_at_kernel, 1, 1, 0, nullptr)(d, 64);  // byte 256: the guard page
                  cudaDeviceSynchronize();
                }),
                "access past the end");
}

TEST_CASE("emu fault: use after cudaFree", "[gpu_emu][fault]") {
  require_fault(in_child([] {
                  float* d = nullptr;
                  float* keep = nullptr;
                  cudaMalloc(reinterpret_cast<void**>(&d), 256);
                  cudaMalloc(reinterpret_cast<void**>(&keep), 256);
                  cudaFree(d);
                  RD_LAUNCH(add_one_kernel, 1, 64, 0, nullptr)(keep, d, 64);
                }),
                "pointer argument 2 is freed allocation");
}

TEST_CASE("emu fault: a barrier in divergent code", "[gpu_emu][fault]") {
  require_fault(in_child([] {
                  float* d = nullptr;
                  cudaMalloc(reinterpret_cast<void**>(&d), 64 * sizeof(float));
                  RD_LAUNCH(divergent_barrier_kernel, 1, 64, 0, nullptr)(d);
                  cudaDeviceSynchronize();
                }),
                "a barrier in divergent code");
}
