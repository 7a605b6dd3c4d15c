// Direct test of the emulated NCCL (tests/cuda_emu/nccl.cpp) under mpirun
// with 2 or 4 ranks: every operation, datatype, reduction and root against exact
// expected values, in place and out of place; group send/recv (a ring of 4 MB
// messages, an all-to-all with self); a group over two streams; two communicators
// on two streams waited for in opposite orders; non-blocking init; error returns;
// ncclCommAbort with an operation pending (must not hang). Rank 0 also runs child
// processes without MPI: a 1-rank communicator, and the misuses the emulator must
// catch (exit 86, "cuda-emu: FAULT" on stderr): use after ncclCommDestroy and after
// ncclCommAbort, a host pointer, a partial overlap, send/recv counts that differ,
// memory of another device.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <mpi.h>
#include <nccl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

extern char** environ;

namespace {

int g_rank = 0, g_size = 1;
int failures = 0;

void failf(const char* fmt, ...) {
  ++failures;
  std::va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "rank %d: FAILED ", g_rank);
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
  va_end(ap);
}

#define NCCL_OK(call)                                                                                   \
  do {                                                                                                  \
    const ncclResult_t r_ = (call);                                                                     \
    if (r_ != ncclSuccess) {                                                                            \
      std::fprintf(stderr, "rank %d: %s returned %s (%s) at line %d\n", g_rank, #call,                 \
                   ncclGetErrorString(r_), ncclGetLastError(nullptr), __LINE__);                       \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)
#define CUDA_OK(call)                                                                                   \
  do {                                                                                                  \
    const cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "rank %d: %s returned %s at line %d\n", g_rank, #call, cudaGetErrorString(e_), \
                   __LINE__);                                                                           \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

// ---- host values of every element type -------------------------------------------------------
template <class T> double to_d(T v) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else return static_cast<double>(v);
}
template <class T> T from_d(double d) {
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(static_cast<float>(d));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(static_cast<float>(d));
  else return static_cast<T>(d);
}
template <class T> constexpr bool is_signed_v =
    std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16> || std::is_signed_v<T>;
template <class T> constexpr bool is_int_v = std::is_integral_v<T>;

// Rank r's element i: small integers (exact in every type, products <= 81), negative
// on odd ranks for signed types so integer averages truncate toward zero.
template <class T> double value(int r, size_t i) {
  const double v = 1 + static_cast<double>((static_cast<size_t>(r) + i) % 3);
  return is_signed_v<T> && (r % 2) ? -v : v;
}

double reduce_expected(double (*val)(int, size_t), size_t i, ncclRedOp_t op, int n, bool integer) {
  double acc = val(0, i);
  for (int q = 1; q < n; ++q) {
    const double v = val(q, i);
    if (op == ncclProd) acc *= v;
    else if (op == ncclMax) acc = std::max(acc, v);
    else if (op == ncclMin) acc = std::min(acc, v);
    else acc += v;
  }
  if (op == ncclAvg) {
    if (integer) acc = static_cast<double>(static_cast<long long>(acc) / n);  // C division: toward zero
    else acc /= n;
  }
  return acc;
}

// A device buffer of `count` T, with host-side helpers ordered on `stream`.
template <class T> struct Dev {
  T* p = nullptr;
  size_t count = 0;
  cudaStream_t s;
  Dev(size_t n, cudaStream_t stream) : count(n), s(stream) {
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * sizeof(T)));
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  void put(const std::vector<T>& v) {
    CUDA_OK(cudaMemcpyAsync(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaStreamSynchronize(s));
  }
  std::vector<T> get() {
    std::vector<T> v(count);
    CUDA_OK(cudaMemcpyAsync(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    return v;
  }
};

const char* op_name(ncclRedOp_t op) {
  static const char* names[] = {"sum", "prod", "max", "min", "avg"};
  return op >= 0 && op < 5 ? names[op] : "?";
}

template <class T> void check_allreduce(ncclComm_t comm, cudaStream_t s, ncclDataType_t type, const char* tname) {
  const int n = g_size, r = g_rank;
  for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
      for (int in_place = 0; in_place < 2; ++in_place) {
        std::vector<T> mine(count);
        for (size_t i = 0; i < count; ++i) mine[i] = from_d<T>(value<T>(r, i));
        Dev<T> send(count, s), recv(count, s);
        send.put(mine);
        recv.put(std::vector<T>(count, from_d<T>(99)));
        T* dst = in_place ? send.p : recv.p;
        NCCL_OK(ncclAllReduce(send.p, dst, count, type, op, comm, s));
        CUDA_OK(cudaStreamSynchronize(s));
        const std::vector<T> got = in_place ? send.get() : recv.get();
        for (size_t i = 0; i < count; ++i) {
          const double want = reduce_expected(value<T>, i, op, n, is_int_v<T>);
          if (to_d(got[i]) != want) {
            failf("ncclAllReduce %s %s count %zu %s: [%zu] = %g, want %g", tname, op_name(op), count,
                  in_place ? "in place" : "out of place", i, to_d(got[i]), want);
            break;
          }
        }
      }
    }
  }
}

