// NCCL stand-in of the emulated CUDA device (tests only; see emu.h and docs/cuda.md,
// "The emulated device"). The declarations are the toolkit's <nccl.h>; these
// definitions are a second reading of NCCL's documentation, running over MPI so
// that 2 and 4 real processes really communicate.
//
// How it maps onto MPI:
// - ncclGetUniqueId puts a random 64-bit key into the id. ncclCommInitRank[Config]
//   calls MPI_Comm_split(MPI_COMM_WORLD, color derived from the key, key = rank).
//   LIMITATION: every process of MPI_COMM_WORLD must therefore create its
//   multi-rank NCCL communicators together and in the same order (true for
//   resnet_ddp: one communicator over the world at a time). A 1-rank communicator
//   never touches MPI, so it also works without MPI initialised.
// - Every operation is queued on its stream (rd::emu::enqueue_async): start() posts
//   one non-blocking MPI operation on the communicator's own MPI communicator,
//   done() polls MPI_Test. Nothing here blocks the calling thread in MPI except the
//   init's MPI_Comm_split.
// - MPI works on staging buffers owned by the operation: the input is copied when
//   the operation starts in stream order, the output written back when it
//   completes. In-place and out-of-place calls are thus alike, and an operation
//   abandoned by ncclCommAbort can never write into user memory afterwards.
// - ncclGroupStart/End: operations issued together at the outermost ncclGroupEnd,
//   so send/recv pairs in a group do not deadlock. A group spanning several streams
//   starts when all of them reached it and holds all of them until it completes
//   (NCCL's documented "mixing multiple streams within the same group").
// - Communicators are handles (register/retire/require_handle): a call on a
//   destroyed or aborted communicator is a FAULT (NCCL frees it in both cases).
// Uncertain readings are marked "UNCERTAIN".
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only, as include/resnet_ddp/dist/comm.h
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_emu/emu.h"

// The type behind ncclComm_t (opaque in nccl.h). The object itself is never freed,
// so its address is never reused and a stale handle is always recognised.
struct ncclComm;

namespace {

constexpr const char* kHandleKind = "ncclComm_t";
constexpr uint64_t kIdMagic = 0x4c43434e554d4552ull;  // "REMUNCCL"
// Non-blocking calls report ncclInProgress for this many ncclCommGetAsyncError polls
// (the documentation promises only "for a while"; callers must poll).
constexpr int kInitInProgressPolls = 3;
constexpr int kOpInProgressPolls = 1;

struct IdPayload {
  uint64_t magic;
  uint64_t key;
};
static_assert(sizeof(IdPayload) <= sizeof(ncclUniqueId));

std::string g_last_error;  // ncclGetLastError; guarded by api_lock

ncclResult_t fail(ncclResult_t r, const std::string& what) {
  g_last_error = what;
  return r;
}

bool mpi_usable() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<size_t>(len));
}

struct CommState {
  int nranks = 1, rank = 0, device = 0;
  bool blocking = true;
  MPI_Comm mpi = MPI_COMM_NULL;  // null for a 1-rank communicator
  bool aborted = false, destroyed = false;
  int init_polls = 0, op_polls = 0;  // ncclInProgress countdowns (non-blocking only)
  ncclResult_t async_error = ncclSuccess;
  int outstanding = 0;  // operations created and not completed: MPI comm freed at 0
  bool noted_abort = false;
  uint64_t posted_ops = 0;  // for RD_EMU_NCCL_TRACE
  std::deque<std::vector<char>> self_messages;  // send-to-self on a 1-rank communicator

  void release_mpi() {
    if (mpi != MPI_COMM_NULL && (destroyed || aborted) && outstanding == 0) {
      if (mpi_usable()) MPI_Comm_free(&mpi);
      mpi = MPI_COMM_NULL;
    }
  }
};

}  // namespace

struct ncclComm {
  std::shared_ptr<CommState> state;  // reset by destroy/abort
};

namespace {

// ---- element types --------------------------------------------------------------------
size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;  // fp8 and anything else: not emulated
  }
}

const char* type_name(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return "ncclInt8";
    case ncclUint8: return "ncclUint8";
    case ncclInt32: return "ncclInt32";
    case ncclUint32: return "ncclUint32";
    case ncclInt64: return "ncclInt64";
    case ncclUint64: return "ncclUint64";
    case ncclFloat16: return "ncclFloat16";
    case ncclFloat32: return "ncclFloat32";
    case ncclFloat64: return "ncclFloat64";
    case ncclBfloat16: return "ncclBfloat16";
    default: return "an unsupported ncclDataType_t";
  }
}

// Half and bf16 travel as 16-bit words; their arithmetic goes through float and
// rounds back with the toolkit's own conversions (as NCCL's __hadd etc. do).
template <class T> float to_float(T v) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else return __bfloat162float(v);
}
template <class T> T from_float(float f) {
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(f);
  else return __float2bfloat16_rn(f);
}

