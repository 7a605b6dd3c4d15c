// Stream capture and CUDA graphs on the emulated device (docs/cuda.md, "The emulated
// device"): a captured sequence (kernels, a cuBLAS GEMM, a cuDNN convolution, an NCCL
// all-reduce, a fork and join across two streams, a copy to pinned memory) replays
// bit-equal to its eager run; a graph holds addresses, so new input data gives new
// results; each call that conflicts with a capture invalidates it and is named.
// Under mpirun (2 ranks) the all-reduce really communicates: ctest runs the "[nccl]"
// case there.
#include "cuda_emu/device.h"  // first: the kernels below are emulated CUDA

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <cublas_v2.h>
#include <cudnn.h>
#include <mpi.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "cuda_emu/emu.h"
#include "gpu_emu/emu_test_support.h"

namespace {

using rd::emu_test::ChildResult;
using rd::emu_test::device_floats;
using rd::emu_test::in_child;

int g_rank = 0, g_size = 1;

#define CUDA_REQUIRE(x) REQUIRE((x) == cudaSuccess)

__global__ void affine_kernel(const float* x, float* a, float scale, float shift, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) a[i] = x[i] * scale + shift;
}

__global__ void square_kernel(const float* z, float* z2, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) z2[i] = z[i] * z[i];
}

__global__ void add_kernel(const float* a, const float* b, float* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = a[i] + b[i];
}

// One block per row: shared memory, a barrier and a warp shuffle (fibers, not a loop).
__global__ void row_sum_kernel(const float* m, float* sums, int cols) {
  __shared__ float part[32];
  const int t = static_cast<int>(threadIdx.x), row = static_cast<int>(blockIdx.x);
  float v = 0.f;
  for (int c = t; c < cols; c += 32) v += m[row * cols + c];
  part[t] = v;
  __syncthreads();
  v = part[t];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if (t == 0) sums[row] = v;
}

__global__ void touch_kernel(float* p) { p[threadIdx.x] += 1.f; }

constexpr int kN = 2, kC = 2, kH = 6, kW = 6, kK = 3;
constexpr int kX = kN * kC * kH * kW, kWts = kK * kC * 3 * 3, kY = kN * kK * kH * kW;
constexpr int kM = kY / 3, kKdim = 3, kCols = 4, kZ = kM * kCols;  // GEMM: (kM x 3) * (3 x 4)
constexpr int kRows = kZ / 8;

ncclComm_t make_comm() {
  ncclUniqueId id;
  if (g_rank == 0) REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  if (g_size > 1) MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRank(&comm, g_size, id, g_rank) == ncclSuccess);
  return comm;
}

// Everything the sequence touches, made before any capture (allocation is illegal in one).
struct Pipeline {
  cudaStream_t main{}, side{};
  cudaEvent_t forked{}, joined{};
  cublasHandle_t blas{};
  cudnnHandle_t dnn{};
  cudnnTensorDescriptor_t xd{}, yd{};
  cudnnFilterDescriptor_t wd{};
  cudnnConvolutionDescriptor_t cd{};
  ncclComm_t comm{};
  float *x{}, *a{}, *w{}, *y{}, *b{}, *z{}, *z2{}, *out{}, *sums{};
  float *host_out{}, *host_sums{};  // pinned