void check_all_types(ncclComm_t comm, cudaStream_t s) {
  check_allreduce<float>(comm, s, ncclFloat32, "float32");
  check_allreduce<double>(comm, s, ncclFloat64, "float64");
  check_allreduce<int32_t>(comm, s, ncclInt32, "int32");
  check_allreduce<int64_t>(comm, s, ncclInt64, "int64");
  check_allreduce<uint8_t>(comm, s, ncclUint8, "uint8");
  check_allreduce<int8_t>(comm, s, ncclInt8, "int8");
  check_allreduce<uint32_t>(comm, s, ncclUint32, "uint32");
  check_allreduce<uint64_t>(comm, s, ncclUint64, "uint64");
  check_allreduce<__half>(comm, s, ncclFloat16, "float16");
  check_allreduce<__nv_bfloat16>(comm, s, ncclBfloat16, "bfloat16");
}

// Integer averages with a remainder: rank r contributes r+1 (sum n(n+1)/2).
void check_int_avg_truncation(ncclComm_t comm, cudaStream_t s) {
  const int n = g_size;
  Dev<int32_t> buf(3, s);
  buf.put({g_rank + 1, -(g_rank + 1), 2 * g_rank + 1});
  NCCL_OK(ncclAllReduce(buf.p, buf.p, 3, ncclInt32, ncclAvg, comm, s));
  const std::vector<int32_t> got = buf.get();
  const int sum = n * (n + 1) / 2;
  const int want[3] = {sum / n, -sum / n, (n * n) / n};
  for (int i = 0; i < 3; ++i)
    if (got[static_cast<size_t>(i)] != want[i]) failf("int32 avg [%d] = %d, want %d", i, got[static_cast<size_t>(i)], want[i]);
}

void check_broadcast(ncclComm_t comm, cudaStream_t s) {
  for (int root = 0; root < g_size; ++root) {
    for (size_t count : {size_t{0}, size_t{7}, size_t{1000}}) {
      for (int in_place = 0; in_place < 2; ++in_place) {
        std::vector<float> mine(count);
        for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(g_rank * 1000 + static_cast<int>(i));
        Dev<float> send(count, s), recv(count, s);
        send.put(mine);
        recv.put(std::vector<float>(count, -1.0f));
        NCCL_OK(ncclBroadcast(send.p, in_place ? send.p : recv.p, count, ncclFloat32, root, comm, s));
        const std::vector<float> got = in_place ? send.get() : recv.get();
        for (size_t i = 0; i < count; ++i)
          if (got[i] != static_cast<float>(root * 1000 + static_cast<int>(i))) {
            failf("ncclBroadcast root %d count %zu %s: [%zu] = %g", root, count, in_place ? "in place" : "", i,
                  static_cast<double>(got[i]));
            break;
          }
      }
    }
    // Bytes, as NcclComm::broadcast sends them.
    Dev<uint8_t> b(13, s);
    b.put(std::vector<uint8_t>(13, static_cast<uint8_t>(g_rank + 10)));
    NCCL_OK(ncclBroadcast(b.p, b.p, 13, ncclUint8, root, comm, s));
    for (uint8_t v : b.get())
      if (v != root + 10) {
        failf("ncclBroadcast uint8 root %d: %d", root, v);
        break;
      }
  }
}

