// Compiles kernels/*.cu as host C++ for the emulated device (tests only). Included
// before anything else in each kernel file's emulated build (CMake generates the
// wrappers), so the toolkit's headers see our definitions of __global__ and friends.
//
// A kernel is an ordinary function; RD_LAUNCH enqueues grid x block calls of it on
// the stream. Each block runs as a team of fibers on one host thread: a thread
// runs until __syncthreads or a warp operation, so block barriers, __shared__
// storage (a static: blocks never overlap) and warp shuffles/votes behave as on
// the device, and a missing barrier gives wrong numbers instead of passing by luck.
#pragma once

#define __global__
#define __device__
#define __host__
#define __shared__ static

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <vector>

namespace rd::emu {

// The executing thread's coordinates (valid only inside a kernel).
const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
void sync_threads();
// Warp exchange: each lane of `mask` offers `value`; returns what lane `src_lane`
// offered (out-of-range source: the caller's own value, as __shfl_*_sync).
uint64_t warp_shuffle(unsigned mask, uint64_t value, int src_lane, const char* op);
// Warp vote over `mask`: kind 0 any, 1 all; ballot returns the bit mask.
unsigned warp_ballot(unsigned mask, bool pred, const char* op);
int lane_id();

// Enqueues `body` for grid x block threads on `stream`. Checks the launch as the
// device does (threads per block, block and grid dimensions, shared memory): a bad
// configuration sets cudaErrorInvalidConfiguration for cudaGetLastError and runs
// nothing. `pointers` are the kernel's pointer arguments: each must be device (or
// pinned host) memory, else a fault naming the kernel and the argument.
void launch_kernel(const char* name, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                   std::vector<const void*> pointers, std::function<void()> body);

template <class T> void collect_pointer(const T& arg, std::vector<const void*>& out) {
  if constexpr (std::is_pointer_v<T>) out.push_back(static_cast<const void*>(arg));
}

template <class... P> struct Launcher {
  void (*kernel)(P...);
  const char* name;
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
  template <class... A> void operator()(A&&... a) const {
    // Arguments are copied at launch, converted to the parameter types, as CUDA does.
    std::tuple<std::decay_t<P>...> args(std::forward<A>(a)...);
    std::vector<const void*> pointers;
    std::apply([&](const auto&... v) { (collect_pointer(v, pointers), ...); }, args);
    auto* k = kernel;
    launch_kernel(name, grid, block, shared_bytes, stream, std::move(pointers),
                  [k, args]() { std::apply(k, args); });
  }
};

template <class... P>
Launcher<P...> make_launcher(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared,
                             cudaStream_t stream) {
  return Launcher<P...>{kernel, name, grid, block, shared, stream};
}

}  // namespace rd::emu

#define RD_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  ::rd::emu::make_launcher(#kernel, kernel, grid, block, shared_bytes, stream)

#define threadIdx (::rd::emu::thread_idx())
#define blockIdx (::rd::emu::block_idx())
#define blockDim (::rd::emu::block_dim())
#define gridDim (::rd::emu::grid_dim())

inline void __syncthreads() { ::rd::emu::sync_threads(); }

template <class T> inline T rd_emu_shuffle(unsigned mask, T v, int src, const char* op) {
  static_assert(sizeof(T) <= 8, "warp shuffle of a type over 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = ::rd::emu::warp_shuffle(mask, bits, src, op);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::rd::emu::lane_id();
  const int src = (lane % width) + static_cast<int>(delta) < width ? lane + static_cast<int>(delta) : lane;
  return rd_emu_shuffle(mask, v, src, "__shfl_down_sync");
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::rd::emu::lane_id();
  const int src = (lane % width) >= static_cast<int>(delta) ? lane - static_cast<int>(delta) : lane;
  return rd_emu_shuffle(mask, v, src, "__shfl_up_sync");
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = ::rd::emu::lane_id();
  const int src = ((lane ^ lane_mask) / width == lane / width) ? (lane ^ lane_mask) : lane;
  return rd_emu_shuffle(mask, v, src, "__shfl_xor_sync");
}
template <class T> inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  const int lane = ::rd::emu::lane_id();
  return rd_emu_shuffle(mask, v, (lane / width) * width + (src_lane % width), "__shfl_sync");
}
inline int __any_sync(unsigned mask, int pred) {
  return ::rd::emu::warp_ballot(mask, pred != 0, "__any_sync") != 0;
}
inline int __all_sync(unsigned mask, int pred) {
  const unsigned b = ::rd::emu::warp_ballot(mask, pred != 0, "__all_sync");
  return b == mask;
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  return ::rd::emu::warp_ballot(mask, pred != 0, "__ballot_sync");
}

// Blocks of one launch run one after another on one host thread, so a plain
// read-modify-write is atomic; the block order is the emulator's (not launch
// order), so float sums differ in the last bits from run to run as on a GPU.
template <class T> inline T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <class T> inline T atomicMax(T* p, T v) {
  const T old = *p;
  if (v > old) *p = v;
  return old;
}
template <class T> inline T atomicOr(T* p, T v) {
  const T old = *p;
  *p = old | v;
  return old;
}

using std::isfinite;
using std::isinf;
using std::isnan;

// The device's integer/float min and max (CUDA's math API has them unqualified).
template <class T> inline T min(T a, T b) { return b < a ? b : a; }
template <class T> inline T max(T a, T b) { return a < b ? b : a; }