  Pipeline() {
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&main, cudaStreamNonBlocking));
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    CUDA_REQUIRE(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming));
    CUDA_REQUIRE(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming));
    REQUIRE(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasSetStream(blas, main) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cudnnCreate(&dnn) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnSetStream(dnn, main) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnCreateTensorDescriptor(&xd) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnCreateTensorDescriptor(&yd) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnCreateFilterDescriptor(&wd) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnCreateConvolutionDescriptor(&cd) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, kN, kC, kH, kW) ==
            CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, kN, kK, kH, kW) ==
            CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, kK, kC, 3, 3) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT) ==
            CUDNN_STATUS_SUCCESS);
    comm = make_comm();
    x = device_floats(kX);
    a = device_floats(kX);
    w = device_floats(kWts);
    y = device_floats(kY);
    b = device_floats(kKdim * kCols);
    z = device_floats(kZ);
    z2 = device_floats(kZ);
    out = device_floats(kZ);
    sums = device_floats(kRows);
    void* p = nullptr;
    CUDA_REQUIRE(cudaMallocHost(&p, kZ * sizeof(float)));
    host_out = static_cast<float*>(p);
    CUDA_REQUIRE(cudaMallocHost(&p, kRows * sizeof(float)));
    host_sums = static_cast<float*>(p);
    std::vector<float> hw(kWts), hb(kKdim * kCols);
    for (int i = 0; i < kWts; ++i) hw[static_cast<size_t>(i)] = 0.05f * static_cast<float>((i * 7) % 11) - 0.2f;
    for (int i = 0; i < kKdim * kCols; ++i) hb[static_cast<size_t>(i)] = 0.5f - 0.125f * static_cast<float>(i % 5);
    CUDA_REQUIRE(cudaMemcpy(w, hw.data(), hw.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_REQUIRE(cudaMemcpy(b, hb.data(), hb.size() * sizeof(float), cudaMemcpyHostToDevice));
  }

  // Input data: `seed` picks the set; each rank's differs, so the all-reduce matters.
  void set_input(int seed) {
    std::vector<float> hx(kX);
    for (int i = 0; i < kX; ++i)
      hx[static_cast<size_t>(i)] = 0.01f * static_cast<float>((i * (3 + seed) + 5 * g_rank) % 37) - 0.15f;
    CUDA_REQUIRE(cudaMemcpy(x, hx.data(), hx.size() * sizeof(float), cudaMemcpyHostToDevice));
  }

  // Every intermediate and output to NaN, so a replay that skipped any step shows.
  void poison() {
    for (auto [p, n] : {std::pair{a, kX}, {y, kY}, {z, kZ}, {z2, kZ}, {out, kZ}, {sums, kRows}})
      CUDA_REQUIRE(cudaMemset(p, 0xFF, static_cast<size_t>(n) * sizeof(float)));
    std::memset(host_out, 0xFF, kZ * sizeof(float));
    std::memset(host_sums, 0xFF, kRows * sizeof(float));
  }

  // The step: issued eagerly, or the same calls under capture.
  void issue() {
    const float one = 1.f, zero = 0.f;
    RD_LAUNCH(affine_kernel, (kX + 63) / 64, 64, 0, main)(x, a, 1.5f, 0.25f, kX);
    REQUIRE(cudnnConvolutionForward(dnn, &one, xd, a, wd, w, cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0,
                                    &zero, yd, y) == CUDNN_STATUS_SUCCESS);
    REQUIRE(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, kM, kCols, kKdim, &one, y, kM, b, kKdim, &zero, z, kM) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(ncclAllReduce(z, z, kZ, ncclFloat32, ncclSum, comm, main) == ncclSuccess);
    // Fork: the side stream squares z while the main stream waits to join it.
    CUDA_REQUIRE(cudaEventRecord(forked, main));
    CUDA_REQUIRE(cudaStreamWaitEvent(side, forked, 0));
    RD_LAUNCH(square_kernel, (kZ + 63) / 64, 64, 0, side)(z, z2, kZ);
    CUDA_REQUIRE(cudaEventRecord(joined, side));
    CUDA_REQUIRE(cudaStreamWaitEvent(main, joined, 0));
    RD_LAUNCH(add_kernel, (kZ + 63) / 64, 64, 0, main)(z, z2, out, kZ);
    RD_LAUNCH(row_sum_kernel, kRows, 32, 0, main)(out, sums, 8);
    CUDA_REQUIRE(cudaMemcpyAsync(host_out, out, kZ * sizeof(float), cudaMemcpyDeviceToHost, main));
    CUDA_REQUIRE(cudaMemcpyAsync(host_sums, sums, kRows * sizeof(float), cudaMemcpyDeviceToHost, main));
  }

  std::vector<float> result() const {
    std::vector<float> r(host_out, host_out + kZ);
    r.insert(r.end(), host_sums, host_sums + kRows);
    return r;
  }

  std::vector<float> eager(int seed) {
    set_input(seed);
    poison();
    issue();
    CUDA_REQUIRE(cudaStreamSynchronize(main));
    return result();
  }

  ~Pipeline() {
    cudaStreamSynchronize(main);
    cudaStreamSynchronize(side);
    ncclCommDestroy(comm);
    cublasDestroy(blas);
    cudnnDestroyTensorDescriptor(xd);
    cudnnDestroyTensorDescriptor(yd);
    cudnnDestroyFilterDescriptor(wd);
    cudnnDestroyConvolutionDescriptor(cd);
    cudnnDestroy(dnn);
    for (float* p : {x, a, w, y, b, z, z2, out, sums}) cudaFree(p);
    cudaFreeHost(host_out);
    cudaFreeHost(host_sums);
    cudaEventDestroy(forked);
    cudaEventDestroy(joined);
    cudaStreamDestroy(main);
    cudaStreamDestroy(side);
  }
};