void check_reduce(ncclComm_t comm, cudaStream_t s) {
  const size_t count = 9;
  for (int root = 0; root < g_size; ++root) {
    for (ncclRedOp_t op : {ncclSum, ncclAvg, ncclMax}) {
      for (int in_place = 0; in_place < 2; ++in_place) {
        std::vector<int32_t> mine(count);
        for (size_t i = 0; i < count; ++i) mine[i] = static_cast<int32_t>(value<int32_t>(g_rank, i));
        Dev<int32_t> send(count, s), recv(count, s);
        send.put(mine);
        recv.put(std::vector<int32_t>(count, 77));
        NCCL_OK(ncclReduce(send.p, in_place ? send.p : recv.p, count, ncclInt32, op, root, comm, s));
        const std::vector<int32_t> got = in_place ? send.get() : recv.get();
        for (size_t i = 0; i < count; ++i) {
          // Only the root's recvbuff is written.
          const double want = g_rank == root ? reduce_expected(value<int32_t>, i, op, g_size, true)
                                             : (in_place ? mine[i] : 77);
          if (got[i] != want) {
            failf("ncclReduce root %d %s %s: [%zu] = %d, want %g", root, op_name(op), in_place ? "in place" : "", i,
                  got[i], want);
            break;
          }
        }
      }
    }
  }
}

void check_allgather(ncclComm_t comm, cudaStream_t s) {
  const int n = g_size;
  for (size_t count : {size_t{0}, size_t{5}, size_t{3000}}) {
    for (int in_place = 0; in_place < 2; ++in_place) {
      std::vector<double> mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = g_rank * 10000.0 + static_cast<double>(i);
      Dev<double> recv(count * static_cast<size_t>(n), s), send(count, s);
      recv.put(std::vector<double>(count * static_cast<size_t>(n), -1.0));
      double* src = in_place ? recv.p + static_cast<size_t>(g_rank) * count : send.p;
      CUDA_OK(cudaMemcpyAsync(src, mine.data(), count * sizeof(double), cudaMemcpyHostToDevice, s));
      NCCL_OK(ncclAllGather(src, recv.p, count, ncclFloat64, comm, s));
      const std::vector<double> got = recv.get();
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < count; ++i)
          if (got[static_cast<size_t>(q) * count + i] != q * 10000.0 + static_cast<double>(i)) {
            failf("ncclAllGather count %zu %s: rank %d's [%zu] = %g", count, in_place ? "in place" : "", q, i,
                  got[static_cast<size_t>(q) * count + i]);
            q = n;
            break;
          }
    }
  }
}

void check_reduce_scatter(ncclComm_t comm, cudaStream_t s) {
  const int n = g_size;
  const size_t count = 6;  // per rank
  for (ncclRedOp_t op : {ncclSum, ncclAvg, ncclMin}) {
    for (int in_place = 0; in_place < 2; ++in_place) {
      const size_t total = count * static_cast<size_t>(n);
      std::vector<float> mine(total);
      for (size_t i = 0; i < total; ++i) mine[i] = static_cast<float>(value<float>(g_rank, i));
      Dev<float> send(total, s), recv(count, s);
      send.put(mine);
      recv.put(std::vector<float>(count, -5.0f));
      float* dst = in_place ? send.p + static_cast<size_t>(g_rank) * count : recv.p;
      NCCL_OK(ncclReduceScatter(send.p, dst, count, ncclFloat32, op, comm, s));
      std::vector<float> got = send.get();
      if (in_place) got.assign(got.begin() + static_cast<long>(static_cast<size_t>(g_rank) * count),
                               got.begin() + static_cast<long>(static_cast<size_t>(g_rank + 1) * count));
      else got = recv.get();
      for (size_t i = 0; i < count; ++i) {
        const double want = reduce_expected(value<float>, static_cast<size_t>(g_rank) * count + i, op, n, false);
        if (got[i] != want) {
          failf("ncclReduceScatter %s %s: [%zu] = %g, want %g", op_name(op), in_place ? "in place" : "", i,
                static_cast<double>(got[i]), want);
          break;
        }
      }
    }
  }
}

