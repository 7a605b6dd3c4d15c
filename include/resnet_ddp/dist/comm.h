// Process environment and communicators.
//
// One MPI rank per device (GPU, or a share of a CPU node). MPI itself tells each
// rank who it is, so mpirun, `srun --mpi=pmix` and TACC's ibrun all work without
// torchrun-style environment variables.
//
// `Comm` is the one interface DDP, SyncBatchNorm and the trainer use. Two
// implementations:
//   - MpiComm (make_mpi_comm): host memory; the CPU backend's data path.
//   - NcclComm (make_nccl_comm in resnet_ddp/backend/nccl_comm.h, CUDA builds only):
//     device memory, ordered against the CUDA backend it is made for. Bootstrap: rank 0 calls ncclGetUniqueId, the id is sent to every rank with
//     MPI_Bcast over the MPI communicator, every rank calls ncclCommInitRank (with
//     the non-blocking config so a failed peer can be noticed: poll
//     ncclCommGetAsyncError against the backend's collective_timeout_s and
//     ncclCommAbort on expiry, or when rd::dist::lost_peer() >= 0). Collectives run
//     on a dedicated comm stream that waits (events) on the compute stream;
//     Request::wait makes the compute stream wait for the collective and
//     Request::test queries the event. Pointers given to an NcclComm are device
//     pointers; to MpiComm host pointers.
//
// Failure handling (the "collective watchdog")
//   - Every MPI call returns errors (MPI_ERRORS_RETURN) which become rd::Error.
//   - Blocking operations are non-blocking MPI calls polled until done, with a
//     deadline (collective_timeout_s, default 600 s, env RD_COLLECTIVE_TIMEOUT_S):
//     a wait that passes it throws rd::Error naming the operation.
//   - With world > 1, init_process starts a heartbeat thread: each rank sends a
//     tiny message to rank+1 every heartbeat_interval_s (default 1 s, env
//     RD_HEARTBEAT_S) and expects one from rank-1. When nothing has arrived from
//     rank-1 for peer_timeout_s (default 10 s, env RD_PEER_TIMEOUT_S) that peer is
//     declared lost: the detecting rank tells every other rank, each prints
//     "rank R: lost contact with rank P ..." on stderr and exits with
//     kPeerLostExitCode, so a dead or frozen rank takes the whole job down in
//     about peer_timeout_s instead of hanging it until the wall-time limit.
#pragma once

// The C API only: Open MPI's deprecated C++ bindings trip -Wextra.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "resnet_ddp/tensor.h"