bool bit_equal(const std::vector<float>& p, const std::vector<float>& q) {
  return p.size() == q.size() && std::memcmp(p.data(), q.data(), p.size() * sizeof(float)) == 0;
}

bool all_finite(const std::vector<float>& v) {
  for (float f : v)
    if (!std::isfinite(f)) return false;
  return true;
}

std::map<std::string, uint64_t> moved_by(const std::function<void()>& call) {
  const auto before = rd::emu::stats_snapshot();
  call();
  std::map<std::string, uint64_t> diff;
  for (const auto& [name, v] : rd::emu::stats_snapshot())
    if (v != before.at(name)) diff[name] = v - before.at(name);
  return diff;
}

}  // namespace

TEST_CASE("capture: a captured step replays bit-equal to its eager run, on new data too", "[gpu_emu][capture][nccl]") {
  Pipeline p;
  const std::vector<float> eager_a = p.eager(0), eager_b = p.eager(1);
  REQUIRE(all_finite(eager_a));
  REQUIRE(all_finite(eager_b));
  REQUIRE(!bit_equal(eager_a, eager_b));

  p.set_input(0);
  p.poison();
  cudaGraph_t graph = nullptr;
  CUDA_REQUIRE(cudaStreamBeginCapture(p.main, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureStatus status{};
  CUDA_REQUIRE(cudaStreamIsCapturing(p.main, &status));
  CHECK(status == cudaStreamCaptureStatusActive);
  const auto captured = moved_by([&] { p.issue(); });
  // The side stream joined through the event, and left when the capture ended.
  CUDA_REQUIRE(cudaStreamIsCapturing(p.side, &status));
  CHECK(status == cudaStreamCaptureStatusActive);
  CUDA_REQUIRE(cudaStreamEndCapture(p.main, &graph));
  REQUIRE(graph != nullptr);
  CUDA_REQUIRE(cudaStreamIsCapturing(p.side, &status));
  CHECK(status == cudaStreamCaptureStatusNone);
  // Host-side parts ran at capture (the calls were counted), the device work did not.
  CHECK(captured.at("kernel_launches") == 6);  // 4 kernels, the convolution, the GEMM
  CHECK(captured.at("nccl.allreduce") == 1);
  CHECK(captured.count("host_waits") == 0);
  CHECK(std::isnan(p.out[0]));
  CHECK(std::isnan(p.host_sums[0]));

  cudaGraphExec_t exec = nullptr;
  CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_REQUIRE(cudaGraphDestroy(graph));  // the executable graph stands alone
  cudaStream_t launch;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&launch, cudaStreamNonBlocking));
  for (int replay = 0; replay < 3; ++replay) {
    INFO("replay " << replay);
    p.poison();
    const auto launched = moved_by([&] { CUDA_REQUIRE(cudaGraphLaunch(exec, launch)); });
    CHECK(launched == std::map<std::string, uint64_t>{{"graph_launches", 1}});
    CUDA_REQUIRE(cudaStreamSynchronize(launch));
    CHECK(bit_equal(p.result(), eager_a));
  }
  // A graph holds addresses, not values: new input, new result.
  p.set_input(1);
  p.poison();
  CUDA_REQUIRE(cudaGraphLaunch(exec, launch));
  CUDA_REQUIRE(cudaStreamSynchronize(launch));
  CHECK(bit_equal(p.result(), eager_b));
  // Two launches queued back to back run one after the other, both complete.
  p.set_input(0);
  p.poison();
  CUDA_REQUIRE(cudaGraphLaunch(exec, launch));
  CUDA_REQUIRE(cudaGraphLaunch(exec, p.main));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(bit_equal(p.result(), eager_a));
  CUDA_REQUIRE(cudaGraphExecDestroy(exec));
  CUDA_REQUIRE(cudaStreamDestroy(launch));
}

