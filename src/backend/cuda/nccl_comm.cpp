#include "backend/cuda/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

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

Clock::time_point deadline_from_now() {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(dist::collective_timeout_s()));
}

class NcclComm;

// One asynchronous all-reduce: its completion event on the comm stream.
class NcclRequest final : public dist::Request {
 public:
  NcclRequest(NcclComm& comm, cudaEvent_t done, std::string what)
      : comm_(comm), done_(done), what_(std::move(what)) {}
  ~NcclRequest() override;
  void wait() override;
  bool test() override;

 private:
  NcclComm& comm_;
  cudaEvent_t done_;
  std::string what_;
  bool finished_ = false;
};

class NcclComm final : public dist::Comm {
 public:
  NcclComm(MPI_Comm base, int device) : device_(device) {
    RD_CUDA(cudaSetDevice(device_));
    int rc = MPI_Comm_rank(base, &rank_);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(base, &size_);
    RD_CHECK(rc == MPI_SUCCESS, "NcclComm: MPI_Comm_rank/size failed (is MPI initialised?)");
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank_ == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    RD_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, base) == MPI_SUCCESS,
             "NcclComm: MPI_Bcast of the NCCL unique id failed");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // init and collectives return at once; we poll with a deadline
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) check(r, "ncclCommInitRankConfig");
    settle("ncclCommInitRankConfig");
    RD_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    RD_CUDA(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
    int* scratch = nullptr;
    RD_CUDA(cudaMalloc(&scratch, 2 * sizeof(int64_t)));
    scratch_ = scratch;
  }

  ~NcclComm() override {
    if (stream_) cudaStreamSynchronize(stream_);
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
    run("allreduce(float)", [&] { return ncclAllReduce(data, data, count, ncclFloat32, nccl_op(op), comm_, stream_); });
  }
  void allreduce(double* data, size_t count, dist::ReduceOp op) override {
    run("allreduce(double)", [&] { return ncclAllReduce(data, data, count, ncclFloat64, nccl_op(op), comm_, stream_); });
  }
  void allreduce(int64_t* data, size_t count, dist::ReduceOp op) override {
    run("allreduce(int64)", [&] { return ncclAllReduce(data, data, count, ncclInt64, ncclSum, comm_, stream_); });
    if (op == dist::ReduceOp::Average && count) {
      // Integer average truncates toward zero (C++ division), as MpiComm does.
      std::vector<int64_t> h(count);
      RD_CUDA(cudaMemcpy(h.data(), data, count * sizeof(int64_t), cudaMemcpyDeviceToHost));
      for (auto& v : h) v /= size_;
      RD_CUDA(cudaMemcpy(data, h.data(), count * sizeof(int64_t), cudaMemcpyHostToDevice));
    }
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
    run("broadcast", [&] { return ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_); });
  }
  void send(const void* data, size_t bytes, int peer, int) override {
    check_peer(peer, "send");
    run("send", [&] { return ncclSend(data, bytes, ncclUint8, peer, comm_, stream_); });
  }
  void recv(void* data, size_t bytes, int peer, int) override {
    check_peer(peer, "recv");
    run("recv", [&] { return ncclRecv(data, bytes, ncclUint8, peer, comm_, stream_); });
  }
  void allgather(const void* send, void* recv, size_t bytes_per_rank) override {
    run("allgather", [&] { return ncclAllGather(send, recv, bytes_per_rank, ncclUint8, comm_, stream_); });
  }
  void barrier() override {
    // NCCL has no barrier: a one-element all-reduce completes only when every rank joined.
    run("barrier", [&] { return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_); });
  }
  void progress() override {}  // NCCL progresses on the GPU by itself

  // Host wait for `ev` with the collective deadline, NCCL error and lost-peer checks.
  void wait_event(cudaEvent_t ev, const std::string& what) {
    const Clock::time_point deadline = deadline_from_now();
    for (;;) {
      const cudaError_t e = cudaEventQuery(ev);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) fail_cuda(e, ("cudaEventQuery (" + what + ")").c_str(), __FILE__, __LINE__);
      poll_health(what, deadline);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
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
    if (cudaStream_t c = registered_compute_stream(device_)) RD_CUDA(cudaStreamWaitEvent(c, ev, 0));
  }
  void give_back(cudaEvent_t ev) { free_events_.push_back(ev); }

 private:
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
      abort_comm(what + " timed out after " + std::to_string(dist::collective_timeout_s()) +
                 " s (RD_COLLECTIVE_TIMEOUT_S)");
  }

  // Non-blocking communicator: wait until the last call left the "in progress" state.
  void settle(const std::string& what) {
    const Clock::time_point deadline = deadline_from_now();
    for (;;) {
      ncclResult_t async = ncclInProgress;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
      if (r != ncclSuccess) check(r, "ncclCommGetAsyncError");
      if (async == ncclSuccess) return;
      if (async != ncclInProgress) abort_comm(what + ": " + ncclGetErrorString(async) + " " + ncclGetLastError(comm_));
      if (dist::lost_peer() >= 0) abort_comm(what + ": lost contact with rank " + std::to_string(dist::lost_peer()));
      if (Clock::now() > deadline)
        abort_comm(what + " did not finish within " + std::to_string(dist::collective_timeout_s()) + " s");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void after_compute() {
    RD_CHECK(!aborted_, "NcclComm: communicator was aborted earlier");
    RD_CUDA(cudaSetDevice(device_));
    if (cudaStream_t c = registered_compute_stream(device_)) {
      RD_CUDA(cudaEventRecord(compute_ready_, c));
      RD_CUDA(cudaStreamWaitEvent(stream_, compute_ready_, 0));
    } else {
      RD_CUDA(cudaDeviceSynchronize());  // no CUDA backend registered: order by brute force
    }
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

  int device_ = 0, rank_ = 0, size_ = 1;
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

bool NcclRequest::test() {
  if (finished_) return true;
  if (!comm_.query_event(done_, what_)) return false;
  comm_.order_compute_after(done_);
  finished_ = true;
  return true;
}

}  // namespace

std::unique_ptr<dist::Comm> make_nccl_comm_impl(MPI_Comm base, int device_index) {
  const int n = cuda_device_count();
  RD_CHECK(n > 0, "NCCL communicator: no CUDA device visible");
  RD_CHECK(device_index >= 0 && device_index < n,
           "NCCL communicator: device " << device_index << " out of range (" << n << " visible)");
  return std::make_unique<NcclComm>(base, device_index);
}

}  // namespace rd::cuda

namespace rd::dist {
std::unique_ptr<Comm> make_nccl_comm(MPI_Comm base, int device_index) {
  return cuda::make_nccl_comm_impl(base, device_index);
}
}  // namespace rd::dist