template <class F> void with_type(ncclDataType_t t, F&& f) {
  switch (t) {
    case ncclInt8: f(int8_t{}); break;
    case ncclUint8: f(uint8_t{}); break;
    case ncclInt32: f(int32_t{}); break;
    case ncclUint32: f(uint32_t{}); break;
    case ncclInt64: f(int64_t{}); break;
    case ncclUint64: f(uint64_t{}); break;
    case ncclFloat16: f(__half{}); break;
    case ncclBfloat16: f(__nv_bfloat16{}); break;
    case ncclFloat32: f(float{}); break;
    case ncclFloat64: f(double{}); break;
    default: break;
  }
}

template <class T> constexpr bool is_half_v = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// MPI user operations for the 16-bit float types (MPI has none).
template <class T, ncclRedOp_t Op> void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = to_float(a[i]), y = to_float(b[i]);
    float r = 0;
    if constexpr (Op == ncclProd) r = x * y;
    else if constexpr (Op == ncclMax) r = x > y ? x : y;
    else if constexpr (Op == ncclMin) r = x < y ? x : y;
    else r = x + y;
    b[i] = from_float<T>(r);
  }
}

template <class T> MPI_Op half_mpi_op(ncclRedOp_t op) {
  static MPI_Op ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  const int i = op == ncclProd ? 1 : op == ncclMax ? 2 : op == ncclMin ? 3 : 0;
  if (ops[i] == MPI_OP_NULL) {
    MPI_User_function* fn = i == 1 ? half_op<T, ncclProd> : i == 2 ? half_op<T, ncclMax>
                                                          : i == 3 ? half_op<T, ncclMin> : half_op<T, ncclSum>;
    MPI_Op_create(fn, 1, &ops[i]);
  }
  return ops[i];
}

MPI_Datatype mpi_type(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclUint64: return MPI_UINT64_T;
    case ncclFloat16: case ncclBfloat16: return MPI_UINT16_T;  // reduced by half_op only
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpi_op(ncclDataType_t t, ncclRedOp_t op) {
  if (t == ncclFloat16) return half_mpi_op<__half>(op);
  if (t == ncclBfloat16) return half_mpi_op<__nv_bfloat16>(op);
  switch (op) {
    case ncclProd: return MPI_PROD;
    case ncclMax: return MPI_MAX;
    case ncclMin: return MPI_MIN;
    default: return MPI_SUM;  // ncclSum, and ncclAvg's sum
  }
}

bool is_integer(ncclDataType_t t) {
  return t == ncclInt8 || t == ncclUint8 || t == ncclInt32 || t == ncclUint32 || t == ncclInt64 || t == ncclUint64;
}

// ncclAvg, as we read NCCL: floating types are scaled by 1/nranks (rounded to the
// element type) before a sum; integer types are summed in the type (wrapping) and
// the sum divided by nranks with C division, i.e. truncated toward zero.
// UNCERTAIN: the documentation only says "average"; the pre-scaling and the
// truncation are our reading (some NCCL kernels divide floating sums after the
// sum instead). For 1, 2 and 4 ranks and exactly representable values both
// readings of the floating case give identical, exact results.
void avg_prescale(ncclDataType_t t, char* p, size_t count, int nranks) {
  with_type(t, [&](auto tag) {
    using T = decltype(tag);
    T* v = reinterpret_cast<T*>(p);
    if constexpr (is_half_v<T>) {
      const float s = to_float(from_float<T>(1.0f / static_cast<float>(nranks)));
      for (size_t i = 0; i < count; ++i) v[i] = from_float<T>(to_float(v[i]) * s);
    } else if constexpr (std::is_floating_point_v<T>) {
      const T s = static_cast<T>(1.0 / nranks);
      for (size_t i = 0; i < count; ++i) v[i] *= s;
    }
  });
}
void avg_postdivide(ncclDataType_t t, char* p, size_t count, int nranks) {
  with_type(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      T* v = reinterpret_cast<T*>(p);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<T>(v[i] / static_cast<T>(nranks));
    }
  });
}

// RD_EMU_NCCL_TRACE=1: one line per completed operation (rank, sequence number,
// call, hashes of its input and output) to find where ranks part ways.
bool trace() {
  static const bool on = [] {
    const char* e = std::getenv("RD_EMU_NCCL_TRACE");
    return e && *e && std::strcmp(e, "0") != 0;
  }();
  return on;
}
uint64_t fnv(const std::vector<char>& v) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : v) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

// ---- operations ------------------------------------------------------------------------
enum class Kind { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, Send, Recv };