namespace rd::dist {

// Exit status of a rank that stopped because a peer died or froze.
inline constexpr int kPeerLostExitCode = 3;

struct ProcessEnv {
  int rank = 0;
  int world = 1;
  int local_rank = 0;   // index among the ranks on this node
  int local_world = 1;  // ranks on this node
  std::string node;     // processor name (host)
  // CPUs this rank may use: its affinity mask (what mpirun binding or Slurm
  // granted), divided among the local ranks that share that same mask.
  int cpus_per_rank = 1;
  // This rank's affinity mask, whole, and how many ranks on this node share that very
  // mask (1 when each is bound to its own cores): the rank's threads plus those of the
  // others on the same cores must fit in cpus_available.
  int cpus_available = 1;
  int mask_sharers = 1;
};

// CPUs in this process's affinity mask (the online CPU count when it cannot be read).
int affinity_cpus();

// MPI_Init_thread(MPI_THREAD_MULTIPLE), errors returned instead of aborting,
// local rank via MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), watchdog started.
// Safe to call once per process; a second call returns the same environment.
ProcessEnv init_process(int& argc, char**& argv);
// A final barrier (so no rank mistakes a finished peer for a dead one), stop the
// watchdog, MPI_Finalize. No-op when MPI was never initialised by init_process.
void finalize_process();
// True between init_process and finalize_process.
bool process_initialized();
// Ends the whole job after a fatal error on this rank: prints nothing itself,
// stops the watchdog and calls MPI_Abort(code) (no-op wrapper for world 1 that
// just exits). Use when only some ranks may have failed (others would wait).
[[noreturn]] void abort_job(int code);

// One line per rank, printed by rank 0 in rank order:
//   "rank 1/4: local_rank 1/4 on node c001-001, device cpu (...)"
void print_startup_lines(const ProcessEnv& env, const std::string& device);
// Cores on this node divided by the ranks on this node, at least 1.
int default_threads_per_rank(const ProcessEnv& env);

// ---- watchdog settings (seconds; all > 0) ---------------------------------------
struct WatchdogOptions {
  double collective_timeout_s = 600.0;
  double heartbeat_interval_s = 1.0;
  double peer_timeout_s = 10.0;
};
// Defaults overridden by RD_COLLECTIVE_TIMEOUT_S / RD_HEARTBEAT_S / RD_PEER_TIMEOUT_S.
WatchdogOptions watchdog_options();
// Change the settings at run time (e.g. from command-line flags); throws
// UsageError on non-positive values or peer_timeout_s < 2 * heartbeat_interval_s.
void set_watchdog_options(const WatchdogOptions& opts);
double collective_timeout_s();
// Rank declared lost by the watchdog, or -1 while all peers are alive.
int lost_peer();

// ---- communicators ---------------------------------------------------------------
enum class ReduceOp { Sum, Average };
const char* reduce_op_name(ReduceOp op);

// Handle of an asynchronous operation. Destroying an unfinished request waits
// for it (an MPI buffer must not be released while the operation runs).
class Request {
 public:
  virtual ~Request() = default;
  // Blocks until done (throws rd::Error on failure, timeout or a lost peer).
  virtual void wait() = 0;
  // Non-blocking: true once done (then wait() returns immediately).
  virtual bool test() = 0;
  // The device's compute stream waits for the operation, the host does not (a device
  // communicator): work queued afterwards sees the result, and the operation may sit in a
  // CUDA graph. A failure or hang then surfaces at the host's next bounded wait for that
  // stream (CudaBackend::wait_queued_copies). Host communicators simply wait.
  virtual void wait_on_device() { wait(); }
};

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the buffers given to this communicator live.
  virtual DeviceKind device() const = 0;
  virtual std::string name() const = 0;  // "mpi", "nccl"

  // In place over all ranks. Average divides the sum by size() (integers: the
  // quotient truncated toward zero).
  virtual void allreduce(float* data, size_t count, ReduceOp op) = 0;
  virtual void allreduce(double* data, size_t count, ReduceOp op) = 0;
  virtual void allreduce(int64_t* data, size_t count, ReduceOp op) = 0;
  // Like allreduce, but a device communicator may return before the sum is
  // there: work its device's compute stream runs afterwards sees it (ordered on
  // an event, no host wait), while the host must not read `data` before that
  // stream is synchronised. Host communicators simply block.
  virtual void allreduce_stream_ordered(double* data, size_t count, ReduceOp op) { allreduce(data, count, op); }
  // Asynchronous all-reduce; `data` must stay valid until the request is done.
  virtual std::unique_ptr<Request> iallreduce(float* data, size_t count, ReduceOp op) = 0;

  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // As allreduce_stream_ordered for broadcast: a device communicator returns at once,
  // the device's compute stream sees the data; host communicators simply block.
  virtual void broadcast_stream_ordered(void* data, size_t bytes, int root) { broadcast(data, bytes, root); }
  virtual void send(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual void recv(void* data, size_t bytes, int peer, int tag) = 0;
  // recv holds size() * bytes_per_rank bytes, rank r's block at r * bytes_per_rank.
  virtual void allgather(const void* send, void* recv, size_t bytes_per_rank) = 0;
  virtual void barrier() = 0;
  // Drives outstanding asynchronous operations forward (Open MPI makes no
  // progress in the background: call this between layers of backward).
  virtual void progress() = 0;
};

// MPI communicator over host memory. The communicator is duplicated, so its
// traffic never matches anyone else's on `base`.
std::unique_ptr<Comm> make_mpi_comm(MPI_Comm base = MPI_COMM_WORLD);

// The NCCL communicator (device memory) is the CUDA backend's: make_nccl_comm in
// resnet_ddp/backend/nccl_comm.h.

}  // namespace rd::dist