namespace {

// Runs `body` in a child process; returns its exit code and its stderr.
size_t occurrences(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

struct World {
  cudaStream_t s{}, other{};
  cudaEvent_t in_capture{}, outside{};
  float* d = nullptr;
  void* pinned = nullptr;
  std::vector<float> pageable = std::vector<float>(64, 1.f);
};

struct IllegalCall {
  const char* named;  // how the note names it
  cudaError_t expect;
  std::function<cudaError_t(World&)> call;
};

// Child exit codes: 0 as documented; 2 the call's answer; 3 the end of the capture.
int capture_with(World& w, cudaStreamCaptureMode mode, const IllegalCall& ill, cudaError_t end_expect) {
  if (cudaStreamBeginCapture(w.s, mode) != cudaSuccess) return 4;
  RD_LAUNCH(touch_kernel, 1, 64, 0, w.s)(w.d);
  if (cudaEventRecord(w.in_capture, w.s) != cudaSuccess) return 4;
  const cudaError_t got = ill.call(w);
  if (got != ill.expect) {
    std::fprintf(stderr, "call answered %s, expected %s\n", cudaGetErrorName(got), cudaGetErrorName(ill.expect));
    return 2;
  }
  cudaStreamCaptureStatus st{};
  cudaStreamIsCapturing(w.s, &st);
  const bool invalid = end_expect != cudaSuccess;
  if (st != (invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive)) return 3;
  cudaGraph_t g = nullptr;
  const cudaError_t end = cudaStreamEndCapture(w.s, &g);
  if (end != end_expect || (g == nullptr) != invalid) {
    std::fprintf(stderr, "cudaStreamEndCapture answered %s\n", cudaGetErrorName(end));
    return 3;
  }
  // The stream is usable again, eagerly.
  if (cudaStreamSynchronize(w.s) != cudaSuccess) return 3;
  return 0;
}

World make_world() {
  World w;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&w.s, cudaStreamNonBlocking));
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&w.other, cudaStreamNonBlocking));
  CUDA_REQUIRE(cudaEventCreateWithFlags(&w.in_capture, cudaEventDisableTiming));
  CUDA_REQUIRE(cudaEventCreateWithFlags(&w.outside, cudaEventDisableTiming));
  w.d = device_floats(64);
  CUDA_REQUIRE(cudaMemset(w.d, 0, 64 * sizeof(float)));
  CUDA_REQUIRE(cudaMallocHost(&w.pinned, 64 * sizeof(float)));
  CUDA_REQUIRE(cudaEventRecord(w.outside, w.other));
  return w;
}

const std::vector<IllegalCall>& illegal_calls() {
  static const std::vector<IllegalCall> calls = {
      {"cudaStreamSynchronize", cudaErrorStreamCaptureUnsupported, [](World& w) { return cudaStreamSynchronize(w.s); }},
      {"cudaStreamQuery", cudaErrorStreamCaptureUnsupported, [](World& w) { return cudaStreamQuery(w.s); }},
      {"cudaEventSynchronize", cudaErrorCapturedEvent, [](World& w) { return cudaEventSynchronize(w.in_capture); }},
      {"cudaEventQuery", cudaErrorCapturedEvent, [](World& w) { return cudaEventQuery(w.in_capture); }},
      {"cudaDeviceSynchronize", cudaErrorStreamCaptureUnsupported, [](World&) { return cudaDeviceSynchronize(); }},
      {"cudaMalloc", cudaErrorStreamCaptureUnsupported,
       [](World&) {
         void* p = nullptr;
         return cudaMalloc(&p, 16);
       }},
      {"cudaFree", cudaErrorStreamCaptureUnsupported, [](World& w) { return cudaFree(w.d); }},
      {"cudaMallocHost", cudaErrorStreamCaptureUnsupported,
       [](World&) {
         void* p = nullptr;
         return cudaMallocHost(&p, 16);
       }},
      {"cudaHostAlloc", cudaErrorStreamCaptureUnsupported,
       [](World&) {
         void* p = nullptr;
         return cudaHostAlloc(&p, 16, cudaHostAllocDefault);
       }},
      {"cudaFreeHost", cudaErrorStreamCaptureUnsupported, [](World& w) { return cudaFreeHost(w.pinned); }},
      {"cudaMemcpy", cudaErrorStreamCaptureUnsupported,
       [](World& w) { return cudaMemcpy(w.pageable.data(), w.d, 64 * sizeof(float), cudaMemcpyDeviceToHost); }},
      {"cudaMemset", cudaErrorStreamCaptureUnsupported,
       [](World& w) { return cudaMemset(w.d, 0, 64 * sizeof(float)); }},
      {"cudaMemcpyAsync (pageable host memory)", cudaErrorStreamCaptureUnsupported,
       [](World& w) {
         return cudaMemcpyAsync(w.d, w.pageable.data(), 64 * sizeof(float), cudaMemcpyHostToDevice, w.s);
       }},
      {"cudaMemcpyAsync (pageable host memory)", cudaErrorStreamCaptureUnsupported,
       [](World& w) {
         return cudaMemcpyAsync(w.pageable.data(), w.d, 64 * sizeof(float), cudaMemcpyDeviceToHost, w.s);
       }},
      // In global mode even a wait on a stream outside the capture is unsafe.
      {"cudaStreamSynchronize", cudaErrorStreamCaptureUnsupported,
       [](World& w) { return cudaStreamSynchronize(w.other); }},
      {"cudaStreamQuery", cudaErrorStreamCaptureUnsupported, [](World& w) { return cudaStreamQuery(w.other); }},
      {"cudaEventSynchronize", cudaErrorStreamCaptureUnsupported,
       [](World& w) { return cudaEventSynchronize(w.outside); }},
      {"cudaEventQuery", cudaErrorStreamCaptureUnsupported, [](World& w) { return cudaEventQuery(w.outside); }},
      // Only in-stream order may cross into a capture.
      {"cudaStreamWaitEvent (on an event recorded outside the capture)", cudaErrorStreamCaptureIsolation,
       [](World& w) { return cudaStreamWaitEvent(w.s, w.outside, 0); }},
  };
  return calls;
}

}  // namespace