struct Op {
  Kind kind;
  const char* call;  // "ncclAllReduce", for messages
  std::shared_ptr<CommState> comm;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;  // elements: per rank for AllGather/ReduceScatter
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int root = 0;  // root, or peer for Send/Recv
  std::vector<char> in, out;
  MPI_Request req = MPI_REQUEST_NULL;
  bool posted = false, complete = false, failed = false;
  uint64_t seq = 0, in_hash = 0;  // RD_EMU_NCCL_TRACE
  // Issued into a stream capture (it runs from a CUDA graph). NCCL requires a collective to
  // be captured on every rank of the communicator or on none ("Using NCCL with CUDA
  // Graphs"): each collective also all-reduces {captured, eager} with MAX, and a result of
  // {1, 1} is a FAULT naming it.
  bool captured = false;
  int capture_flags[2] = {0, 0};
  MPI_Request capture_req = MPI_REQUEST_NULL;

  bool collective() const { return kind != Kind::Send && kind != Kind::Recv; }

  size_t elem() const { return type_size(type); }
  size_t send_bytes() const {
    const size_t n = kind == Kind::ReduceScatter ? count * static_cast<size_t>(comm->nranks) : count;
    return n * elem();
  }
  size_t recv_bytes() const {
    const size_t n = kind == Kind::AllGather ? count * static_cast<size_t>(comm->nranks) : count;
    return n * elem();
  }
  bool reads_send() const {
    if (kind == Kind::Recv) return false;
    if (kind == Kind::Broadcast) return comm->rank == root;
    return true;
  }
  bool writes_recv() const {
    if (kind == Kind::Send) return false;
    if (kind == Kind::Reduce) return comm->rank == root;
    return true;
  }

  // NCCL does not touch the buffers of an empty operation: neither do we.
  void check_buffers() const {
    if (reads_send() && send_bytes()) rd::emu::require_device(sendbuff, send_bytes(), call, "sendbuff");
    if (writes_recv() && recv_bytes()) rd::emu::require_device(recvbuff, recv_bytes(), call, "recvbuff");
  }

