// Process environment (rank, local rank, node), the startup lines, and the
// watchdog: a heartbeat ring that ends the job when a peer dies or freezes.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/mpi_util.h"
#include "resnet_ddp/collective_timeout.h"
#include "resnet_ddp/errors.h"

namespace rd::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<double> g_heartbeat_s{1.0};
std::atomic<double> g_peer_timeout_s{10.0};
std::atomic<int> g_lost_peer{-1};

std::mutex g_init_mutex;
bool g_initialized = false;
bool g_we_initialized_mpi = false;
ProcessEnv g_env;

constexpr int kTagBeat = 1;
constexpr int kTagLost = 2;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Reads a positive number of seconds from an environment variable.
double env_seconds(const char* name, double fallback) {
  const char* text = std::getenv(name);
  if (!text || !*text) return fallback;
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(v) || v <= 0)
    throw UsageError(std::string("environment variable ") + name + "='" + text +
                     "' must be a positive number of seconds");
  return v;
}

// The heartbeat ring. Runs on its own thread with its own communicator, so it
// never matches training traffic; MPI_THREAD_MULTIPLE makes that legal.
class Watchdog {
 public:
  Watchdog(const ProcessEnv& env, std::vector<std::string> hosts)
      : rank_(env.rank), world_(env.world), hosts_(std::move(hosts)) {
    detail::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup (watchdog)");
    thread_ = std::thread([this] { run(); });
  }
  ~Watchdog() { stop(); }

  void stop() {
    if (!thread_.joinable()) return;
    stop_.store(true);
    thread_.join();
    for (MPI_Request& r : sends_) MPI_Request_free(&r);
    sends_.clear();
    MPI_Comm_free(&comm_);
  }