// Every rank sends 4 MB to the next and receives from the previous, in one group:
// without the group's joint issue, the sends (rendezvous-sized) would deadlock.
void check_group_ring(ncclComm_t comm, cudaStream_t s) {
  const int n = g_size, next = (g_rank + 1) % n, prev = (g_rank + n - 1) % n;
  const size_t count = size_t{1} << 20;
  std::vector<float> mine(count);
  for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(g_rank) + static_cast<float>(i % 100) * 0.5f;
  Dev<float> send(count, s), recv(count, s);
  send.put(mine);
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(send.p, count, ncclFloat32, next, comm, s));
  NCCL_OK(ncclRecv(recv.p, count, ncclFloat32, prev, comm, s));
  NCCL_OK(ncclGroupEnd());
  const std::vector<float> got = recv.get();
  for (size_t i = 0; i < count; ++i)
    if (got[i] != static_cast<float>(prev) + static_cast<float>(i % 100) * 0.5f) {
      failf("group ring: [%zu] = %g from rank %d", i, static_cast<double>(got[i]), prev);
      break;
    }

  // All-to-all including self, receives issued before sends, nested groups.
  const size_t chunk = 1000;
  Dev<int64_t> a(chunk * static_cast<size_t>(n), s), b(chunk * static_cast<size_t>(n), s);
  std::vector<int64_t> out(chunk * static_cast<size_t>(n));
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < chunk; ++i) out[static_cast<size_t>(q) * chunk + i] = g_rank * 100000 + q * 1000 + static_cast<int64_t>(i);
  a.put(out);
  NCCL_OK(ncclGroupStart());
  for (int q = 0; q < n; ++q) NCCL_OK(ncclRecv(b.p + static_cast<size_t>(q) * chunk, chunk, ncclInt64, q, comm, s));
  NCCL_OK(ncclGroupStart());
  for (int q = 0; q < n; ++q) NCCL_OK(ncclSend(a.p + static_cast<size_t>(q) * chunk, chunk, ncclInt64, q, comm, s));
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(ncclGroupEnd());
  const std::vector<int64_t> in = b.get();
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < chunk; ++i)
      if (in[static_cast<size_t>(q) * chunk + i] != q * 100000 + g_rank * 1000 + static_cast<int64_t>(i)) {
        failf("group all-to-all: from rank %d [%zu] = %lld", q, i, static_cast<long long>(in[static_cast<size_t>(q) * chunk + i]));
        q = n;
        break;
      }
}

// One group over two streams, and two communicators on two streams waited for in
// opposite orders on even and odd ranks: a real GPU runs both streams at once.
void check_streams(ncclComm_t comm, ncclComm_t comm2, cudaStream_t s1, cudaStream_t s2) {
  const int n = g_size;
  Dev<float> x(5, s1), y(5, s2);
  x.put(std::vector<float>(5, 1.0f));
  y.put(std::vector<float>(5, 2.0f));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(x.p, x.p, 5, ncclFloat32, ncclSum, comm, s1));
  NCCL_OK(ncclAllReduce(y.p, y.p, 5, ncclFloat32, ncclSum, comm2, s2));
  NCCL_OK(ncclGroupEnd());
  for (float v : x.get()) if (v != static_cast<float>(n)) { failf("group over two streams: x = %g", static_cast<double>(v)); break; }
  for (float v : y.get()) if (v != 2.0f * static_cast<float>(n)) { failf("group over two streams: y = %g", static_cast<double>(v)); break; }

  x.put(std::vector<float>(5, 3.0f));
  y.put(std::vector<float>(5, 4.0f));
  NCCL_OK(ncclAllReduce(x.p, x.p, 5, ncclFloat32, ncclMax, comm, s1));
  NCCL_OK(ncclAllReduce(y.p, y.p, 5, ncclFloat32, ncclSum, comm2, s2));
  if (g_rank % 2) {
    CUDA_OK(cudaStreamSynchronize(s2));
    CUDA_OK(cudaStreamSynchronize(s1));
  } else {
    CUDA_OK(cudaStreamSynchronize(s1));
    CUDA_OK(cudaStreamSynchronize(s2));
  }
  for (float v : x.get()) if (v != 3.0f) { failf("two streams: x = %g", static_cast<double>(v)); break; }
  for (float v : y.get()) if (v != 4.0f * static_cast<float>(n)) { failf("two streams: y = %g", static_cast<double>(v)); break; }
}

