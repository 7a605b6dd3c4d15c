// NcclComm: rd::dist::Comm over device memory with NCCL (make_nccl_comm,
// resnet_ddp/backend/nccl_comm.h). Bootstrap: rank 0's ncclGetUniqueId goes to every rank
// with MPI_Bcast, then a non-blocking ncclCommInitRankConfig polled against the
// backend's collective deadline and the watchdog's lost_peer(). Collectives run on a
// dedicated comm stream that first waits (event) for the compute stream of the CUDA
// backend it was made for; completion is an event that compute stream waits on, so
// compute, comm and the optimizer stay ordered without device-wide synchronisation.
// Any wait that passes the deadline or sees an NCCL error aborts the communicator
// (ncclCommAbort) and throws rd::Error naming the operation.
#include "resnet_ddp/backend/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "resnet_ddp/errors.h"

namespace rd::cuda {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

class NcclComm;

// Note [Bounded host polling]
// A host wait on a collective polls its completion event. The first kQuickPolls polls
// come every kQuickPollSleep, so a short collective (a small all-reduce, a bucket that
// finished with backward) is seen within 20 us; after them each sleep doubles, up to
// kMaxPollSleep. No sleep is longer than the time already waited, so the event is seen
// at most min(time waited, kMaxPollSleep) late, and a wait finds the collective still
// running at most kPollsBeforeCap + S / kMaxPollSleep times, S the host time between
// those polls (on a GPU, where a query returns at once, the wait's length;
// tests/gpu_emu/step_budget.sh holds the trainer's steps to this bound). A fixed 20 us
// poll would keep a host thread busy for the whole of every exposed collective, taking a
// core from the loader workers.
class PollBackoff {
 public:
  static constexpr std::chrono::microseconds kQuickPollSleep{20};
  static constexpr int kQuickPolls = 5;
  static constexpr std::chrono::microseconds kMaxPollSleep{500};
  // Quick polls, the doubling sleeps 40..320 us, and the first capped one.
  static constexpr int kPollsBeforeCap = kQuickPolls + 5;

  void sleep() {
    std::this_thread::sleep_for(next_);
    if (++slept_ >= kQuickPolls) next_ = std::min(next_ * 2, kMaxPollSleep);
  }

 private:
  std::chrono::microseconds next_ = kQuickPollSleep;
  int slept_ = 0;
};

// Note [One rank, no NCCL]
// With one rank every collective is the identity: a sum or average over one rank is
// its own data, a broadcast from rank 0 has nothing to send, an all-gather is a copy.
// So a one-rank job makes no NCCL calls at all (no communicator, no comm stream, no
// host waits on collectives); the copy runs on the compute stream, ordered as NcclComm's
// collectives are.
class DoneRequest final : public dist::Request {
 public:
  void wait() override {}
  bool test() override { return true; }
};

class SingleRankComm final : public dist::Comm {
 public:
  explicit SingleRankComm(CudaBackend& backend) : backend_(backend) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  DeviceKind device() const override { return DeviceKind::CUDA; }
  std::string name() const override { return "nccl"; }
  void allreduce(float*, size_t, dist::ReduceOp) override {}
  void allreduce(double*, size_t, dist::ReduceOp) override {}
  void allreduce(int64_t*, size_t, dist::ReduceOp) override {}
  void allreduce_stream_ordered(double*, size_t, dist::ReduceOp) override {}
  std::unique_ptr<dist::Request> iallreduce(float*, size_t, dist::ReduceOp) override {
    return std::make_unique<DoneRequest>();
  }
  void broadcast(void*, size_t, int root) override { check_peer(root, "broadcast"); }
  void broadcast_stream_ordered(void*, size_t, int root) override { check_peer(root, "broadcast"); }
  void send(const void*, size_t, int peer, int) override { no_peer(peer, "send"); }
  void recv(void*, size_t, int peer, int) override { no_peer(peer, "recv"); }
  void allgather(const void* send, void* recv, size_t bytes_per_rank) override {
    if (!bytes_per_rank || send == recv) return;
    backend_.device_memory_written_elsewhere();
    RD_CUDA(cudaMemcpyAsync(recv, send, bytes_per_rank, cudaMemcpyDeviceToDevice, backend_.compute_stream()));
  }
  void barrier() override {}
  void progress() override {}