 private:
  void run() {
    const int next = (rank_ + 1) % world_;
    const int prev = (rank_ + world_ - 1) % world_;
    Clock::time_point last_seen = Clock::now();
    Clock::time_point last_sent = Clock::now() - std::chrono::hours(1);
    while (!stop_.load()) {
      const double interval = g_heartbeat_s.load();
      if (seconds_since(last_sent) >= interval) {
        // A frozen receiver cannot drain its queue: cap what we leave in flight.
        if (sends_.size() < 16) {
          sends_.emplace_back();
          MPI_Isend(&beat_, 1, MPI_BYTE, next, kTagBeat, comm_, &sends_.back());
        }
        last_sent = Clock::now();
      }
      reap_sends();
      int flag = 0;
      MPI_Status st;
      while (MPI_Iprobe(prev, kTagBeat, comm_, &flag, &st) == MPI_SUCCESS && flag) {
        char byte;
        MPI_Recv(&byte, 1, MPI_BYTE, prev, kTagBeat, comm_, MPI_STATUS_IGNORE);
        last_seen = Clock::now();
      }
      if (MPI_Iprobe(MPI_ANY_SOURCE, kTagLost, comm_, &flag, &st) == MPI_SUCCESS && flag) {
        int lost = -1;
        MPI_Recv(&lost, 1, MPI_INT, st.MPI_SOURCE, kTagLost, comm_, MPI_STATUS_IGNORE);
        die(lost, "reported by rank " + std::to_string(st.MPI_SOURCE));
      }
      const double silent = seconds_since(last_seen);
      if (silent > g_peer_timeout_s.load()) {
        char why[96];
        std::snprintf(why, sizeof why, "no heartbeat for %.1f s", silent);
        tell_others(prev);
        die(prev, why);
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(interval / 4, 0.05)));
    }
  }

  void reap_sends() {
    if (sends_.empty()) return;
    int done = 0;
    MPI_Testall(static_cast<int>(sends_.size()), sends_.data(), &done, MPI_STATUSES_IGNORE);
    if (done) sends_.clear();
  }

  // Best effort: every live rank learns which peer is gone, so each prints it.
  void tell_others(int lost) {
    lost_msg_ = lost;
    std::vector<MPI_Request> reqs;
    for (int r = 0; r < world_; ++r) {
      if (r == rank_ || r == lost) continue;
      reqs.emplace_back();
      MPI_Isend(&lost_msg_, 1, MPI_INT, r, kTagLost, comm_, &reqs.back());
    }
    Clock::time_point t0 = Clock::now();
    int done = 0;
    while (!reqs.empty() && seconds_since(t0) < 2.0) {
      MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
      if (done) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  // Ends this process: MPI cannot be finalised with a dead peer, and the
  // launcher turns a non-zero exit into the end of the job.
  [[noreturn]] void die(int lost, const std::string& why) {
    g_lost_peer.store(lost);
    std::fflush(stdout);
    // The host too: across machines "which node is gone" is what an operator needs.
    const std::string host =
        lost >= 0 && lost < static_cast<int>(hosts_.size()) ? hosts_[static_cast<size_t>(lost)] : "?";
    std::fprintf(stderr, "rank %d: lost contact with rank %d on host %s (%s); exiting with status %d\n",
                 rank_, lost, host.c_str(), why.c_str(), kPeerLostExitCode);
    std::fflush(stderr);
    std::_Exit(kPeerLostExitCode);
  }

  int rank_;
  int world_;
  std::vector<std::string> hosts_;  // processor name of each rank
  MPI_Comm comm_ = MPI_COMM_NULL;
  char beat_ = 1;
  int lost_msg_ = -1;
  std::vector<MPI_Request> sends_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::unique_ptr<Watchdog> g_watchdog;

}  // namespace

namespace detail {

bool mpi_active() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw Error(std::string(what) + " failed: " +
              (len ? std::string(text, static_cast<size_t>(len)) : "MPI error " + std::to_string(rc)));
}

void wait_requests(MPI_Request* requests, int n, const char* what) {
  const Clock::time_point start = Clock::now();
  const double timeout = rd::collective_timeout_s();
  for (long iter = 0;; ++iter) {
    int done = 0;
    check_mpi(MPI_Testall(n, requests, &done, MPI_STATUSES_IGNORE), what);
    if (done) return;
    if (int lost = g_lost_peer.load(); lost >= 0)
      throw Error(std::string(what) + ": rank " + std::to_string(lost) + " was lost");
    // Spin briefly (small collectives finish in microseconds), then yield, then
    // sleep: with more ranks than cores a spinning waiter steals the CPU the
    // peer it waits for needs.
    if (iter < 256) continue;
    const double waited = seconds_since(start);
    if (waited > timeout) {
      char msg[160];
      std::snprintf(msg, sizeof msg, ": no completion after %.0f s (collective timeout; "
                    "RD_COLLECTIVE_TIMEOUT_S)", waited);
      throw Error(std::string(what) + msg);
    }
    if (waited < 2e-3)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace detail

ProcessEnv init_process(int& argc, char**& argv) {
  std::lock_guard<std::mutex> lock(g_init_mutex);
  if (g_initialized) return g_env;
  WatchdogOptions opts = watchdog_options();  // validates the environment first

  int already = 0;
  MPI_Initialized(&already);
  int provided = MPI_THREAD_SINGLE;
  if (!already) {
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      throw Error("MPI_Init_thread failed: is the program started by mpirun/srun with a working MPI?");
    g_we_initialized_mpi = true;
  } else {
    MPI_Query_thread(&provided);
  }
  detail::check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
                    "MPI_Comm_set_errhandler");

  ProcessEnv env;
  detail::check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &env.rank), "MPI_Comm_rank");
  detail::check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &env.world), "MPI_Comm_size");
  MPI_Comm local = MPI_COMM_NULL;
  detail::check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, env.rank,
                                        MPI_INFO_NULL, &local),
                    "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  MPI_Comm_rank(local, &env.local_rank);
  MPI_Comm_size(local, &env.local_world);
  {
    // Ranks bound to their own cores use them all; ranks sharing one mask (no
    // binding, or one Slurm cgroup for the whole step) split it evenly.
    cpu_set_t mask;
    CPU_ZERO(&mask);
    int cpus = 0;
    uint64_t mask_hash = 1469598103934665603ull;
    if (sched_getaffinity(0, sizeof mask, &mask) == 0) {
      cpus = CPU_COUNT(&mask);
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &mask)) mask_hash = (mask_hash ^ static_cast<uint64_t>(c)) * 1099511628211ull;
    }
    if (cpus < 1) cpus = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
    std::vector<uint64_t> hashes(static_cast<size_t>(env.local_world));
    detail::check_mpi(MPI_Allgather(&mask_hash, 1, MPI_UINT64_T, hashes.data(), 1, MPI_UINT64_T, local),
                      "MPI_Allgather(affinity masks)");
    const long sharing = std::count(hashes.begin(), hashes.end(), mask_hash);
    env.cpus_per_rank = std::max(1, static_cast<int>(cpus / std::max(1L, sharing)));
    env.cpus_available = cpus;
    env.mask_sharers = static_cast<int>(std::max(1L, sharing));
  }
  MPI_Comm_free(&local);
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  detail::check_mpi(MPI_Get_processor_name(host, &len), "MPI_Get_processor_name");
  env.node.assign(host, static_cast<size_t>(len));

  set_watchdog_options(opts);
  if (env.world > 1) {
    if (provided >= MPI_THREAD_MULTIPLE) {
      std::vector<char> names(static_cast<size_t>(env.world) * MPI_MAX_PROCESSOR_NAME);
      detail::check_mpi(MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(),
                                      MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD),
                        "MPI_Allgather(processor names)");
      std::vector<std::string> hosts;
      for (int r = 0; r < env.world; ++r) {
        const char* n = names.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME;
        hosts.emplace_back(n, strnlen(n, MPI_MAX_PROCESSOR_NAME));
      }
      g_watchdog = std::make_unique<Watchdog>(env, std::move(hosts));
    } else if (env.rank == 0) {
      std::fprintf(stderr, "notice: MPI granted thread level %d < MPI_THREAD_MULTIPLE; the peer "
                           "heartbeat is off (collective timeout still applies)\n", provided);
    }
  }
  g_env = env;
  g_initialized = true;
  return env;
}