ncclComm_t make_comm(bool blocking, ncclResult_t* first = nullptr) {
  ncclUniqueId id;
  if (g_rank == 0) NCCL_OK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t c = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking ? 1 : 0;
  const ncclResult_t r = ncclCommInitRankConfig(&c, g_size, id, g_rank, &config);
  if (first) *first = r;
  if (r != ncclSuccess && r != ncclInProgress) {
    std::fprintf(stderr, "rank %d: ncclCommInitRankConfig: %s %s\n", g_rank, ncclGetErrorString(r), ncclGetLastError(nullptr));
    std::exit(1);
  }
  return c;
}

// Polls until the communicator leaves ncclInProgress; returns how many polls said so.
int settle(ncclComm_t c) {
  int in_progress = 0;
  for (int i = 0; i < 100000; ++i) {
    ncclResult_t a = ncclInProgress;
    NCCL_OK(ncclCommGetAsyncError(c, &a));
    if (a == ncclSuccess) return in_progress;
    if (a != ncclInProgress) {
      failf("ncclCommGetAsyncError reported %s", ncclGetErrorString(a));
      return in_progress;
    }
    ++in_progress;
    usleep(100);
  }
  failf("communicator stayed in progress");
  return in_progress;
}

void check_nonblocking(cudaStream_t s) {
  ncclResult_t first = ncclSuccess;
  ncclComm_t c = make_comm(false, &first);
  if (first != ncclInProgress) failf("non-blocking ncclCommInitRankConfig returned %s, want ncclInProgress", ncclGetErrorString(first));
  // UNCERTAIN reading, kept strict: no use before the init is seen to complete.
  Dev<double> d(3, s);
  if (ncclAllReduce(d.p, d.p, 3, ncclFloat64, ncclSum, c, s) == ncclSuccess)
    failf("a collective during a non-blocking init returned ncclSuccess");
  if (settle(c) < 1) failf("non-blocking init never reported ncclInProgress");
  d.put({1.0, 2.0, 3.0});
  const ncclResult_t r = ncclAllReduce(d.p, d.p, 3, ncclFloat64, ncclSum, c, s);
  if (r != ncclSuccess && r != ncclInProgress) failf("ncclAllReduce on a non-blocking comm: %s", ncclGetErrorString(r));
  settle(c);
  const std::vector<double> got = d.get();
  for (int i = 0; i < 3; ++i)
    if (got[static_cast<size_t>(i)] != (i + 1.0) * g_size) failf("non-blocking allreduce [%d] = %g", i, got[static_cast<size_t>(i)]);
  int count = 0, rank = -1, dev = -1, cur = -2;
  NCCL_OK(ncclCommCount(c, &count));
  NCCL_OK(ncclCommUserRank(c, &rank));
  NCCL_OK(ncclCommCuDevice(c, &dev));
  CUDA_OK(cudaGetDevice(&cur));
  if (count != g_size || rank != g_rank || dev != cur) failf("count/rank/device = %d/%d/%d", count, rank, dev);
  NCCL_OK(ncclCommDestroy(c));
}