  // Stream order: stage the input, post the MPI operation (or do a 1-rank one now).
  void post() {
    posted = true;
    seq = ++comm->posted_ops;
    check_buffers();  // again: a buffer freed since the call is a use after free
    const int n = comm->nranks, me = comm->rank;
    const size_t eb = elem();
    if (reads_send()) {
      if (kind == Kind::AllGather) {
        in.assign(recv_bytes(), 0);
        std::memcpy(in.data() + static_cast<size_t>(me) * count * eb, sendbuff, count * eb);
      } else {
        in.resize(send_bytes());
        if (!in.empty()) std::memcpy(in.data(), sendbuff, in.size());
      }
    } else if (kind == Kind::Broadcast || kind == Kind::Recv) {
      in.resize(count * eb);
    }
    if (trace()) in_hash = fnv(in);
    const bool reduction = kind == Kind::AllReduce || kind == Kind::Reduce || kind == Kind::ReduceScatter;
    if (reduction && op == ncclAvg) avg_prescale(type, in.data(), in.size() / eb, n);

    if (comm->mpi == MPI_COMM_NULL) {  // 1 rank: everything is local
      if (kind == Kind::Send) {
        comm->self_messages.push_back(std::move(in));
        complete = true;
      } else if (kind == Kind::Recv) {
        // completes in test() once a send to self was posted
      } else {
        out = std::move(in);
        complete = true;
      }
      return;
    }
    const MPI_Datatype dt = mpi_type(type);
    const int c = static_cast<int>(count);
    int rc = MPI_SUCCESS;
    switch (kind) {
      case Kind::AllReduce:
        rc = MPI_Iallreduce(MPI_IN_PLACE, in.data(), c, dt, mpi_op(type, op), comm->mpi, &req);
        break;
      case Kind::Reduce:
        rc = me == root ? MPI_Ireduce(MPI_IN_PLACE, in.data(), c, dt, mpi_op(type, op), root, comm->mpi, &req)
                        : MPI_Ireduce(in.data(), nullptr, c, dt, mpi_op(type, op), root, comm->mpi, &req);
        break;
      case Kind::Broadcast:
        rc = MPI_Ibcast(in.data(), c, dt, root, comm->mpi, &req);
        break;
      case Kind::AllGather:
        rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, in.data(), c, dt, comm->mpi, &req);
        break;
      case Kind::ReduceScatter:
        out.resize(count * eb);
        rc = MPI_Ireduce_scatter_block(in.data(), out.data(), c, dt, mpi_op(type, op), comm->mpi, &req);
        break;
      case Kind::Send:
        rc = MPI_Isend(in.data(), c, dt, root, 0, comm->mpi, &req);
        break;
      case Kind::Recv:
        rc = MPI_Irecv(in.data(), c, dt, root, 0, comm->mpi, &req);
        break;
    }
    if (rc == MPI_SUCCESS && collective()) {
      capture_flags[0] = captured ? 1 : 0;
      capture_flags[1] = captured ? 0 : 1;
      rc = MPI_Iallreduce(MPI_IN_PLACE, capture_flags, 2, MPI_INT, MPI_MAX, comm->mpi, &capture_req);
    }
    if (rc != MPI_SUCCESS) mpi_failed(rc, "posting");
  }

  // The capture check's request: true once it completed (a mixed answer is a FAULT).
  bool capture_check_done() {
    if (capture_req == MPI_REQUEST_NULL) return true;
    int flag = 0;
    if (MPI_Test(&capture_req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return true;  // the data's test reports it
    if (!flag) return false;
    if (capture_flags[0] && capture_flags[1])
      rd::emu::fault(std::string(call) + " (op #" + std::to_string(seq) + " of rank " + std::to_string(comm->rank) +
                     "): some ranks run it from a CUDA graph and others eagerly; NCCL requires every rank of the "
                     "communicator to capture a collective, or none");
    return true;
  }

  void mpi_failed(int rc, const char* when) {
    failed = complete = true;
    comm->async_error = ncclSystemError;
    g_last_error = std::string(call) + ": MPI failed while " + when + ": " + mpi_error_text(rc);
    rd::emu::note(g_last_error);
  }

  // True once complete (or failed). Never blocks.
  bool test() {
    if (complete) return true;
    if (comm->mpi == MPI_COMM_NULL) {  // 1-rank Recv waiting for a send to self
      if (comm->self_messages.empty()) return false;
      std::vector<char> m = std::move(comm->self_messages.front());
      comm->self_messages.pop_front();
      if (m.size() != in.size()) {
        rd::emu::fault(std::string(call) + ": a send to self of " + std::to_string(m.size()) +
                       " B matched a receive of " + std::to_string(in.size()) + " B");
      }
      out = std::move(m);
      return complete = true;
    }
    if (!mpi_usable()) {
      failed = complete = true;
      rd::emu::note(std::string(call) + ": MPI was finalised with the operation pending; it completes as failed");
      return true;
    }
    if (!capture_check_done()) return false;
    int flag = 0;
    MPI_Status st;
    const int rc = MPI_Test(&req, &flag, &st);
    int error_class = MPI_SUCCESS;
    if (rc != MPI_SUCCESS) MPI_Error_class(rc, &error_class);
    if (kind == Kind::Recv && error_class == MPI_ERR_TRUNCATE)
      rd::emu::fault(std::string(call) + ": the message from rank " + std::to_string(root) + " is longer than the " +
                     std::to_string(count) + " elements expected (ncclSend and ncclRecv counts differ)");
    if (rc != MPI_SUCCESS) {
      mpi_failed(rc, "completing");
      return true;
    }
    if (!flag) return false;
    if (kind == Kind::Recv) {
      int got = 0;
      MPI_Get_count(&st, mpi_type(type), &got);
      if (static_cast<size_t>(got) != count) {
        // NCCL requires matching counts; a shorter message would leave garbage.
        rd::emu::fault(std::string(call) + ": received " + std::to_string(got) + " elements from rank " +
                       std::to_string(root) + " but expected " + std::to_string(count) +
                       " (ncclSend and ncclRecv counts differ)");
      }
    }
    if (kind != Kind::ReduceScatter) out = std::move(in);
    return complete = true;
  }

  // Write the result back to the user's buffer.
  void finish() {
    if (failed || !writes_recv() || out.empty()) return;
    if (op == ncclAvg && (kind == Kind::AllReduce || kind == Kind::Reduce || kind == Kind::ReduceScatter) &&
        is_integer(type))
      avg_postdivide(type, out.data(), out.size() / elem(), comm->nranks);
    if (trace()) {
      char line[256];
      std::snprintf(line, sizeof line, "nccl trace: rank %d op #%llu %s count %zu %s root/peer %d in %016llx out %016llx",
                    comm->rank, static_cast<unsigned long long>(seq), call, count, type_name(type), root,
                    static_cast<unsigned long long>(in_hash), static_cast<unsigned long long>(fnv(out)));
      rd::emu::note(line);
    }
    rd::emu::require_device(recvbuff, out.size(), call, "recvbuff");
    std::memcpy(recvbuff, out.data(), out.size());
  }
};

// Operations abandoned by ncclCommAbort with an MPI request still pending: MPI may
// still write into their staging buffers, so they live until the process ends.
std::vector<std::shared_ptr<Op>>& abandoned() {
  static auto* v = new std::vector<std::shared_ptr<Op>>;
  return *v;
}

// One ncclGroupEnd (or one ungrouped call): posted when every stream involved has
// reached it, complete when every operation is.
struct Batch {
  std::vector<std::shared_ptr<Op>> ops;
  int streams = 0, arrived = 0;
  bool posted = false, finished = false;

  void settle_op(Op& op) {
    op.comm->outstanding--;
    op.comm->release_mpi();
  }

  // A CUDA graph that captured this batch runs it again at each launch: a finished
  // batch starts over with fresh staging (launches of one graph never overlap).
  void rearm() {
    for (auto& op : ops) {
      if (op->comm->destroyed && !op->comm->aborted)
        rd::emu::fault(std::string(op->call) + ": a CUDA graph ran it after ncclCommDestroy of its communicator");
      op->in.clear();
      op->out.clear();
      op->req = op->capture_req = MPI_REQUEST_NULL;
      op->posted = op->complete = op->failed = false;
      op->comm->outstanding++;
    }
    arrived = 0;
    posted = finished = false;
  }

  void arrive() {
    // (An abort can finish a batch before all its streams arrived: those stay finished.)
    if (finished && arrived == streams) rearm();
    if (finished || ++arrived < streams) return;
    posted = true;
    for (auto& op : ops) {
      if (op->comm->aborted) {
        note_aborted(*op);
        op->failed = op->complete = true;
        continue;
      }
      op->post();
    }
  }

  static void note_aborted(Op& op) {
    if (op.comm->noted_abort) return;
    op.comm->noted_abort = true;
    rd::emu::note(std::string(op.call) + " on a communicator aborted by ncclCommAbort: completes without "
                                         "communicating (its output buffer is left as it was)");
  }

  bool poll() {
    if (finished) return true;
    bool all = true;
    for (auto& op : ops) {
      if (op->complete) continue;
      if (op->comm->aborted) {  // never hang on an aborted communicator
        note_aborted(*op);
        if (op->posted && (op->req != MPI_REQUEST_NULL || op->capture_req != MPI_REQUEST_NULL))
          abandoned().push_back(op);
        op->failed = op->complete = true;
        continue;
      }
      if (!posted) {
        all = false;
        continue;
      }
      if (!op->test()) all = false;
    }
    if (!all) return false;
    finished = true;
    for (auto& op : ops) {
      op->finish();
      settle_op(*op);
    }
    return true;
  }
};

// ---- group state (per thread, as NCCL's) -------------------------------------------------
struct Pending {
  cudaStream_t stream;
  std::shared_ptr<Op> op;
};
struct GroupState {
  int depth = 0;
  std::vector<Pending> ops;
  ncclResult_t error = ncclSuccess;
};
thread_local GroupState t_group;

void launch(std::vector<Pending> pending) {
  if (pending.empty()) return;
  auto batch = std::make_shared<Batch>();
  std::vector<cudaStream_t> streams;
  for (auto& p : pending) {
    batch->ops.push_back(p.op);
    p.op->comm->outstanding++;
    bool seen = false;
    for (cudaStream_t s : streams) seen = seen || s == p.stream;
    if (!seen) streams.push_back(p.stream);
  }
  batch->streams = static_cast<int>(streams.size());
  std::string what = pending.size() == 1 ? std::string(pending[0].op->call)
                                         : "NCCL group of " + std::to_string(pending.size()) + " operations";
  for (cudaStream_t s : streams) {
    rd::emu::enqueue_async(
        s, what,
        [batch] {
          std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
          batch->arrive();
        },
        [batch] {
          std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
          return batch->poll();
        });
  }
}

// Validates the communicator handle (faults when destroyed/aborted) and its state.
ncclResult_t usable(ncclComm_t comm, const char* call, CommState** out) {
  if (!comm) return fail(ncclInvalidArgument, std::string(call) + ": comm is NULL");
  rd::emu::require_handle(comm, kHandleKind, call);
  CommState* s = comm->state.get();
  if (!s) rd::emu::fault(std::string(call) + ": communicator is no longer live");
  // NCCL's documentation: after ncclInProgress, poll ncclCommGetAsyncError until
  // ncclSuccess before the next call on the communicator. UNCERTAIN: what NCCL
  // returns when that is not done; we say ncclInvalidUsage.
  if (s->init_polls > 0 || s->op_polls > 0)
    return fail(ncclInvalidUsage, std::string(call) + ": the previous non-blocking call on this communicator is "
                                                      "still in progress (poll ncclCommGetAsyncError until ncclSuccess first)");
  if (s->async_error != ncclSuccess)
    return fail(s->async_error, std::string(call) + ": the communicator has an asynchronous error (" + g_last_error +
                                    "); abort it");
  *out = s;
  return ncclSuccess;
}

bool overlap(const void* a, size_t an, const void* b, size_t bn) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
}