TEST_CASE("capture: each call that conflicts with a capture invalidates it and is named", "[gpu_emu][capture]") {
  World w = make_world();
  for (const IllegalCall& ill : illegal_calls()) {
    const ChildResult c =
        in_child([&] { return capture_with(w, cudaStreamCaptureModeGlobal, ill, cudaErrorStreamCaptureInvalidated); });
    INFO(ill.named << ": child stderr: " << c.err);
    CHECK(c.exit_code == 0);
    CHECK(occurrences(c.err, std::string("cuda-emu: capture invalidated by ") + ill.named + "\n") == 1);
    CHECK(occurrences(c.err, "cuda-emu: capture invalidated by") == 1);
  }
}

TEST_CASE("capture: relaxed mode allows unsafe calls but not the conflicting ones", "[gpu_emu][capture]") {
  World w = make_world();
  const IllegalCall allowed[] = {
      {"cudaMalloc", cudaSuccess,
       [](World&) {
         void* p = nullptr;
         return cudaMalloc(&p, 16);
       }},
      {"cudaStreamSynchronize", cudaSuccess, [](World& w2) { return cudaStreamSynchronize(w2.other); }},
      {"cudaMemcpy", cudaSuccess,
       [](World& w2) { return cudaMemcpy(w2.pageable.data(), w2.d, 64 * sizeof(float), cudaMemcpyDeviceToHost); }},
  };
  for (const IllegalCall& ok : allowed) {
    const ChildResult c = in_child([&] { return capture_with(w, cudaStreamCaptureModeRelaxed, ok, cudaSuccess); });
    INFO(ok.named << ": child stderr: " << c.err);
    CHECK(c.exit_code == 0);
    CHECK(c.err.find("capture invalidated") == std::string::npos);
  }
  // A sync of the capturing stream or a query of an event recorded in it conflicts in
  // every mode.
  for (size_t i : {0u, 3u}) {
    const IllegalCall& ill = illegal_calls()[i];
    const ChildResult c =
        in_child([&] { return capture_with(w, cudaStreamCaptureModeRelaxed, ill, cudaErrorStreamCaptureInvalidated); });
    INFO(ill.named << ": child stderr: " << c.err);
    CHECK(c.exit_code == 0);
    CHECK(occurrences(c.err, std::string("cuda-emu: capture invalidated by ") + ill.named + "\n") == 1);
  }
}