 private:
  static void check_peer(int peer, const char* what) {
    RD_CHECK(peer == 0, "NCCL " << what << ": rank " << peer << " out of range (1 rank)");
  }
  [[noreturn]] static void no_peer(int peer, const char* what) {
    RD_FAIL("NCCL " << what << ": rank " << peer << " is not a peer (a one-rank job has none)");
  }
  CudaBackend& backend_;
};

// One asynchronous all-reduce: its completion event on the comm stream.
class NcclRequest final : public dist::Request {
 public:
  NcclRequest(NcclComm& comm, cudaEvent_t done, std::string what)
      : comm_(comm), done_(done), what_(std::move(what)) {}
  ~NcclRequest() override;
  void wait() override;
  bool test() override;
  void wait_on_device() override;

 private:
  NcclComm& comm_;
  cudaEvent_t done_;
  std::string what_;
  bool finished_ = false;
};

class NcclComm final : public dist::Comm {
 public:
  // `compute`: the CUDA backend's stream the collectives are ordered against;
  // `timeout_s`: the deadline of every wait (init, collectives, teardown).
  // Weights written by a broadcast, all-gather, receive or float all-reduce may have
  // staged copies in `backend` (CudaBackend::device_memory_written_elsewhere); the
  // gradient buckets (iallreduce) and the statistics (double) write none.
  NcclComm(MPI_Comm base, CudaBackend& backend, int device, cudaStream_t compute, double timeout_s)
      : backend_(backend), device_(device), timeout_s_(timeout_s), compute_(compute) {
    RD_CUDA(cudaSetDevice(device_));
    int rc = MPI_Comm_rank(base, &rank_);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(base, &size_);
    RD_CHECK(rc == MPI_SUCCESS, "NcclComm: MPI_Comm_rank/size failed (is MPI initialised?)");
    bootstrap(base);
    RD_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    RD_CUDA(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
    int* scratch = nullptr;
    RD_CUDA(cudaMalloc(&scratch, 2 * sizeof(int64_t)));
    scratch_ = scratch;
    // Buckets the device alone waits for (Request::wait_on_device) are waited for by the
    // host at the backend's next read-back: with this communicator's deadline and checks.
    backend_.set_collective_wait([this](cudaEvent_t ev, const std::string& what) { wait_event(ev, what); });
  }

  ~NcclComm() override {
    backend_.set_collective_wait(nullptr);
    // Bounded, see Note [Bounded teardown waits] (cuda_backend.h): abort the
    // communicator instead of destroying it then.
    if (stream_ && !wait_stream_bounded(stream_, timeout_s_)) {
      if (comm_ && !aborted_) ncclCommAbort(comm_);
      return;  // leak the stream, events and scratch: the process is ending
    }
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (compute_ready_) cudaEventDestroy(compute_ready_);
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
    if (comm_ && !aborted_) ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  DeviceKind device() const override { return DeviceKind::CUDA; }
  std::string name() const override { return "nccl"; }

  void allreduce(float* data, size_t count, dist::ReduceOp op) override {
    backend_.device_memory_written_elsewhere();
    run("allreduce(float)", [&] { return ncclAllReduce(data, data, count, ncclFloat32, nccl_op(op), comm_, stream_); });
  }
  void allreduce(double* data, size_t count, dist::ReduceOp op) override {
    run("allreduce(double)", [&] { return ncclAllReduce(data, data, count, ncclFloat64, nccl_op(op), comm_, stream_); });
  }
  void allreduce(int64_t* data, size_t count, dist::ReduceOp op) override {
    run("allreduce(int64)", [&] { return ncclAllReduce(data, data, count, ncclInt64, ncclSum, comm_, stream_); });
    if (op == dist::ReduceOp::Average && count) {
      // Integer average truncates toward zero (C++ division), as MpiComm does.
      // Both copies run on the comm stream (not the legacy stream, which does
      // not order against the non-blocking compute stream); the
      // compute stream then waits for the write-back.
      std::vector<int64_t> h(count);
      const size_t bytes = count * sizeof(int64_t);
      RD_CUDA(cudaMemcpyAsync(h.data(), data, bytes, cudaMemcpyDeviceToHost, stream_));
      RD_CUDA(cudaStreamSynchronize(stream_));
      for (auto& v : h) v /= size_;
      RD_CUDA(cudaMemcpyAsync(data, h.data(), bytes, cudaMemcpyHostToDevice, stream_));
      // A pageable source may still be read after the call returns: wait before `h` goes.
      RD_CUDA(cudaStreamSynchronize(stream_));
      cudaEvent_t done = take_event();
      RD_CUDA(cudaEventRecord(done, stream_));
      order_compute_after(done);
      give_back(done);
    }
  }
  void allreduce_stream_ordered(double* data, size_t count, dist::ReduceOp op) override {
    // Note [SyncBN without a host wait]
    // SyncBatchNorm all-reduces once per BN layer, forward and backward: a host
    // wait each time would stall the queue of kernels dozens of times a step, so
    // the sum is ordered on the compute stream by events instead. A failure or
    // hang surfaces at the next waited collective (gradient buckets, deadline)
    // or through the watchdog.
    after_compute();
    enqueue("allreduce(double, stream-ordered)",
            [&] { return ncclAllReduce(data, data, count, ncclFloat64, nccl_op(op), comm_, stream_); });
    cudaEvent_t done = take_event();
    RD_CUDA(cudaEventRecord(done, stream_));
    order_compute_after(done);  // the wait is captured now: the event may be reused
    give_back(done);
  }
  std::unique_ptr<dist::Request> iallreduce(float* data, size_t count, dist::ReduceOp op) override {
    after_compute();
    enqueue("iallreduce", [&] { return ncclAllReduce(data, data, count, ncclFloat32, nccl_op(op), comm_, stream_); });
    cudaEvent_t done = take_event();
    RD_CUDA(cudaEventRecord(done, stream_));
    return std::make_unique<NcclRequest>(*this, done, "iallreduce of " + std::to_string(count) + " floats");
  }
  void broadcast(void* data, size_t bytes, int root) override {
    check_peer(root, "broadcast");
    backend_.device_memory_written_elsewhere();
    run("broadcast", [&] { return ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_); });
  }
  void broadcast_stream_ordered(void* data, size_t bytes, int root) override {
    // DDP's per-step buffer broadcast (no SyncBatchNorm): ordered on events like the
    // SyncBN sums (Note [SyncBN without a host wait]), so the step does not stall.
    check_peer(root, "broadcast");
    backend_.device_memory_written_elsewhere();
    after_compute();
    enqueue("broadcast (stream-ordered)",
            [&] { return ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_); });
    cudaEvent_t done = take_event();
    RD_CUDA(cudaEventRecord(done, stream_));
    order_compute_after(done);
    give_back(done);
  }