// Common checks and queuing of one operation.
ncclResult_t submit(std::shared_ptr<Op> op, ncclComm_t comm, cudaStream_t stream) {
  CommState* s = nullptr;
  if (ncclResult_t r = usable(comm, op->call, &s); r != ncclSuccess) {
    if (t_group.depth > 0 && t_group.error == ncclSuccess) t_group.error = r;
    return r;
  }
  op->comm = comm->state;
  auto bad = [&](const std::string& why) {
    const ncclResult_t r = fail(ncclInvalidArgument, std::string(op->call) + ": " + why);
    if (t_group.depth > 0 && t_group.error == ncclSuccess) t_group.error = r;
    return r;
  };
  if (type_size(op->type) == 0)
    return bad("datatype " + std::to_string(static_cast<int>(op->type)) + " is " + type_name(op->type) +
               " (the emulator supports the integer types, fp16, bf16, fp32 and fp64)");
  const bool reduction = op->kind == Kind::AllReduce || op->kind == Kind::Reduce || op->kind == Kind::ReduceScatter;
  if (reduction && (static_cast<int>(op->op) < 0 || op->op >= ncclNumOps))
    return bad("reduction operator " + std::to_string(static_cast<int>(op->op)) +
               " is not one of ncclSum/Prod/Max/Min/Avg (custom operators are not emulated)");
  if ((op->kind == Kind::Broadcast || op->kind == Kind::Reduce) && (op->root < 0 || op->root >= s->nranks))
    return bad("root " + std::to_string(op->root) + " is out of range [0, " + std::to_string(s->nranks) + ")");
  if ((op->kind == Kind::Send || op->kind == Kind::Recv) && (op->root < 0 || op->root >= s->nranks))
    return bad("peer " + std::to_string(op->root) + " is out of range [0, " + std::to_string(s->nranks) + ")");
  const size_t total = op->count * static_cast<size_t>(s->nranks);
  if (op->count > static_cast<size_t>(INT32_MAX) || total / static_cast<size_t>(s->nranks) != op->count ||
      ((op->kind == Kind::AllGather || op->kind == Kind::ReduceScatter) && total > static_cast<size_t>(INT32_MAX)))
    return bad("count " + std::to_string(op->count) + " exceeds the emulator's limit of 2^31-1 elements (MPI counts)");
  rd::emu::require_stream(stream, op->call);
  op->check_buffers();
  // The device memory must be this communicator's device.
  for (const void* p : {static_cast<const void*>(op->reads_send() ? op->sendbuff : nullptr),
                        static_cast<const void*>(op->writes_recv() ? op->recvbuff : nullptr)}) {
    const rd::emu::Allocation* a = p ? rd::emu::find_allocation(p) : nullptr;
    if (a && a->kind == rd::emu::MemKind::Device && a->device != s->device)
      rd::emu::fault(std::string(op->call) + ": buffer " + rd::emu::describe_pointer(p) + " is on device " +
                     std::to_string(a->device) + " but the communicator was created on device " +
                     std::to_string(s->device));
  }
  // NCCL allows exactly its in-place forms; any other overlap is undefined.
  if (op->reads_send() && op->writes_recv()) {
    const size_t eb = op->elem();
    const char* in_place = static_cast<const char*>(op->sendbuff);
    const char* expect = static_cast<const char*>(op->recvbuff);
    if (op->kind == Kind::AllGather) expect += static_cast<size_t>(s->rank) * op->count * eb;
    if (op->kind == Kind::ReduceScatter) in_place += static_cast<size_t>(s->rank) * op->count * eb;
    const bool is_in_place = (op->kind == Kind::ReduceScatter) ? in_place == expect
                                                               : static_cast<const char*>(op->sendbuff) == expect;
    if (!is_in_place && overlap(op->sendbuff, op->send_bytes(), op->recvbuff, op->recv_bytes()))
      rd::emu::fault(std::string(op->call) + ": sendbuff and recvbuff overlap without being NCCL's in-place form");
  }
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (stream) cudaStreamIsCapturing(stream, &capturing);
  op->captured = capturing != cudaStreamCaptureStatusNone;
  if (t_group.depth > 0) {
    t_group.ops.push_back({stream, std::move(op)});
    return ncclSuccess;
  }
  launch({{stream, std::move(op)}});
  if (!s->blocking) {
    s->op_polls = kOpInProgressPolls;
    return ncclInProgress;
  }
  return ncclSuccess;
}