TEST_CASE("capture: another thread's cudaMalloc invalidates a global capture, not a thread-local one",
          "[gpu_emu][capture]") {
  World w = make_world();
  const IllegalCall from_thread{"cudaMalloc", cudaSuccess, [](World&) {
                                  cudaError_t e = cudaSuccess;
                                  std::thread([&] {
                                    void* p = nullptr;
                                    e = cudaMalloc(&p, 16);
                                  }).join();
                                  return e == cudaErrorStreamCaptureUnsupported ? cudaSuccess : e;
                                }};
  const ChildResult global = in_child(
      [&] { return capture_with(w, cudaStreamCaptureModeGlobal, from_thread, cudaErrorStreamCaptureInvalidated); });
  INFO("global: " << global.err);
  CHECK(global.exit_code == 0);
  CHECK(occurrences(global.err, "cuda-emu: capture invalidated by cudaMalloc\n") == 1);
  const IllegalCall allowed_from_thread{"cudaMalloc", cudaSuccess, [](World&) {
                                          cudaError_t e = cudaErrorUnknown;
                                          std::thread([&] {
                                            void* p = nullptr;
                                            e = cudaMalloc(&p, 16);
                                          }).join();
                                          return e;
                                        }};
  const ChildResult local =
      in_child([&] { return capture_with(w, cudaStreamCaptureModeThreadLocal, allowed_from_thread, cudaSuccess); });
  INFO("thread-local: " << local.err);
  CHECK(local.exit_code == 0);
  CHECK(local.err.find("capture invalidated") == std::string::npos);
}

TEST_CASE("capture: an external event record inside a graph is recorded by each launch", "[gpu_emu][capture]") {
  World w = make_world();
  cudaEvent_t before_touch{}, mark{};
  CUDA_REQUIRE(cudaEventCreate(&before_touch));
  CUDA_REQUIRE(cudaEventCreate(&mark));
  // Outside a capture the flag is invalid (the driver's documentation).
  CHECK(cudaEventRecordWithFlags(mark, w.s, cudaEventRecordExternal) == cudaErrorInvalidValue);
  CUDA_REQUIRE(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeThreadLocal));
  RD_LAUNCH(touch_kernel, 1, 64, 0, w.s)(w.d);
  CUDA_REQUIRE(cudaEventRecordWithFlags(mark, w.s, cudaEventRecordExternal));
  RD_LAUNCH(touch_kernel, 1, 64, 0, w.s)(w.d);
  cudaGraph_t g = nullptr;
  CUDA_REQUIRE(cudaStreamEndCapture(w.s, &g));
  cudaGraphExec_t x = nullptr;
  CUDA_REQUIRE(cudaGraphInstantiate(&x, g, 0));
  for (int launch = 1; launch <= 2; ++launch) {
    CUDA_REQUIRE(cudaEventRecord(before_touch, w.s));
    CUDA_REQUIRE(cudaGraphLaunch(x, w.s));
    // The host waits for the mark alone: the graph's first kernel ran, perhaps not the second.
    CUDA_REQUIRE(cudaEventSynchronize(mark));
    CHECK(w.d[0] >= static_cast<float>(2 * launch - 1));
    float ms = -1.f;
    CUDA_REQUIRE(cudaEventElapsedTime(&ms, before_touch, mark));
    CHECK(ms >= 0.f);
    CUDA_REQUIRE(cudaStreamSynchronize(w.s));
    CHECK(w.d[0] == static_cast<float>(2 * launch));
  }
  CUDA_REQUIRE(cudaGraphExecDestroy(x));
  CUDA_REQUIRE(cudaGraphDestroy(g));
  // A plain record in a capture only orders the graph's streams: the host may not wait for
  // or time it, until an eager record replaces it.
  CUDA_REQUIRE(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeThreadLocal));
  CUDA_REQUIRE(cudaEventRecord(mark, w.s));
  CUDA_REQUIRE(cudaStreamEndCapture(w.s, &g));
  CUDA_REQUIRE(cudaGraphInstantiate(&x, g, 0));
  CUDA_REQUIRE(cudaGraphLaunch(x, w.s));
  float ms = 0.f;
  CHECK(cudaEventElapsedTime(&ms, before_touch, mark) == cudaErrorInvalidValue);
  CHECK(cudaEventSynchronize(mark) == cudaErrorInvalidValue);
  CHECK(cudaEventQuery(mark) == cudaErrorInvalidValue);
  CUDA_REQUIRE(cudaEventRecord(mark, w.s));
  CUDA_REQUIRE(cudaEventSynchronize(mark));
  CUDA_REQUIRE(cudaEventElapsedTime(&ms, before_touch, mark));
  CUDA_REQUIRE(cudaGraphExecDestroy(x));
  CUDA_REQUIRE(cudaGraphDestroy(g));
}