bool process_initialized() { return g_initialized; }

void finalize_process() {
  std::lock_guard<std::mutex> lock(g_init_mutex);
  if (!g_initialized) return;
  if (g_env.world > 1 && detail::mpi_active()) {
    // Every rank reaches this point before any heartbeat stops.
    MPI_Request req;
    detail::check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &req), "MPI_Ibarrier (finalize)");
    detail::wait_requests(&req, 1, "final barrier");
  }
  if (g_watchdog) {
    g_watchdog->stop();
    g_watchdog.reset();
  }
  if (g_we_initialized_mpi && detail::mpi_active()) MPI_Finalize();
  g_initialized = false;
}

void abort_job(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (detail::mpi_active() && g_env.world > 1) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void print_startup_lines(const ProcessEnv& env, const std::string& device) {
  char line[512];
  std::snprintf(line, sizeof line, "rank %d/%d: local_rank %d/%d on node %s, device %s", env.rank,
                env.world, env.local_rank, env.local_world, env.node.c_str(), device.c_str());
  if (env.world == 1 || !detail::mpi_active()) {
    std::printf("%s\n", line);
    std::fflush(stdout);
    return;
  }
  // Rank 0 prints every line, so they appear in rank order whatever the launcher.
  std::vector<char> all(static_cast<size_t>(env.world) * sizeof line);
  auto comm = make_mpi_comm(MPI_COMM_WORLD);
  comm->allgather(line, all.data(), sizeof line);
  if (env.rank == 0) {
    for (int r = 0; r < env.world; ++r) std::printf("%s\n", all.data() + r * sizeof line);
    std::fflush(stdout);
  }
}

int affinity_cpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0 && CPU_COUNT(&mask) > 0) return CPU_COUNT(&mask);
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

int default_threads_per_rank(const ProcessEnv& env) {
  // An explicit OMP_NUM_THREADS (set by job scripts or the user) wins.
  if (const char* omp = std::getenv("OMP_NUM_THREADS")) {
    const int n = std::atoi(omp);
    if (n >= 1) return n;
  }
  return std::max(1, env.cpus_per_rank);
}

WatchdogOptions watchdog_options() {
  WatchdogOptions o;
  o.collective_timeout_s = env_seconds("RD_COLLECTIVE_TIMEOUT_S", rd::collective_timeout_s());
  o.heartbeat_interval_s = env_seconds("RD_HEARTBEAT_S", g_heartbeat_s.load());
  o.peer_timeout_s = env_seconds("RD_PEER_TIMEOUT_S", g_peer_timeout_s.load());
  return o;
}

void set_watchdog_options(const WatchdogOptions& o) {
  auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  if (!positive(o.collective_timeout_s) || !positive(o.heartbeat_interval_s) ||
      !positive(o.peer_timeout_s))
    throw UsageError("watchdog: timeouts and the heartbeat interval must be positive seconds");
  if (o.peer_timeout_s < 2 * o.heartbeat_interval_s)
    throw UsageError("watchdog: peer timeout (" + std::to_string(o.peer_timeout_s) +
                     " s) must be at least twice the heartbeat interval (" +
                     std::to_string(o.heartbeat_interval_s) + " s)");
  rd::set_collective_timeout_s(o.collective_timeout_s);
  g_heartbeat_s.store(o.heartbeat_interval_s);
  g_peer_timeout_s.store(o.peer_timeout_s);
}

double collective_timeout_s() { return rd::collective_timeout_s(); }
int lost_peer() { return g_lost_peer.load(); }

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "average"; }

}  // namespace rd::dist
