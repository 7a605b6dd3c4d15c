// MpiComm: the Comm interface over MPI and host memory. Every operation is a
// non-blocking MPI call completed by detail::wait_requests, so none can hang
// past the collective timeout or outlive a lost peer.
#include <climits>
#include <cstdio>
#include <vector>

#include "dist/mpi_util.h"
#include "resnet_ddp/errors.h"

namespace rd::dist {
namespace {

// MPI counts are int: larger buffers go in chunks of this many elements.
constexpr size_t kMaxChunk = size_t{1} << 30;

template <class T> MPI_Datatype mpi_type();
template <> MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <> MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }
template <> MPI_Datatype mpi_type<int64_t>() { return MPI_INT64_T; }

template <class T> void divide(T* data, size_t count, int by) {
  const T d = static_cast<T>(by);
  for (size_t i = 0; i < count; ++i) data[i] /= d;
}

class MpiRequest final : public Request {
 public:
  MpiRequest(std::vector<MPI_Request> reqs, float* data, size_t count, int average_over,
             const char* what)
      : reqs_(std::move(reqs)), data_(data), count_(count), average_over_(average_over),
        what_(what) {}
  ~MpiRequest() override {
    if (done_) return;
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "warning: %s abandoned unfinished: %s\n", what_, e.what());
    }
  }
  void wait() override {
    if (done_) return;
    detail::wait_requests(reqs_.data(), static_cast<int>(reqs_.size()), what_);
    complete();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    detail::check_mpi(MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag,
                                  MPI_STATUSES_IGNORE), what_);
    if (flag) complete();
    return done_;
  }

 private:
  void complete() {
    done_ = true;
    if (average_over_ > 1) divide(data_, count_, average_over_);
  }
  std::vector<MPI_Request> reqs_;
  float* data_;
  size_t count_;
  int average_over_;
  const char* what_;
  bool done_ = false;
};

class MpiComm final : public Comm {
 public:
  explicit MpiComm(MPI_Comm base) {
    RD_CHECK(detail::mpi_active(), "make_mpi_comm: MPI is not initialised (call init_process first)");
    detail::check_mpi(MPI_Comm_dup(base, &comm_), "MPI_Comm_dup");
    detail::check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    detail::check_mpi(MPI_Comm_dup(base, &probe_comm_), "MPI_Comm_dup");
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiComm() override {
    if (!detail::mpi_active()) return;
    MPI_Comm_free(&probe_comm_);
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  DeviceKind device() const override { return DeviceKind::CPU; }
  std::string name() const override { return "mpi"; }

  void allreduce(float* data, size_t count, ReduceOp op) override { allreduce_t(data, count, op); }
  void allreduce(double* data, size_t count, ReduceOp op) override { allreduce_t(data, count, op); }
  void allreduce(int64_t* data, size_t count, ReduceOp op) override { allreduce_t(data, count, op); }

  std::unique_ptr<Request> iallreduce(float* data, size_t count, ReduceOp op) override {
    std::vector<MPI_Request> reqs = start_allreduce(data, count);
    return std::make_unique<MpiRequest>(std::move(reqs), data, count,
                                        op == ReduceOp::Average ? size_ : 1, "MPI_Iallreduce");
  }

  void broadcast(void* data, size_t bytes, int root) override {
    check_rank(root, "broadcast root");
    std::vector<MPI_Request> reqs;
    char* p = static_cast<char*>(data);
    for (size_t off = 0; off < bytes; off += kMaxChunk) {
      reqs.emplace_back();
      detail::check_mpi(MPI_Ibcast(p + off, chunk(bytes - off), MPI_BYTE, root, comm_, &reqs.back()),
                        "MPI_Ibcast");
    }
    wait(reqs, "MPI_Ibcast");
  }

  void send(const void* data, size_t bytes, int peer, int tag) override {
    check_rank(peer, "send peer");
    check_tag(tag);
    std::vector<MPI_Request> reqs;
    const char* p = static_cast<const char*>(data);
    for (size_t off = 0; off < bytes || reqs.empty(); off += kMaxChunk) {
      reqs.emplace_back();
      detail::check_mpi(MPI_Isend(p + off, chunk(bytes - off), MPI_BYTE, peer, tag, comm_,
                                  &reqs.back()), "MPI_Isend");
      if (bytes == 0) break;
    }
    wait(reqs, "MPI_Isend");
  }

  void recv(void* data, size_t bytes, int peer, int tag) override {
    check_rank(peer, "recv peer");
    check_tag(tag);
    std::vector<MPI_Request> reqs;
    char* p = static_cast<char*>(data);
    for (size_t off = 0; off < bytes || reqs.empty(); off += kMaxChunk) {
      reqs.emplace_back();
      detail::check_mpi(MPI_Irecv(p + off, chunk(bytes - off), MPI_BYTE, peer, tag, comm_,
                                  &reqs.back()), "MPI_Irecv");
      if (bytes == 0) break;
    }
    wait(reqs, "MPI_Irecv");
  }

  void allgather(const void* send, void* recv, size_t bytes_per_rank) override {
    RD_CHECK(bytes_per_rank <= static_cast<size_t>(INT_MAX),
             "allgather: " << bytes_per_rank << " bytes per rank exceeds the MPI count limit");
    std::vector<MPI_Request> reqs(1);
    detail::check_mpi(MPI_Iallgather(send, static_cast<int>(bytes_per_rank), MPI_BYTE, recv,
                                     static_cast<int>(bytes_per_rank), MPI_BYTE, comm_, &reqs[0]),
                      "MPI_Iallgather");
    wait(reqs, "MPI_Iallgather");
  }

  void barrier() override {
    std::vector<MPI_Request> reqs(1);
    detail::check_mpi(MPI_Ibarrier(comm_, &reqs[0]), "MPI_Ibarrier");
    wait(reqs, "MPI_Ibarrier");
  }

  // Any MPI call that enters the progress engine advances every outstanding
  // operation of the process. A probe on a private communicator does that
  // without touching the requests, which belong to their Request objects and
  // may not be tested from two threads at once.
  void progress() override {
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, probe_comm_, &flag, MPI_STATUS_IGNORE);
  }

 private:
  static int chunk(size_t remaining) { return static_cast<int>(std::min(remaining, kMaxChunk)); }

  void check_rank(int r, const char* what) const {
    RD_CHECK(r >= 0 && r < size_, what << " " << r << " is not a rank of this communicator (size "
                                       << size_ << ")");
  }
  static void check_tag(int tag) {
    RD_CHECK(tag >= 0 && tag <= 32767, "message tag " << tag << " outside 0..32767");
  }

  template <class T> std::vector<MPI_Request> start_allreduce(T* data, size_t count) {
    std::vector<MPI_Request> reqs;
    for (size_t off = 0; off < count; off += kMaxChunk) {
      reqs.emplace_back();
      detail::check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data + off, chunk(count - off), mpi_type<T>(),
                                       MPI_SUM, comm_, &reqs.back()),
                        "MPI_Iallreduce");
    }
    return reqs;
  }

  template <class T> void allreduce_t(T* data, size_t count, ReduceOp op) {
    std::vector<MPI_Request> reqs = start_allreduce(data, count);
    wait(reqs, "MPI_Iallreduce");
    if (op == ReduceOp::Average && size_ > 1) divide(data, count, size_);
  }

  static void wait(std::vector<MPI_Request>& reqs, const char* what) {
    if (!reqs.empty()) detail::wait_requests(reqs.data(), static_cast<int>(reqs.size()), what);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm probe_comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(MPI_Comm base) { return std::make_unique<MpiComm>(base); }

}  // namespace rd::dist