std::shared_ptr<Op> make_op(Kind kind, const char* call, const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t type, ncclRedOp_t op, int root) {
  auto o = std::make_shared<Op>();
  o->kind = kind;
  o->call = call;
  o->sendbuff = sendbuff;
  o->recvbuff = recvbuff;
  o->count = count;
  o->type = type;
  o->op = op;
  o->root = root;
  return o;
}

uint64_t random_key() {
  std::random_device rd;
  uint64_t x = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  x ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  x ^= static_cast<uint64_t>(getpid()) << 17;
  // splitmix64 finaliser: spreads the bits the color is taken from
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Why the processes that joined `mpi` do not form one communicator of `nranks`
// ranks with this id ("" when they do): every member must have the same id and
// nranks, and distinct ranks.
std::string members_disagree(MPI_Comm mpi, uint64_t key, int nranks, int rank) {
  int size = 0, me = -1;
  MPI_Comm_size(mpi, &size);
  MPI_Comm_rank(mpi, &me);
  struct Claim {
    uint64_t key;
    int nranks, rank;
  } mine{key, nranks, rank};
  std::vector<Claim> all(static_cast<size_t>(size));
  const int rc = MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, mpi);
  if (rc != MPI_SUCCESS) return "MPI_Allgather failed: " + mpi_error_text(rc);
  for (int i = 0; i < size; ++i) {
    const Claim& c = all[static_cast<size_t>(i)];
    if (c.key != key || c.nranks != nranks || c.rank != i)
      return "the processes that joined disagree on the unique id, nranks or ranks";
  }
  if (size != nranks)
    return std::to_string(size) + " of " + std::to_string(nranks) +
           " ranks joined (every process of MPI_COMM_WORLD must create the emulated communicators "
           "together and in the same order, with valid arguments)";
  if (me != rank) return "internal error: rank order";
  return "";
}

