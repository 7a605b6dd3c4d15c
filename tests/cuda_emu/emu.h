// The emulated CUDA device (tests only): the internal interface between the
// runtime stand-in (runtime.cpp: memory, streams, events, kernels) and the
// library stand-ins (cublas.cpp, cudnn.cpp, nccl.cpp).
//
// Declarations come from the toolkit's own headers (cuda_runtime_api.h,
// cudnn.h, cublas_v2.h, nccl.h), so signatures and enums are NVIDIA's; the
// definitions are ours and run on the host. Device memory is host memory that
// the runtime tags and guards; every stream is a queue that runs only at
// synchronisation points. See docs/cuda.md, "The emulated device".
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace rd::emu {

// ---- faults -------------------------------------------------------------------------
// Misuse a real GPU answers with undefined behaviour, a crash or a sticky error
// (use after destroy, a host pointer given as a device pointer, an access past an
// allocation, a deadlocked stream): prints "cuda-emu: FAULT: <what>" on stderr and
// ends the process with kFaultExit. Tests of the emulator expect exactly that.
inline constexpr int kFaultExit = 86;
[[noreturn]] void fault(const std::string& what);
// One line "cuda-emu: <what>" on stderr (documented, non-fatal conditions).
void note(const std::string& what);

// ---- the fake device --------------------------------------------------------------------
// Chosen with RD_EMU_DEVICE=rtx5000 (sm_75, 16 GiB, Frontera) | a100 (sm_80, 40 GiB,
// Lonestar6) | h200 (sm_90, 141 GiB); RD_EMU_DEVICE_COUNT (default 1) devices, and
// RD_EMU_MEMORY_MIB overrides the memory size (small values make the OOM paths run).
struct DeviceSpec {
  std::string name;
  int major = 7, minor = 5;
  size_t total_bytes = 0;
  int multiprocessors = 0;
  int max_threads_per_block = 1024;
  int max_block_dims[3] = {1024, 1024, 64};
  int max_grid_dims[3] = {2147483647, 65535, 65535};
  size_t shared_per_block = 48 * 1024;
  int warp_size = 32;
};
const DeviceSpec& device_spec();
int device_count();
int current_device();

// ---- memory ---------------------------------------------------------------------------------
enum class MemKind { Device, PinnedHost };
struct Allocation {
  char* base = nullptr;
  size_t bytes = 0;
  MemKind kind = MemKind::Device;
  int device = 0;
  uint64_t serial = 0;  // n-th allocation of the process, for messages
};
// The live allocation containing p (device or pinned host), or nullptr.
const Allocation* find_allocation(const void* p);
// [p, p + bytes) must lie inside one live allocation (device memory, or pinned host
// memory when allow_pinned); otherwise fault() naming `call` and `role` and saying
// what p is (host memory, freed by cudaFree, past the end of allocation #n).
// bytes == 0 with p == nullptr is accepted.
void require_device(const void* p, size_t bytes, const char* call, const char* role,
                    bool allow_pinned = false);
// "allocation #7 (4096 B, device)" / "freed allocation #7" / "host memory": for messages.
std::string describe_pointer(const void* p);

// ---- streams and work ----------------------------------------------------------------------
// Work queued on a stream runs later, on the host, in stream order, interleaved with
// other streams only as events and cudaStreamWaitEvent allow (docs/cuda.md).
// `what` names the work in fault messages ("cublasSgemm", "kernel relu_fwd_kernel").
// Faults when `s` was destroyed or never created. s == 0 is the legacy stream. On a
// capturing stream the work is recorded into the graph instead, and runs (again) at
// each cudaGraphLaunch: `run` must read its inputs when it runs, not when queued.
void enqueue(cudaStream_t s, std::string what, std::function<void()> run);
// Work that completes later (a collective): start() runs in stream order; the stream
// stays blocked until done() returns true (polled; other streams progress meanwhile).
void enqueue_async(cudaStream_t s, std::string what, std::function<void()> start,
                   std::function<bool()> done);
// True when a stream capture forbids a potentially unsafe call (an allocation, a
// synchronisation) made now from this thread; those captures are then invalidated,
// naming `call` (docs/cuda.md, "Stream capture and graphs").
bool capture_forbids(const std::string& call);
// Faults unless `s` is 0 or a live stream; `call` names the API call for the message.
void require_stream(cudaStream_t s, const char* call);
// Runs queued work until everything enqueued on `s` so far has completed.
void synchronize_stream(cudaStream_t s);

// ---- handles of the library stand-ins -----------------------------------------------------------
// A destroyed handle stays registered as destroyed, so its later use is a fault
// naming the call instead of undefined behaviour.
void register_handle(const void* h, const char* kind);
void retire_handle(const void* h, const char* kind, const char* call);  // faults if not live
void require_handle(const void* h, const char* kind, const char* call);  // faults if not live

// ---- counters (RD_EMU_STATS=PATH; docs/cuda.md) ----------------------------------------------
// What the host asked of the device, counted at the API entry under api_lock(), so a
// test can bound a training step's host waits, allocations, plans and collectives.
// With RD_EMU_STATS set, the process writes them at exit to PATH.rank<R> (stats.cpp).
enum class Counter {
  StreamSync,     // cudaStreamSynchronize
  EventSync,      // cudaEventSynchronize
  DeviceSync,     // cudaDeviceSynchronize (also the implicit one of cublasDestroy/cudnnDestroy)
  BlockingCopy,   // cudaMemcpy, cudaMemset
  PageableCopy,   // cudaMemcpyAsync with a pageable host side
  QueryNotReady,  // cudaStreamQuery / cudaEventQuery answering cudaErrorNotReady
  Allocs,         // cudaMalloc, cudaMallocHost, cudaHostAlloc (every call)
  Frees,          // cudaFree, cudaFreeHost (every call)
  CudnnFind,      // cudnnFind*Algorithm, cudnnGet*Algorithm_v7
  NcclAllReduce,
  NcclBroadcast,
  NcclReduce,
  NcclAllGather,
  NcclReduceScatter,
  NcclSend,
  NcclRecv,
  KernelLaunches,  // RD_LAUNCH, and every cuBLAS/cuDNN compute call
  GraphLaunches,   // cudaGraphLaunch
  QueryNotReadyFirst,  // not-ready queries that start a poll (none of the same handle just before)
  QueryNotReadyGapUs,  // host microseconds between two not-ready queries of one stream or event
  kCount
};
void count(Counter c);
// A stream or event query starts (`handle`: the stream or event) / answered cudaErrorNotReady:
// counts QueryNotReady, and the host time since this thread's previous not-ready query of
// the same handle (the poller's sleep; the emulated work inside the queries is left out),
// or QueryNotReadyFirst when that query was of another handle.
void query_started(const void* handle);
void query_not_ready(const void* handle);
// Every counter by its RD_EMU_STATS name, the totals (host_waits, nccl) included.
std::map<std::string, uint64_t> stats_snapshot();

// Every entry point of the stand-ins holds this lock: programs call CUDA from
// several threads (the DDP progress thread, the watchdog).
std::recursive_mutex& api_lock();

}  // namespace rd::emu