TEST_CASE("capture: a fork not joined back, and the host-side checks of the libraries at capture time",
          "[gpu_emu][capture]") {
  World w = make_world();
  CUDA_REQUIRE(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal));
  CUDA_REQUIRE(cudaEventRecord(w.in_capture, w.s));
  CUDA_REQUIRE(cudaStreamWaitEvent(w.other, w.in_capture, 0));
  RD_LAUNCH(touch_kernel, 1, 64, 0, w.other)(w.d);
  cudaGraph_t g = nullptr;
  CHECK(cudaStreamEndCapture(w.s, &g) == cudaErrorStreamCaptureUnjoined);
  CHECK(g == nullptr);
  cudaStreamCaptureStatus st{};
  CUDA_REQUIRE(cudaStreamIsCapturing(w.other, &st));
  CHECK(st == cudaStreamCaptureStatusNone);
  // The work of a failed capture never runs.
  CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(w.d[0] == 0.f);

  // Argument checks answer at the call, during capture as outside it.
  cublasHandle_t blas;
  REQUIRE(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasSetStream(blas, w.s) == CUBLAS_STATUS_SUCCESS);
  const float one = 1.f, zero = 0.f;
  CUDA_REQUIRE(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal));
  CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 1, &one, w.d, 4 /* < m */, w.d, 1, &zero, w.d, 8) ==
        CUBLAS_STATUS_INVALID_VALUE);
  RD_LAUNCH(touch_kernel, 1, 2048 /* > 1024 threads */, 0, w.s)(w.d);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CUDA_REQUIRE(cudaStreamEndCapture(w.s, &g));
  CUDA_REQUIRE(cudaGraphDestroy(g));
  // The capture must begin on a stream of one's own, once.
  CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
  CUDA_REQUIRE(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal));
  CHECK(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal) == cudaErrorIllegalState);
  CUDA_REQUIRE(cudaStreamEndCapture(w.s, &g));
  CHECK(cudaStreamEndCapture(w.s, &g) == cudaErrorIllegalState);
  cublasDestroy(blas);
  // cuDNN's Find allocates its test buffers (cudaMalloc): not during a capture. The
  // heuristics (_v7) are host-side only and fine.
  const ChildResult find = in_child([&] {
    cudnnHandle_t dnn;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    if (cudnnCreate(&dnn) || cudnnCreateTensorDescriptor(&xd) || cudnnCreateTensorDescriptor(&yd) ||
        cudnnCreateFilterDescriptor(&wd) || cudnnCreateConvolutionDescriptor(&cd) ||
        cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1, 4, 4) ||
        cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1, 4, 4) ||
        cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 1, 1, 3, 3) ||
        cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT))
      return 4;
    if (cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal) != cudaSuccess) return 4;
    int got = 0;
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    if (cudnnGetConvolutionForwardAlgorithm_v7(dnn, xd, wd, cd, yd, 8, &got, perf) != CUDNN_STATUS_SUCCESS) return 2;
    if (cudnnFindConvolutionForwardAlgorithm(dnn, xd, wd, cd, yd, 8, &got, perf) == CUDNN_STATUS_SUCCESS) return 2;
    cudaGraph_t none = nullptr;
    return cudaStreamEndCapture(w.s, &none) == cudaErrorStreamCaptureInvalidated ? 0 : 3;
  });
  INFO("cudnnFind: " << find.err);
  CHECK(find.exit_code == 0);
  CHECK(occurrences(find.err,
                    "cuda-emu: capture invalidated by cudnnFindConvolutionForwardAlgorithm (its cudaMalloc)\n") == 1);
  // A kernel given a host pointer during capture faults at the call, as outside it.
  const ChildResult c = in_child([&] {
    CUDA_REQUIRE(cudaStreamBeginCapture(w.s, cudaStreamCaptureModeGlobal));
    RD_LAUNCH(touch_kernel, 1, 64, 0, w.s)(w.pageable.data());
    return 0;
  });
  CHECK(c.exit_code == rd::emu::kFaultExit);
  CHECK(c.err.find("kernel touch_kernel: pointer argument 1 is host memory") != std::string::npos);
}

int main(int argc, char** argv) {
  // Under mpirun the all-reduce spans the ranks; alone, it is a 1-rank communicator.
  const bool under_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE");
  if (under_mpi) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  }
  const int rc = Catch::Session().run(argc, argv);
  if (under_mpi) MPI_Finalize();
  return rc;
}