void check_errors(ncclComm_t comm, cudaStream_t s) {
  Dev<float> d(4, s);
  ncclResult_t r = ncclAllReduce(d.p, d.p, 4, ncclFloat8e4m3, ncclSum, comm, s);
  if (r != ncclInvalidArgument) failf("fp8 allreduce returned %s", ncclGetErrorString(r));
  if (std::strlen(ncclGetLastError(comm)) == 0) failf("ncclGetLastError is empty after an error");
  r = ncclBroadcast(d.p, d.p, 4, ncclFloat32, g_size, comm, s);
  if (r != ncclInvalidArgument) failf("broadcast from root %d returned %s", g_size, ncclGetErrorString(r));
  r = ncclSend(d.p, 4, ncclFloat32, -1, comm, s);
  if (r != ncclInvalidArgument) failf("send to rank -1 returned %s", ncclGetErrorString(r));
  // An error inside a group: reported again by ncclGroupEnd, nothing issued.
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(d.p, d.p, 4, ncclFloat32, ncclSum, comm, s));
  (void)ncclAllReduce(d.p, d.p, 4, ncclFloat32, static_cast<ncclRedOp_t>(17), comm, s);
  r = ncclGroupEnd();
  if (r != ncclInvalidArgument) failf("ncclGroupEnd after a failed call returned %s", ncclGetErrorString(r));
  if (ncclGroupEnd() != ncclInvalidUsage) failf("ncclGroupEnd without ncclGroupStart succeeded");
  if (std::strlen(ncclGetErrorString(ncclInProgress)) == 0) failf("ncclGetErrorString is empty");
  int version = 0;
  NCCL_OK(ncclGetVersion(&version));
  if (version != NCCL_VERSION_CODE) failf("ncclGetVersion = %d", version);
}

void on_alarm(int) {
  static const char msg[] = "nccl_standin_test: HANG (ncclCommAbort did not release the pending operation)\n";
  (void)!write(2, msg, sizeof msg - 1);
  _exit(3);
}

// All ranks but the last start an all-reduce the last never joins; everyone aborts;
// the stream must then drain, the output left as it was.
void check_abort_pending(cudaStream_t s) {
  ncclComm_t c = make_comm(true);
  Dev<float> d(1000, s);
  d.put(std::vector<float>(1000, 5.0f));
  const bool joins = g_rank != g_size - 1;
  if (joins) {
    NCCL_OK(ncclAllReduce(d.p, d.p, 1000, ncclFloat32, ncclSum, c, s));
    for (int i = 0; i < 20; ++i) {
      const cudaError_t q = cudaStreamQuery(s);  // lets the emulator start (post) it
      if (q == cudaSuccess) {
        failf("an all-reduce missing a rank completed");
        break;
      }
      if (q != cudaErrorNotReady) failf("cudaStreamQuery: %s", cudaGetErrorString(q));
      usleep(1000);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::signal(SIGALRM, on_alarm);
  alarm(60);
  NCCL_OK(ncclCommAbort(c));
  CUDA_OK(cudaStreamSynchronize(s));
  alarm(0);
  for (float v : d.get())
    if (v != 5.0f) {
      failf("an aborted all-reduce wrote its output: %g", static_cast<double>(v));
      break;
    }
  MPI_Barrier(MPI_COMM_WORLD);
}

// ---- children: no MPI ---------------------------------------------------------------------
int child(const std::string& what) {
  g_rank = 0;
  g_size = 1;
  CUDA_OK(cudaSetDevice(0));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t c = nullptr;
  NCCL_OK(ncclCommInitRank(&c, 1, id, 0));
  Dev<float> d(8, s);
  d.put(std::vector<float>(8, 3.0f));
  if (what == "local") {  // a 1-rank communicator works without MPI
    check_allreduce<float>(c, s, ncclFloat32, "float32");
    check_allreduce<int64_t>(c, s, ncclInt64, "int64");
    check_allreduce<__half>(c, s, ncclFloat16, "float16");
    check_broadcast(c, s);
    check_reduce(c, s);
    check_allgather(c, s);
    check_reduce_scatter(c, s);
    check_group_ring(c, s);
    NCCL_OK(ncclCommDestroy(c));
    ncclComm_t c2 = nullptr;  // more than one rank needs MPI: an error, not a hang
    const ncclResult_t r = ncclCommInitRank(&c2, 2, id, 0);
    if (r != ncclInvalidUsage) failf("a 2-rank communicator without MPI: %s", ncclGetErrorString(r));
    std::printf("local: %d failures\n", failures);
    return failures ? 1 : 0;
  }
  if (what == "use-after-destroy") {
    NCCL_OK(ncclCommDestroy(c));
    ncclAllReduce(d.p, d.p, 8, ncclFloat32, ncclSum, c, s);
  } else if (what == "use-after-abort") {
    NCCL_OK(ncclCommAbort(c));
    ncclResult_t a;
    ncclCommGetAsyncError(c, &a);
  } else if (what == "host-pointer") {
    std::vector<float> host(8);
    ncclAllReduce(d.p, host.data(), 8, ncclFloat32, ncclSum, c, s);
  } else if (what == "partial-overlap") {
    ncclAllReduce(d.p, d.p + 1, 4, ncclFloat32, ncclSum, c, s);
  } else if (what == "count-mismatch") {  // ncclSend of 8 matched by ncclRecv of 4
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(d.p, 8, ncclFloat32, 0, c, s));
    NCCL_OK(ncclRecv(d.p, 4, ncclFloat32, 0, c, s));
    NCCL_OK(ncclGroupEnd());
    cudaStreamSynchronize(s);
  } else if (what == "wrong-device") {  // memory of device 1, communicator of device 0
    float* p = nullptr;
    CUDA_OK(cudaSetDevice(1));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&p), 8 * sizeof(float)));
    CUDA_OK(cudaSetDevice(0));
    ncclAllReduce(p, p, 8, ncclFloat32, ncclSum, c, s);
  }
  std::printf("%s: not caught\n", what.c_str());
  return 0;
}