  void send(const void* data, size_t bytes, int peer, int) override {
    check_peer(peer, "send");
    run("send", [&] { return ncclSend(data, bytes, ncclUint8, peer, comm_, stream_); });
  }
  void recv(void* data, size_t bytes, int peer, int) override {
    check_peer(peer, "recv");
    backend_.device_memory_written_elsewhere();
    run("recv", [&] { return ncclRecv(data, bytes, ncclUint8, peer, comm_, stream_); });
  }
  void allgather(const void* send, void* recv, size_t bytes_per_rank) override {
    backend_.device_memory_written_elsewhere();
    run("allgather", [&] { return ncclAllGather(send, recv, bytes_per_rank, ncclUint8, comm_, stream_); });
  }
  void barrier() override {
    // NCCL has no barrier: a one-element all-reduce completes only when every rank joined.
    run("barrier", [&] { return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_); });
  }
  void progress() override {}  // NCCL progresses on the GPU by itself

  // Host wait for `ev` with the collective deadline, NCCL error and lost-peer checks,
  // polling as Note [Bounded host polling] says.
  void wait_event(cudaEvent_t ev, const std::string& what) {
    const Clock::time_point deadline = deadline_after(timeout_s_);
    PollBackoff backoff;
    for (;;) {
      const cudaError_t e = cudaEventQuery(ev);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) fail_cuda(e, ("cudaEventQuery (" + what + ")").c_str(), __FILE__, __LINE__);
      poll_health(what, deadline);
      backoff.sleep();
    }
  }
  bool query_event(cudaEvent_t ev, const std::string& what) {
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) fail_cuda(e, ("cudaEventQuery (" + what + ")").c_str(), __FILE__, __LINE__);
    poll_health(what, Clock::time_point::max());
    return false;
  }
  // The compute stream continues only after the collective (no host wait).
  void order_compute_after(cudaEvent_t ev) {
    RD_CUDA(cudaStreamWaitEvent(compute_, ev, 0));
  }
  void give_back(cudaEvent_t ev) { free_events_.push_back(ev); }

 private:
  // Rank 0's unique id to all, then every rank's init; the ranks agree on success
  // over MPI before going on, so a failure on one rank ends all of them at once
  // instead of leaving the others in MPI_Bcast or polling init until the
  // deadline. Runs on a duplicate of `base`: its messages match nobody else's.
  void bootstrap(MPI_Comm base) {
    MPI_Comm boot = MPI_COMM_NULL;
    RD_CHECK(MPI_Comm_dup(base, &boot) == MPI_SUCCESS, "NcclComm: MPI_Comm_dup failed");
    struct {
      int ok;
      ncclUniqueId id;
    } root{};
    std::string root_error;
    if (rank_ == 0) {
      const ncclResult_t r = ncclGetUniqueId(&root.id);
      root.ok = r == ncclSuccess;
      if (!root.ok) root_error = std::string(ncclGetErrorString(r)) + " " + ncclGetLastError(nullptr);
    }
    const bool sent = MPI_Bcast(&root, sizeof root, MPI_BYTE, 0, boot) == MPI_SUCCESS;
    if (!sent || !root.ok) {
      MPI_Comm_free(&boot);
      RD_FAIL("NcclComm: " << (!sent ? "MPI_Bcast of the NCCL unique id failed"
                                     : "ncclGetUniqueId failed on rank 0" +
                                           (root_error.empty() ? std::string() : ": " + root_error)));
    }
    std::string failure;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // init and collectives return at once; we poll with a deadline
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, root.id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) failure = std::string("ncclCommInitRankConfig: ") + ncclGetErrorString(r);
    if (failure.empty()) failure = settle_init(boot);
    if (!failure.empty()) {
      // Wake the ranks still waiting for this one's part of the init.
      const int code = 1;
      for (int peer = 0; peer < size_; ++peer)
        if (peer != rank_) MPI_Send(&code, 1, MPI_INT, peer, kInitFailedTag, boot);
    }
    int ok = failure.empty() ? 1 : 0, all_ok = 0;
    const bool agreed = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, boot) == MPI_SUCCESS;
    // Receive any failure notices still in flight, so none outlives the communicator.
    for (int pending = 1; pending;) {
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kInitFailedTag, boot, &pending, &st);
      if (pending) {
        int code = 0;
        MPI_Recv(&code, 1, MPI_INT, st.MPI_SOURCE, kInitFailedTag, boot, MPI_STATUS_IGNORE);
      }
    }
    MPI_Comm_free(&boot);
    if (agreed && all_ok) return;
    if (comm_ && !aborted_) {
      ncclCommAbort(comm_);
      aborted_ = true;
    }
    RD_FAIL("NcclComm rank " << rank_ << ": NCCL initialisation failed "
                             << (failure.empty() ? std::string("on another rank") : "here: " + failure));
  }

  // settle() for the init, which also leaves when a peer reports its init failed.
  std::string settle_init(MPI_Comm boot) {
    const Clock::time_point deadline = deadline_after(timeout_s_);
    for (;;) {
      ncclResult_t async = ncclInProgress;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
      if (r != ncclSuccess) return std::string("ncclCommGetAsyncError: ") + ncclGetErrorString(r);
      if (async == ncclSuccess) return "";
      if (async != ncclInProgress)
        return std::string("ncclCommInitRankConfig: ") + ncclGetErrorString(async) + " " + ncclGetLastError(comm_);
      int peer_failed = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, kInitFailedTag, boot, &peer_failed, MPI_STATUS_IGNORE);
      if (peer_failed) return "a peer rank's init failed";
      if (dist::lost_peer() >= 0) return "lost contact with rank " + std::to_string(dist::lost_peer());
      if (Clock::now() > deadline)
        return "did not finish within " + std::to_string(timeout_s_) + " s";
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  static constexpr int kInitFailedTag = 0x4e43;

  static ncclRedOp_t nccl_op(dist::ReduceOp op) { return op == dist::ReduceOp::Average ? ncclAvg : ncclSum; }

  void check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return;
    const char* last = comm_ ? ncclGetLastError(comm_) : ncclGetLastError(nullptr);
    throw Error(std::string("NCCL ") + what + " failed on rank " + std::to_string(rank_) + ": " +
                ncclGetErrorString(r) + (last && *last ? std::string(" (") + last + ")" : std::string()));
  }

  void check_peer(int peer, const char* what) {
    RD_CHECK(peer >= 0 && peer < size_, "NcclComm::" << what << ": rank " << peer << " out of range [0, " << size_ << ")");
  }

  void abort_comm(const std::string& why) {
    if (comm_ && !aborted_) {
      ncclCommAbort(comm_);
      aborted_ = true;
    }
    throw Error("NcclComm rank " + std::to_string(rank_) + ": " + why + " (communicator aborted)");
  }

  void poll_health(const std::string& what, Clock::time_point deadline) {
    RD_CHECK(!aborted_, "NcclComm: communicator was aborted earlier; " << what << " cannot run");
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      abort_comm(what + ": NCCL error " + ncclGetErrorString(async) + " " + ncclGetLastError(comm_));
    const int lost = dist::lost_peer();
    if (lost >= 0) abort_comm(what + ": lost contact with rank " + std::to_string(lost));
    if (Clock::now() > deadline)
      abort_comm(what + " timed out after " + std::to_string(timeout_s_) +
                 " s (RD_COLLECTIVE_TIMEOUT_S)");
  }

  // Non-blocking communicator: wait until the last call left the "in progress" state.
  void settle(const std::string& what) {
    const Clock::time_point deadline = deadline_after(timeout_s_);
    for (;;) {
      ncclResult_t async = ncclInProgress;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
      if (r != ncclSuccess) check(r, "ncclCommGetAsyncError");
      if (async == ncclSuccess) return;
      if (async != ncclInProgress) abort_comm(what + ": " + ncclGetErrorString(async) + " " + ncclGetLastError(comm_));
      if (dist::lost_peer() >= 0) abort_comm(what + ": lost contact with rank " + std::to_string(dist::lost_peer()));
      if (Clock::now() > deadline)
        abort_comm(what + " did not finish within " + std::to_string(timeout_s_) + " s");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void after_compute() {
    RD_CHECK(!aborted_, "NcclComm: communicator was aborted earlier");
    RD_CUDA(cudaSetDevice(device_));
    RD_CUDA(cudaEventRecord(compute_ready_, compute_));
    RD_CUDA(cudaStreamWaitEvent(stream_, compute_ready_, 0));
  }

  template <class F> void enqueue(const std::string& what, F&& call) {
    const ncclResult_t r = call();
    if (r != ncclSuccess && r != ncclInProgress) check(r, what.c_str());
    settle(what);
  }

  // Blocking collective: ordered after compute, waited for on the host with the deadline.
  template <class F> void run(const std::string& what, F&& call) {
    after_compute();
    enqueue(what, call);
    cudaEvent_t done = take_event();
    RD_CUDA(cudaEventRecord(done, stream_));
    try {
      wait_event(done, what);
    } catch (...) {
      give_back(done);
      throw;
    }
    order_compute_after(done);
    give_back(done);
  }

  cudaEvent_t take_event() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    RD_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  CudaBackend& backend_;
  int device_ = 0, rank_ = 0, size_ = 1;
  double timeout_s_;
  cudaStream_t compute_;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;
  void* scratch_ = nullptr;
  std::vector<cudaEvent_t> free_events_;
};

NcclRequest::~NcclRequest() {
  try {
    if (!finished_) wait();
  } catch (...) {
    // A destructor must not throw; the failure was (or will be) reported by the next call.
  }
  comm_.give_back(done_);
}

void NcclRequest::wait() {
  if (finished_) return;
  comm_.wait_event(done_, what_);
  comm_.order_compute_after(done_);
  finished_ = true;
}

void NcclRequest::wait_on_device() {
  if (finished_) return;
  comm_.order_compute_after(done_);  // the wait is captured now: the event may be reused
  finished_ = true;
}

bool NcclRequest::test() {
  if (finished_) return true;
  if (!comm_.query_event(done_, what_)) return false;
  comm_.order_compute_after(done_);
  finished_ = true;
  return true;
}

}  // namespace

}  // namespace rd::cuda

namespace rd {

std::unique_ptr<dist::Comm> make_nccl_comm(MPI_Comm base, Backend& compute) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(&compute);
  RD_CHECK(cuda, "NCCL communicator: needs the CUDA backend, got " << compute.name());
  int size = 0;
  RD_CHECK(MPI_Comm_size(base, &size) == MPI_SUCCESS, "NCCL communicator: MPI_Comm_size failed (is MPI initialised?)");
  if (size == 1) return std::make_unique<cuda::SingleRankComm>(*cuda);
  return std::make_unique<cuda::NcclComm>(base, *cuda, cuda->device_index(), cuda->compute_stream(),
                                          cuda->collective_timeout_s());
}

}  // namespace rd
