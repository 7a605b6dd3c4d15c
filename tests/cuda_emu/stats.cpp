// The counters of the emulated device (emu.h, "counters") and RD_EMU_STATS=PATH: at
// exit (std::exit from any thread, or a return from main) each process writes
// PATH.rank<R>, one "name value" per line, sorted by name, every name present.
// A fault (_exit) writes nothing, so a budget test reading the file fails loudly
// instead of reading counts of a run that did not finish.
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include <unistd.h>

#include "cuda_emu/emu.h"

namespace rd::emu {
namespace {

// Atomics with trivial destructors: the exit handler reads them without api_lock (a
// thread blocked in the emulator at exit may hold it) and after static destructors.
std::atomic<uint64_t> g_counts[static_cast<int>(Counter::kCount)];

constexpr const char* kHostWaitNames[] = {"host_waits.stream_sync",   "host_waits.event_sync",
                                          "host_waits.device_sync",   "host_waits.blocking_copy",
                                          "host_waits.pageable_copy", "host_waits.query_not_ready"};

const char* name_of(Counter c) {
  switch (c) {
    case Counter::StreamSync:
      return kHostWaitNames[0];
    case Counter::EventSync:
      return kHostWaitNames[1];
    case Counter::DeviceSync:
      return kHostWaitNames[2];
    case Counter::BlockingCopy:
      return kHostWaitNames[3];
    case Counter::PageableCopy:
      return kHostWaitNames[4];
    case Counter::QueryNotReady:
      return kHostWaitNames[5];
    case Counter::Allocs:
      return "allocs";
    case Counter::Frees:
      return "frees";
    case Counter::CudnnFind:
      return "cudnn_find";
    case Counter::NcclAllReduce:
      return "nccl.allreduce";
    case Counter::NcclBroadcast:
      return "nccl.broadcast";
    case Counter::NcclReduce:
      return "nccl.reduce";
    case Counter::NcclAllGather:
      return "nccl.allgather";
    case Counter::NcclReduceScatter:
      return "nccl.reducescatter";
    case Counter::NcclSend:
      return "nccl.send";
    case Counter::NcclRecv:
      return "nccl.recv";
    case Counter::KernelLaunches:
      return "kernel_launches";
    case Counter::GraphLaunches:
      return "graph_launches";
    case Counter::QueryNotReadyFirst:
      return "query_not_ready_first";
    case Counter::QueryNotReadyGapUs:
      return "query_not_ready_gap_us";
    case Counter::kCount:
      break;
  }
  return "?";
}

// R of PATH.rank<R>: the launcher's rank variable (Open MPI, then PMI, then Slurm), else 0.
std::string rank_suffix() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    const char* v = std::getenv(var);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long r = std::strtol(v, &end, 10);
    if (*end || r < 0) fault(std::string("RD_EMU_STATS: ") + var + "='" + v + "' is not a rank number");
    return std::to_string(r);
  }
  return "0";
}

std::string stats_path() {
  const char* base = std::getenv("RD_EMU_STATS");
  if (!base || !*base) return {};
  return std::string(base) + ".rank" + rank_suffix();
}

void write_stats_at_exit() {
  const std::string path = stats_path();
  if (path.empty()) return;
  std::string text;
  for (const auto& [name, value] : stats_snapshot()) text += name + " " + std::to_string(value) + "\n";
  FILE* f = std::fopen(path.c_str(), "w");
  bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  int err = errno;
  if (f && std::fclose(f) != 0 && ok) ok = false, err = errno;
  if (!ok) {
    // A missing stats file must not look like a run that counted nothing.
    note("RD_EMU_STATS: cannot write " + path + ": " + std::strerror(err));
    _exit(kFaultExit);
  }
}

// Registered while static objects are built, so it runs after main returns or when
// any thread calls exit(). A path that cannot be written is refused at start, and an
// old file of the same name is emptied, so it never passes for this run's counts.
struct ExitWriter {
  ExitWriter() {
    const std::string path = stats_path();
    if (!path.empty()) {
      FILE* f = std::fopen(path.c_str(), "w");
      if (!f) fault("RD_EMU_STATS: cannot write " + path + ": " + std::strerror(errno));
      std::fclose(f);
    }
    std::atexit(write_stats_at_exit);
  }
} g_exit_writer;

}  // namespace

void count(Counter c) { g_counts[static_cast<int>(c)].fetch_add(1, std::memory_order_relaxed); }

namespace {
// This thread's last not-ready query, and the start of the query now running.
struct QueryPoll {
  bool armed = false;  // a not-ready answer is on record
  const void* handle = nullptr;  // the default stream's handle is null too
  std::chrono::steady_clock::time_point answered, started;
};
thread_local QueryPoll t_poll;
}  // namespace

void query_started(const void* handle) {
  t_poll.started = std::chrono::steady_clock::now();
  if (t_poll.handle != handle) t_poll.armed = false;
}

void query_not_ready(const void* handle) {
  count(Counter::QueryNotReady);
  // Only gaps between two not-ready answers: a poll that finds the work done adds nothing,
  // so a single query costs what the other counters say.
  if (t_poll.armed && t_poll.handle == handle) {
    const auto gap = std::chrono::duration_cast<std::chrono::microseconds>(t_poll.started - t_poll.answered);
    g_counts[static_cast<int>(Counter::QueryNotReadyGapUs)].fetch_add(static_cast<uint64_t>(gap.count()),
                                                                       std::memory_order_relaxed);
  } else {
    count(Counter::QueryNotReadyFirst);
  }
  t_poll.armed = true;
  t_poll.handle = handle;
  t_poll.answered = std::chrono::steady_clock::now();
}

std::map<std::string, uint64_t> stats_snapshot() {
  std::map<std::string, uint64_t> out;
  uint64_t waits = 0, nccl = 0;
  for (int i = 0; i < static_cast<int>(Counter::kCount); ++i) {
    const Counter c = static_cast<Counter>(i);
    const uint64_t v = g_counts[i].load(std::memory_order_relaxed);
    out[name_of(c)] = v;
    if (c <= Counter::QueryNotReady) waits += v;
    if (c >= Counter::NcclAllReduce && c <= Counter::NcclRecv) nccl += v;
  }
  out["host_waits"] = waits;
  out["nccl"] = nccl;
  return out;
}

}  // namespace rd::emu