// Runs this program as `--child=<what>`; returns its exit status, its output in *out.
int run_child(const char* self, const std::string& what, std::string* out) {
  char path[] = "/tmp/nccl_standin_child_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd, 1);
  posix_spawn_file_actions_adddup2(&fa, fd, 2);
  const std::string arg = "--child=" + what;
  char* argv[] = {const_cast<char*>(self), const_cast<char*>(arg.c_str()), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, self, &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fd);
  int status = 0;
  if (rc == 0) waitpid(pid, &status, 0);
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  unlink(path);
  if (rc != 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void check_children() {
  std::string out;
  int rc = run_child("/proc/self/exe", "local", &out);
  if (rc != 0) failf("1-rank communicator without MPI: exit %d\n%s", rc, out.c_str());
  int devices = 0;
  CUDA_OK(cudaGetDeviceCount(&devices));
  for (const char* what : {"use-after-destroy", "use-after-abort", "host-pointer", "partial-overlap", "count-mismatch",
                           "wrong-device"}) {
    if (devices < 2 && std::strcmp(what, "wrong-device") == 0) continue;
    rc = run_child("/proc/self/exe", what, &out);
    if (rc != 86 || out.find("cuda-emu: FAULT") == std::string::npos)
      failf("%s: exit %d (want 86 and \"cuda-emu: FAULT\"); output:\n%s", what, rc, out.c_str());
    else
      std::printf("%s caught: %s", what, out.substr(out.find("cuda-emu: FAULT")).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strncmp(argv[1], "--child=", 8) == 0) return child(argv[1] + 8);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  int devices = 0;
  CUDA_OK(cudaGetDeviceCount(&devices));
  CUDA_OK(cudaSetDevice(g_rank % devices));
  cudaStream_t s1, s2;
  CUDA_OK(cudaStreamCreate(&s1));
  CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));

  ncclComm_t comm = make_comm(true), comm2 = make_comm(true);
  check_all_types(comm, s1);
  check_int_avg_truncation(comm, s1);
  check_broadcast(comm, s1);
  check_reduce(comm, s1);
  check_allgather(comm, s1);
  check_reduce_scatter(comm, s1);
  check_group_ring(comm, s1);
  // Two communicators on two streams waited for in opposite orders: both schedules
  // must run the other stream while one waits for a collective in flight.
  check_streams(comm, comm2, s1, s2);
  check_nonblocking(s1);
  check_errors(comm, s1);
  NCCL_OK(ncclCommDestroy(comm2));
  if (g_size > 1) check_abort_pending(s2);
  NCCL_OK(ncclCommDestroy(comm));
  if (g_rank == 0) check_children();

  int failed = failures ? 1 : 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) std::printf("nccl_standin_test (%d ranks): %s\n", g_size, any ? "FAILED" : "all checks passed");
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  MPI_Finalize();
  return any ? 1 : 0;
}