ncclResult_t init_rank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, const ncclConfig_t* config,
                       const char* call) {
  std::unique_lock<std::recursive_mutex> lk(rd::emu::api_lock());
  if (!comm) return fail(ncclInvalidArgument, std::string(call) + ": comm is NULL");
  *comm = nullptr;
  bool blocking = true;
  std::string invalid;
  if (config) {
    if (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
      invalid = "config was not initialised with NCCL_CONFIG_INITIALIZER";
    else if (config->blocking != NCCL_CONFIG_UNDEF_INT)
      blocking = config->blocking != 0;
  }
  IdPayload payload;
  std::memcpy(&payload, id.internal, sizeof payload);
  if (invalid.empty() && payload.magic != kIdMagic) invalid = "commId did not come from ncclGetUniqueId";
  if (invalid.empty() && nranks < 1) invalid = "nranks " + std::to_string(nranks) + " < 1";
  if (invalid.empty() && (rank < 0 || rank >= nranks))
    invalid = "rank " + std::to_string(rank) + " out of range [0, " + std::to_string(nranks) + ")";
  const bool local = nranks == 1 && rank == 0;

  MPI_Comm mpi = MPI_COMM_NULL;
  if (!local) {
    if (!mpi_usable()) {
      return fail(invalid.empty() ? ncclInvalidUsage : ncclInvalidArgument,
                  std::string(call) + ": " + (invalid.empty() ? "the emulated NCCL needs MPI initialised for "
                                                                "communicators of more than one rank"
                                                              : invalid));
    }
    // A rank with invalid arguments still takes part in the split (without a
    // color), so its peers fail with a wrong size instead of waiting forever.
    const int color = invalid.empty() ? static_cast<int>(payload.key >> 33) : MPI_UNDEFINED;
    lk.unlock();  // the split waits for every process: other threads may need the lock meanwhile
    int rc = MPI_Comm_split(MPI_COMM_WORLD, color, invalid.empty() ? rank : 0, &mpi);
    std::string why;
    if (rc != MPI_SUCCESS) {
      why = "MPI_Comm_split failed: " + mpi_error_text(rc);
    } else if (mpi != MPI_COMM_NULL) {
      why = members_disagree(mpi, payload.key, nranks, rank);
      if (!why.empty()) MPI_Comm_free(&mpi);
    }
    lk.lock();
    if (!invalid.empty()) return fail(ncclInvalidArgument, std::string(call) + ": " + invalid);
    if (!why.empty()) return fail(ncclInvalidUsage, std::string(call) + ": " + why);
    if (mpi != MPI_COMM_NULL) MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
  } else if (!invalid.empty()) {
    return fail(ncclInvalidArgument, std::string(call) + ": " + invalid);
  }
  auto state = std::make_shared<CommState>();
  state->nranks = nranks;
  state->rank = rank;
  state->device = rd::emu::current_device();
  state->blocking = blocking;
  state->mpi = mpi;
  auto* c = new ncclComm{state};  // never deleted: see ncclComm
  rd::emu::register_handle(c, kHandleKind);
  *comm = c;
  if (!blocking) {
    state->init_polls = kInitInProgressPolls;
    return ncclInProgress;
  }
  return ncclSuccess;
}

// Destroy and abort: the handle dies now; operations already queued keep the state.
void end_comm(ncclComm_t comm, const char* call) {
  rd::emu::retire_handle(comm, kHandleKind, call);
  comm->state.reset();
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  std::memset(uniqueId, 0, sizeof *uniqueId);
  const IdPayload p{kIdMagic, random_key()};
  std::memcpy(uniqueId->internal, &p, sizeof p);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
  return init_rank(comm, nranks, commId, rank, config, "ncclCommInitRankConfig");
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return init_rank(comm, nranks, commId, rank, nullptr, "ncclCommInitRank");
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  CommState* s = nullptr;
  return usable(comm, "ncclCommFinalize", &s);  // operations complete in stream order anyway
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  if (!comm) return ncclSuccess;  // NCCL: a NULL communicator is ignored
  rd::emu::require_handle(comm, kHandleKind, "ncclCommDestroy");
  std::shared_ptr<CommState> s = comm->state;
  end_comm(comm, "ncclCommDestroy");
  // UNCERTAIN: NCCL flushes pending operations in ncclCommDestroy; here they simply
  // complete later in stream order (they hold the state and the MPI communicator).
  s->destroyed = true;
  s->release_mpi();
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  if (!comm) return ncclSuccess;
  rd::emu::require_handle(comm, kHandleKind, "ncclCommAbort");
  std::shared_ptr<CommState> s = comm->state;
  end_comm(comm, "ncclCommAbort");
  // Pending and queued operations of this communicator complete as failed at their
  // next poll (Batch::poll); posted MPI requests are abandoned, not waited for.
  s->aborted = true;
  s->release_mpi();
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  if (!comm || !asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
  rd::emu::require_handle(comm, kHandleKind, "ncclCommGetAsyncError");
  CommState* s = comm->state.get();
  if (s->init_polls > 0) {
    --s->init_polls;
    *asyncError = ncclInProgress;
  } else if (s->op_polls > 0) {
    --s->op_polls;
    *asyncError = ncclInProgress;
  } else {
    *asyncError = s->async_error;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  CommState* s = nullptr;
  if (ncclResult_t r = usable(comm, "ncclCommCount", &s); r != ncclSuccess) return r;
  if (!count) return fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
  *count = s->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  CommState* s = nullptr;
  if (ncclResult_t r = usable(comm, "ncclCommCuDevice", &s); r != ncclSuccess) return r;
  if (!device) return fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
  *device = s->device;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  CommState* s = nullptr;
  if (ncclResult_t r = usable(comm, "ncclCommUserRank", &s); r != ncclSuccess) return r;
  if (!rank) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
  *rank = s->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error (emulated NCCL: an MPI call failed)";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) {
  // NCCL documents the argument as unused: the last error of the process.
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  return g_last_error.c_str();
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::NcclAllReduce);
  return submit(make_op(Kind::AllReduce, "ncclAllReduce", sendbuff, recvbuff, count, datatype, op, 0), comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::NcclReduce);
  return submit(make_op(Kind::Reduce, "ncclReduce", sendbuff, recvbuff, count, datatype, op, root), comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::NcclBroadcast);
  return submit(make_op(Kind::Broadcast, "ncclBroadcast", sendbuff, recvbuff, count, datatype, ncclSum, root), comm,
                stream);
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::NcclBroadcast);
  return submit(make_op(Kind::Broadcast, "ncclBcast", buff, buff, count, datatype, ncclSum, root), comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::NcclAllGather);
  return submit(make_op(Kind::AllGather, "ncclAllGather", sendbuff, recvbuff, sendcount, datatype, ncclSum, 0), comm,
                stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::NcclReduceScatter);
  return submit(make_op(Kind::ReduceScatter, "ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, op, 0),
                comm, stream);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::NcclSend);
  return submit(make_op(Kind::Send, "ncclSend", sendbuff, nullptr, count, datatype, ncclSum, peer), comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  rd::emu::count(rd::emu::Counter::NcclRecv);
  return submit(make_op(Kind::Recv, "ncclRecv", nullptr, recvbuff, count, datatype, ncclSum, peer), comm, stream);
}

ncclResult_t ncclGroupStart() {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  if (t_group.depth == 0) t_group.error = ncclSuccess;
  ++t_group.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  std::lock_guard<std::recursive_mutex> lk(rd::emu::api_lock());
  if (t_group.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: no matching ncclGroupStart");
  if (--t_group.depth > 0) return ncclSuccess;
  std::vector<Pending> ops = std::move(t_group.ops);
  t_group.ops.clear();
  if (t_group.error != ncclSuccess) {
    // A call in the group failed: nothing of the group is issued (its error was
    // returned by that call and is returned again here).
    const ncclResult_t r = t_group.error;
    t_group.error = ncclSuccess;
    return r;
  }
  // A communicator destroyed or aborted between its call and ncclGroupEnd.
  for (auto& p : ops)
    if (p.op->comm->destroyed || p.op->comm->aborted)
      rd::emu::fault(std::string("ncclGroupEnd: ") + p.op->call + " in this group uses a communicator destroyed or "
                                                                  "aborted before ncclGroupEnd");
  bool nonblocking = false;
  for (auto& p : ops) {
    if (!p.op->comm->blocking) {
      nonblocking = true;
      p.op->comm->op_polls = kOpInProgressPolls;
    }
  }
  launch(std::move(ops));
  return nonblocking ? ncclInProgress : ncclSuccess;
}

}  // extern "C"
