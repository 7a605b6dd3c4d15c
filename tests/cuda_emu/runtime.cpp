// The CUDA runtime stand-in: the fake device, tagged device memory, streams and
// events that run later and out of order, and the runtime API calls the backend
// makes (exactly those; a call we do not define fails to link, which is the point).
//
// Memory: each allocation gets its own mapping, right-aligned against a PROT_NONE
// guard page, with the slack between its size and the 256-byte granule filled with
// a canary; freed memory is made PROT_NONE and kept in quarantine. An access past
// the end or after cudaFree is then a SIGSEGV that the handler turns into a fault
// naming the allocation and the running operation. Fresh allocations are filled
// with 0xFF (NaN as float), so reading memory nobody wrote shows.
//
// Streams: every call enqueues; work runs only when the host waits (stream, event
// or device synchronisation, a query, a blocking copy). Then the scheduler runs
// just what the awaited work depends on ("lazy", the default: other streams lag as
// far behind as the events allow), or random runnable streams (RD_EMU_SCHEDULE=
// random, RD_EMU_SEED). Either way only events order streams, as on the device.
//
// Capture: while a stream captures, what is issued to it is recorded into a graph
// instead of queued; cudaGraphLaunch queues the recorded work again (docs/cuda.md).
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cuda_emu/emu.h"
#include "cuda_emu/internal.h"

namespace rd::emu {

// ---- faults ------------------------------------------------------------------------------

void fault(const std::string& what) {
  std::fprintf(stderr, "cuda-emu: FAULT: %s\n", what.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  _exit(kFaultExit);
}

void note(const std::string& what) {
  std::fprintf(stderr, "cuda-emu: %s\n", what.c_str());
  std::fflush(stderr);
}

std::recursive_mutex& api_lock() {
  static std::recursive_mutex m;
  return m;
}

namespace {

thread_local cudaError_t t_last_error = cudaSuccess;
// What the device is executing now (for fault messages from the SIGSEGV handler).
std::atomic<const char*> g_running_op{nullptr};
std::string g_running_op_storage;

cudaError_t set_error(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const double d = std::strtod(v, &end);
  if (end == v || *end) fault(std::string(name) + "='" + v + "' is not a number");
  return d;
}

}  // namespace

// ---- the fake device ----------------------------------------------------------------------

const DeviceSpec& device_spec() {
  static const DeviceSpec spec = [] {
    DeviceSpec s;
    const char* v = std::getenv("RD_EMU_DEVICE");
    const std::string kind = v && *v ? v : "rtx5000";
    constexpr size_t GiB = size_t(1) << 30;
    if (kind == "rtx5000") {
      s.name = "Emulated Quadro RTX 5000", s.major = 7, s.minor = 5, s.total_bytes = 16 * GiB, s.multiprocessors = 48;
      s.max_block_dims[2] = 64;
      s.shared_per_block = 48 * 1024;
    } else if (kind == "a100") {
      s.name = "Emulated A100-SXM4-40GB", s.major = 8, s.minor = 0, s.total_bytes = 40 * GiB, s.multiprocessors = 108;
    } else if (kind == "h200") {
      s.name = "Emulated H200", s.major = 9, s.minor = 0, s.total_bytes = 141 * GiB, s.multiprocessors = 132;
    } else {
      fault("RD_EMU_DEVICE='" + kind + "': use rtx5000, a100 or h200");
    }
    const double mib = env_double("RD_EMU_MEMORY_MIB", 0);
    if (mib > 0) s.total_bytes = static_cast<size_t>(mib * 1024 * 1024);
    return s;
  }();
  return spec;
}

// The node's emulated GPUs (RD_EMU_DEVICE_COUNT) filtered by CUDA_VISIBLE_DEVICES as
// the driver does: the listed physical indices in order, up to the first invalid one.
const std::vector<int>& visible_devices() {
  static const std::vector<int> v = [] {
    const int physical = static_cast<int>(env_double("RD_EMU_DEVICE_COUNT", 1));
    std::vector<int> out;
    const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
    if (!env) {
      for (int i = 0; i < physical; ++i) out.push_back(i);
      return out;
    }
    std::string list = env;
    size_t pos = 0;
    while (pos <= list.size() && !list.empty()) {
      const size_t comma = list.find(',', pos);
      const std::string item = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      char* end = nullptr;
      const long idx = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end || idx < 0 || idx >= physical) break;
      out.push_back(static_cast<int>(idx));
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
    return out;
  }();
  return v;
}

int device_count() { return static_cast<int>(visible_devices().size()); }

namespace {
thread_local int t_device = 0;
}
int current_device() { return t_device; }

// ---- memory --------------------------------------------------------------------------------

namespace {

constexpr size_t kGranule = 256;
constexpr unsigned char kCanary = 0xA5;
constexpr unsigned char kPoison = 0xFF;

struct Region {
  Allocation a;
  char* map = nullptr;  // the whole mapping (guard page at its end)
  size_t map_bytes = 0;
  size_t usable = 0;  // a.bytes rounded up to kGranule: [a.base + a.bytes, a.base + usable) is canary
  bool freed = false;
  std::string freed_by;
};

struct Memory {
  std::map<uintptr_t, Region> live;         // by base address
  std::map<uintptr_t, Region> quarantine;   // freed, PROT_NONE
  std::deque<uintptr_t> quarantine_order;
  size_t quarantine_bytes = 0;
  size_t device_used[64] = {};
  uint64_t serial = 0;
};

Memory& mem() {
  static Memory* m = new Memory;  // never destroyed: static destructors may still free
  return *m;
}

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

const Region* region_of(const std::map<uintptr_t, Region>& m, const void* p, bool include_guard) {
  const uintptr_t q = reinterpret_cast<uintptr_t>(p);
  auto it = m.upper_bound(q);
  if (it == m.begin()) return nullptr;
  --it;
  const Region& r = it->second;
  const uintptr_t end = reinterpret_cast<uintptr_t>(r.a.base) + (include_guard ? r.usable + page_size() : r.a.bytes);
  return q < end ? &r : nullptr;
}

std::string kind_name(MemKind k) { return k == MemKind::Device ? "device" : "pinned host"; }

std::string describe(const Region& r) {
  return "allocation #" + std::to_string(r.a.serial) + " (" + std::to_string(r.a.bytes) + " B, " +
         kind_name(r.a.kind) + ")";
}

struct sigaction g_prev_segv, g_prev_bus;

void segv_handler(int sig, siginfo_t* info, void*) {
  const void* addr = info->si_addr;
  Memory& m = mem();
  const char* op = g_running_op.load();
  std::string where = op ? std::string(" while running ") + op : std::string(" on the host");
  if (const Region* r = region_of(m.quarantine, addr, true)) {
    fault("use after free: address " + std::to_string(reinterpret_cast<uintptr_t>(addr) -
                                                      reinterpret_cast<uintptr_t>(r->a.base)) +
          " B into " + describe(*r) + ", freed by " + r->freed_by + where);
  }
  if (const Region* r = region_of(m.live, addr, true)) {
    fault("access past the end: byte " +
          std::to_string(reinterpret_cast<uintptr_t>(addr) - reinterpret_cast<uintptr_t>(r->a.base)) + " of " +
          describe(*r) + where);
  }
  // Not ours: whoever handled it before us (a test framework, MPI), else the default.
  struct sigaction& prev = sig == SIGSEGV ? g_prev_segv : g_prev_bus;
  if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction) {
    prev.sa_sigaction(sig, info, nullptr);
    return;
  }
  if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN && prev.sa_handler) {
    prev.sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

// Installed again whenever someone replaced it (Catch2 and Open MPI install their
// own SIGSEGV handlers after us); theirs gets the faults that are not ours.
void install_segv_handler() {
  for (int sig : {SIGSEGV, SIGBUS}) {
    struct sigaction cur;
    sigaction(sig, nullptr, &cur);
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == segv_handler) continue;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, sig == SIGSEGV ? &g_prev_segv : &g_prev_bus);
  }
  // Faults on a fiber's small stack need a stack of their own for the handler.
  thread_local bool have_altstack = false;
  if (!have_altstack) {
    stack_t ss;
    ss.ss_size = 64 * 1024;
    ss.ss_sp = std::malloc(ss.ss_size);
    ss.ss_flags = 0;
    sigaltstack(&ss, nullptr);
    have_altstack = true;
  }
}

namespace {

void check_canary(const Region& r, const char* when) {
  for (size_t i = r.a.bytes; i < r.usable; ++i)
    if (static_cast<unsigned char>(r.a.base[i]) != kCanary)
      fault("write past the end of " + describe(r) + " (byte " + std::to_string(i) + ") found at " + when);
}

cudaError_t allocate(void** out, size_t bytes, MemKind kind, const char* call) {
  if (!out) return set_error(cudaErrorInvalidValue);
  install_segv_handler();
  Memory& m = mem();
  const DeviceSpec& spec = device_spec();
  const size_t usable = std::max(kGranule, (bytes + kGranule - 1) / kGranule * kGranule);
  const int dev = current_device();
  if (kind == MemKind::Device && m.device_used[dev] + usable > spec.total_bytes) {
    *out = nullptr;
    return set_error(cudaErrorMemoryAllocation);
  }
  const size_t ps = page_size();
  const size_t map_bytes = (usable + ps - 1) / ps * ps + ps;
  void* map = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (map == MAP_FAILED) {
    *out = nullptr;
    return set_error(cudaErrorMemoryAllocation);
  }
  char* guard = static_cast<char*>(map) + map_bytes - ps;
  mprotect(guard, ps, PROT_NONE);
  Region r;
  r.map = static_cast<char*>(map);
  r.map_bytes = map_bytes;
  r.usable = usable;
  r.a.base = guard - usable;
  r.a.bytes = bytes;
  r.a.kind = kind;
  r.a.device = dev;
  r.a.serial = ++m.serial;
  std::memset(r.a.base, kPoison, bytes);
  std::memset(r.a.base + bytes, kCanary, usable - bytes);
  if (kind == MemKind::Device) m.device_used[dev] += usable;
  m.live.emplace(reinterpret_cast<uintptr_t>(r.a.base), r);
  *out = r.a.base;
  (void)call;
  return cudaSuccess;
}

cudaError_t release(void* p, MemKind kind, const char* call) {
  if (!p) return cudaSuccess;
  Memory& m = mem();
  auto it = m.live.find(reinterpret_cast<uintptr_t>(p));
  if (it == m.live.end() || it->second.a.kind != kind) {
    if (const Region* q = region_of(m.quarantine, p, false))
      fault(std::string(call) + ": double free of " + describe(*q) + ", already freed by " + q->freed_by);
    fault(std::string(call) + ": " + describe_pointer(p) + " is not the start of a live " +
          kind_name(kind) + " allocation");
  }
  Region r = it->second;
  check_canary(r, call);
  m.live.erase(it);
  if (kind == MemKind::Device) m.device_used[r.a.device] -= r.usable;
  r.freed = true;
  r.freed_by = call;
  mprotect(r.map, r.map_bytes, PROT_NONE);
  m.quarantine.emplace(reinterpret_cast<uintptr_t>(r.a.base), r);
  m.quarantine_order.push_back(reinterpret_cast<uintptr_t>(r.a.base));
  m.quarantine_bytes += r.map_bytes;
  // Keep the most recent 1 GiB of freed address space unusable, then really unmap.
  while (m.quarantine_bytes > (size_t(1) << 30) && !m.quarantine_order.empty()) {
    auto q = m.quarantine.find(m.quarantine_order.front());
    m.quarantine_order.pop_front();
    if (q == m.quarantine.end()) continue;
    munmap(q->second.map, q->second.map_bytes);
    m.quarantine_bytes -= q->second.map_bytes;
    m.quarantine.erase(q);
  }
  return cudaSuccess;
}

}  // namespace

const Allocation* find_allocation(const void* p) {
  const Region* r = region_of(mem().live, p, false);
  return r ? &r->a : nullptr;
}

std::string describe_pointer(const void* p) {
  Memory& m = mem();
  if (!p) return "a null pointer";
  if (const Region* r = region_of(m.live, p, false)) return "byte " + std::to_string(static_cast<const char*>(p) - r->a.base) + " of " + describe(*r);
  if (const Region* r = region_of(m.live, p, true)) return "a pointer past the end of " + describe(*r);
  if (const Region* r = region_of(m.quarantine, p, true)) return "freed " + describe(*r) + " (freed by " + r->freed_by + ")";
  return "host memory (not from cudaMalloc)";
}

void require_device(const void* p, size_t bytes, const char* call, const char* role, bool allow_pinned) {
  if (!p && bytes == 0) return;
  const Region* r = region_of(mem().live, p, false);
  if (!r || (r->a.kind != MemKind::Device && !allow_pinned))
    fault(std::string(call) + ": " + role + " is " + describe_pointer(p) + ", not device memory");
  const size_t offset = static_cast<size_t>(static_cast<const char*>(p) - r->a.base);
  if (offset + bytes > r->a.bytes)
    fault(std::string(call) + ": " + role + " needs " + std::to_string(bytes) + " B from byte " +
          std::to_string(offset) + " of " + describe(*r) + ": past its end");
}

void check_canaries_of(const std::vector<const void*>& pointers, const char* when) {
  for (const void* p : pointers)
    if (const Region* r = region_of(mem().live, p, false)) check_canary(*r, when);
}

// ---- streams, events and the scheduler ----------------------------------------------------------

namespace {

constexpr uint32_t kStreamMagic = 0x5354524d, kEventMagic = 0x45564e54;

struct Op {
  enum Kind { Run, Async, Wait, Record } kind = Run;
  std::string what;
  std::function<void()> run;  // Run; Async: start
  std::function<bool()> done;  // Async
  bool started = false;
  CUevent_st* event = nullptr;  // Wait, Record
  uint64_t generation = 0;      // Wait: the record awaited; Record: this record
  uint64_t serial = 0;          // position in the stream (for synchronisation targets)
};

struct Capture;

}  // namespace
}  // namespace rd::emu

struct CUstream_st {
  uint32_t magic = rd::emu::kStreamMagic;
  int id = 0;
  bool destroyed = false;
  std::deque<rd::emu::Op> queue;
  uint64_t enqueued = 0, completed = 0;
  rd::emu::Capture* capture = nullptr;  // set while the stream captures: work is recorded, not queued
  size_t branch = 0;                    // its index among the capture's streams
};

struct CUevent_st {
  uint32_t magic = rd::emu::kEventMagic;
  int id = 0;
  bool destroyed = false;
  uint64_t recorded = 0;  // records enqueued so far (generation of the newest)
  // Last recorded inside a capture in progress: that capture and the record's slot in it.
  rd::emu::Capture* captured_in = nullptr;
  size_t captured_slot = 0;
  // Last recorded in a capture (ended or not): that record orders streams inside the graph
  // and records nothing the host can see, so the host may not wait for or time it (the
  // driver answers "invalid argument"; cudaEventRecordExternal is the way to do that).
  bool recorded_in_graph = false;
  // Records complete in any order when they sit on different streams; each wait
  // needs its own record (CUDA: the one most recent at cudaStreamWaitEvent time).
  uint64_t done_upto = 0;              // every generation <= this has completed
  std::set<uint64_t> done_beyond;      // completed generations above done_upto
  std::chrono::steady_clock::time_point when{};
  bool done(uint64_t generation) const {
    return generation <= done_upto || done_beyond.count(generation) != 0;
  }
  void complete(uint64_t generation) {
    done_beyond.insert(generation);
    while (done_beyond.count(done_upto + 1)) done_beyond.erase(++done_upto);
  }
};

namespace rd::emu {
namespace {

struct Scheduler {
  std::vector<CUstream_st*> streams;  // every stream ever created (never freed: stale handles stay checkable)
  std::vector<CUevent_st*> events;
  CUstream_st legacy;
  bool random = false;
  std::mt19937_64 rng;
  double hang_s = 120;
  Scheduler() {
    legacy.id = 0;
    streams.push_back(&legacy);
    const char* mode = std::getenv("RD_EMU_SCHEDULE");
    const std::string m = mode && *mode ? mode : "lazy";
    if (m == "random") random = true;
    else if (m != "lazy") fault("RD_EMU_SCHEDULE='" + m + "': use lazy or random");
    rng.seed(static_cast<uint64_t>(env_double("RD_EMU_SEED", 1)));
    hang_s = env_double("RD_EMU_HANG_S", 120);
  }
};

Scheduler& sched() {
  static Scheduler* s = new Scheduler;
  return *s;
}

CUstream_st* stream_of(cudaStream_t s, const char* call) {
  if (!s || s == cudaStreamLegacy) return &sched().legacy;
  if (s == cudaStreamPerThread) fault(std::string(call) + ": cudaStreamPerThread is not emulated");
  CUstream_st* st = s;
  auto& all = sched().streams;
  if (std::find(all.begin(), all.end(), st) == all.end())
    fault(std::string(call) + ": stream handle " + std::to_string(reinterpret_cast<uintptr_t>(s)) +
          " was never created by cudaStreamCreate");
  if (st->destroyed) fault(std::string(call) + ": stream #" + std::to_string(st->id) + " was destroyed by cudaStreamDestroy");
  return st;
}

CUevent_st* event_of(cudaEvent_t e, const char* call) {
  auto& all = sched().events;
  if (!e || std::find(all.begin(), all.end(), e) == all.end())
    fault(std::string(call) + ": event handle " + std::to_string(reinterpret_cast<uintptr_t>(e)) +
          " was never created by cudaEventCreate");
  if (e->destroyed) fault(std::string(call) + ": event #" + std::to_string(e->id) + " was destroyed by cudaEventDestroy");
  return e;
}

// ---- stream capture --------------------------------------------------------------------------
// A capture records the work issued to its streams in call order, each operation tagged
// with its branch (the origin stream is branch 0; a stream joins by waiting on an event
// recorded in the capture). Records and waits between branches become numbered slots,
// so a graph launch rebuilds the same fork and join on streams of its own. Call order
// is a valid order: a wait can only name a record issued before it.
struct GraphOp {
  Op::Kind kind = Op::Run;  // Run, Async, or Record/Wait of `slot`
  std::string what;
  std::function<void()> run;
  std::function<bool()> done;
  size_t branch = 0;
  size_t slot = 0;
  // Record only: an event recorded with cudaEventRecordExternal (an event record node).
  // Each launch records that event itself, so the host may query or time it afterwards.
  CUevent_st* external = nullptr;
};

struct Capture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  std::vector<CUstream_st*> branches;
  std::vector<size_t> work;                      // per branch: work operations recorded
  std::vector<std::vector<size_t>> clocks;       // per branch: how much of each branch's work precedes its tail
  std::vector<std::vector<size_t>> slot_clocks;  // per record slot: the recording branch's clock then
  std::vector<CUevent_st*> events;               // recorded in this capture
  std::vector<GraphOp> ops;
  bool invalidated = false;

  std::vector<size_t>& clock(size_t b) {
    clocks[b].resize(branches.size(), 0);
    return clocks[b];
  }
  void add_branch(CUstream_st* s) {
    s->capture = this;
    s->branch = branches.size();
    branches.push_back(s);
    work.push_back(0);
    clocks.emplace_back(branches.size(), 0);
  }
};

std::vector<Capture*>& captures() {  // in progress
  static auto* v = new std::vector<Capture*>;
  return *v;
}

// cudaThreadExchangeStreamCaptureMode: how this thread's unsafe calls meet other
// threads' captures.
thread_local cudaStreamCaptureMode t_capture_mode = cudaStreamCaptureModeGlobal;

void invalidate(Capture* c, const std::string& call) {
  if (c->invalidated) return;
  c->invalidated = true;
  note("capture invalidated by " + call);
}

// A potentially unsafe call (allocation, synchronisation, blocking or pageable copy)
// during captures: NVIDIA's interaction modes say which captures forbid it. Those are
// invalidated, and the call fails with cudaErrorStreamCaptureUnsupported, doing nothing.
bool forbidden_during_capture(const std::string& call) {
  bool forbidden = false;
  const auto me = std::this_thread::get_id();
  for (Capture* c : captures()) {
    const bool mine = c->thread == me;
    if ((mine && c->mode != cudaStreamCaptureModeRelaxed) ||
        (!mine && c->mode == cudaStreamCaptureModeGlobal && t_capture_mode == cudaStreamCaptureModeGlobal)) {
      invalidate(c, call);
      forbidden = true;
    }
  }
  return forbidden;
}

void capture_op(CUstream_st* s, Op op) {
  Capture* c = s->capture;
  if (c->invalidated) {  // the sequence is dead: its work is dropped (EndCapture reports it)
    set_error(cudaErrorStreamCaptureInvalidated);
    return;
  }
  GraphOp g;
  g.kind = op.kind;
  g.what = std::move(op.what);
  g.run = std::move(op.run);
  g.done = std::move(op.done);
  g.branch = s->branch;
  if (op.kind == Op::Record) g.external = op.event;  // ordinary records become slots instead
  c->ops.push_back(std::move(g));
  c->clock(s->branch)[s->branch] = ++c->work[s->branch];
}

// Ends the capture on every stream it joined; the caller owns `c` afterwards.
void end_capture(Capture* c) {
  for (CUstream_st* t : c->branches) t->capture = nullptr;
  for (CUevent_st* e : c->events)
    if (e->captured_in == c) e->captured_in = nullptr;
  auto& all = captures();
  all.erase(std::remove(all.begin(), all.end(), c), all.end());
}

uint64_t push(CUstream_st* s, Op op) {
  if (s->capture) {
    capture_op(s, std::move(op));
    return s->enqueued;
  }
  op.serial = ++s->enqueued;
  s->queue.push_back(std::move(op));
  return s->enqueued;
}

// Tries to complete the head of `s`; false when it is blocked (an unfinished
// event wait, or an asynchronous operation still in flight).
bool trace_ops() {
  static const bool on = [] {
    const char* v = std::getenv("RD_EMU_TRACE");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

bool step(CUstream_st* s) {
  Op& op = s->queue.front();
  // RD_EMU_TRACE=1: every operation as it runs (the order the scheduler chose).
  if (trace_ops() && !(op.kind == Op::Async && op.started))
    std::fprintf(stderr, "cuda-emu: trace: stream #%d: %s\n", s->id, op.what.c_str());
  switch (op.kind) {
    case Op::Wait:
      if (!op.event->done(op.generation)) return false;
      break;
    case Op::Record:
      op.event->complete(op.generation);
      op.event->when = std::chrono::steady_clock::now();
      break;
    case Op::Run:
      install_segv_handler();
      g_running_op_storage = op.what;
      g_running_op.store(g_running_op_storage.c_str());
      op.run();
      g_running_op.store(nullptr);
      break;
    case Op::Async:
      if (!op.started) {
        g_running_op_storage = op.what;
        g_running_op.store(g_running_op_storage.c_str());
        op.run();
        g_running_op.store(nullptr);
        op.started = true;
      }
      if (!op.done()) return false;
      break;
  }
  s->queue.pop_front();
  ++s->completed;
  return true;
}

// The stream whose progress `s` needs first: follows unfinished event waits to
// the stream holding the awaited record. Null on a cycle (a deadlock).
CUstream_st* blocker(CUstream_st* s) {
  std::set<CUstream_st*> seen;
  while (!s->queue.empty()) {
    const Op& head = s->queue.front();
    if (head.kind != Op::Wait || head.event->done(head.generation)) return s;
    if (!seen.insert(s).second) return nullptr;
    CUstream_st* holder = nullptr;
    for (CUstream_st* t : sched().streams)
      for (const Op& op : t->queue)
        if (op.kind == Op::Record && op.event == head.event && op.generation == head.generation) holder = t;
    if (!holder) return s;  // cannot happen: records precede the waits that capture them
    s = holder;
  }
  return s;
}

std::string pending_summary() {
  std::string out;
  for (CUstream_st* t : sched().streams)
    if (!t->queue.empty())
      out += " stream #" + std::to_string(t->id) + " (" + std::to_string(t->queue.size()) + " queued, head: " +
             t->queue.front().what + ");";
  return out;
}

// One step on every stream but `except` whose head can run; true if any progressed.
bool advance_others(CUstream_st* except) {
  bool any = false;
  for (CUstream_st* t : sched().streams) {
    if (t == except || t->queue.empty()) continue;
    const Op& h = t->queue.front();
    if (h.kind == Op::Wait && !h.event->done(h.generation)) continue;
    any = step(t) || any;
  }
  return any;
}

// Runs work until done() holds. `focus`: the stream the caller waits for (lazy mode
// runs only what it depends on); null: any stream with work.
template <class Pred> void run_until(Pred done, CUstream_st* focus, const char* call) {
  Scheduler& S = sched();
  const auto start = std::chrono::steady_clock::now();
  while (!done()) {
    CUstream_st* pick = nullptr;
    if (S.random) {
      std::vector<CUstream_st*> ready;
      for (CUstream_st* t : S.streams)
        if (!t->queue.empty()) {
          const Op& h = t->queue.front();
          if (h.kind != Op::Wait || h.event->done(h.generation)) ready.push_back(t);
        }
      if (!ready.empty()) pick = ready[S.rng() % ready.size()];
    } else {
      CUstream_st* from = focus && !focus->queue.empty() ? focus : nullptr;
      if (!from)
        for (CUstream_st* t : S.streams)
          if (!t->queue.empty()) {
            from = t;
            break;
          }
      if (from) {
        pick = blocker(from);
        if (!pick) fault(std::string(call) + ": streams wait for each other's events (deadlock):" + pending_summary());
      }
    }
    if (!pick) fault(std::string(call) + ": waits for work that can never run:" + pending_summary());
    if (step(pick)) continue;
    // Blocked on an operation in flight (a collective). A GPU would run the other
    // streams meanwhile, and a peer process may need one of their collectives to
    // finish ours: advance every other stream that can run.
    if (advance_others(pick)) continue;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > S.hang_s)
      fault(std::string(call) + ": device hang: no progress for " + std::to_string(S.hang_s) +
            " s (RD_EMU_HANG_S):" + pending_summary());
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void sync_stream(CUstream_st* s, const char* call) {
  const uint64_t target = s->enqueued;
  run_until([&] { return s->completed >= target; }, s, call);
}

}  // namespace

bool capture_forbids(const std::string& call) {
  std::lock_guard<std::recursive_mutex> lock(api_lock());
  return forbidden_during_capture(call);
}

void enqueue(cudaStream_t s, std::string what, std::function<void()> run) {
  std::lock_guard<std::recursive_mutex> lock(api_lock());
  Op op;
  op.kind = Op::Run;
  op.what = std::move(what);
  op.run = std::move(run);
  CUstream_st* st = stream_of(s, op.what.c_str());  // before op is moved from
  push(st, std::move(op));
}

void enqueue_async(cudaStream_t s, std::string what, std::function<void()> start, std::function<bool()> done) {
  std::lock_guard<std::recursive_mutex> lock(api_lock());
  Op op;
  op.kind = Op::Async;
  op.what = std::move(what);
  op.run = std::move(start);
  op.done = std::move(done);
  CUstream_st* st = stream_of(s, op.what.c_str());  // before op is moved from
  push(st, std::move(op));
}

void require_stream(cudaStream_t s, const char* call) {
  std::lock_guard<std::recursive_mutex> lock(api_lock());
  stream_of(s, call);
}

void synchronize_stream(cudaStream_t s) {
  std::lock_guard<std::recursive_mutex> lock(api_lock());
  sync_stream(stream_of(s, "synchronize_stream"), "synchronize_stream");
}

void set_last_error(cudaError_t e) { set_error(e); }

// ---- handles of the library stand-ins -------------------------------------------------------------

namespace {
struct HandleState {
  std::string kind;
  bool live = true;
};
std::unordered_map<const void*, HandleState>& handles() {
  static auto* h = new std::unordered_map<const void*, HandleState>;
  return *h;
}
}  // namespace

void register_handle(const void* h, const char* kind) {
  std::lock_guard<std::recursive_mutex> lock(api_lock());
  handles()[h] = HandleState{kind, true};
}

void retire_handle(const void* h, const char* kind, const char* call) {
  std::lock_guard<std::recursive_mutex> lock(api_lock());
  require_handle(h, kind, call);
  handles()[h].live = false;
}

void require_handle(const void* h, const char* kind, const char* call) {
  std::lock_guard<std::recursive_mutex> lock(api_lock());
  auto it = handles().find(h);
  if (it == handles().end() || it->second.kind != kind)
    fault(std::string(call) + ": " + kind + " handle was never created");
  if (!it->second.live) fault(std::string(call) + ": " + kind + " handle was already destroyed");
}

}  // namespace rd::emu

// ---- the runtime API ----------------------------------------------------------------------------------

using namespace rd::emu;
using Lock = std::lock_guard<std::recursive_mutex>;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return set_error(cudaErrorInvalidValue);
  *count = device_count();
  return *count == 0 ? set_error(cudaErrorNoDevice) : cudaSuccess;  // as the runtime answers
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return set_error(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return set_error(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return set_error(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count()) return set_error(cudaErrorInvalidDevice);
  const DeviceSpec& s = device_spec();
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "%s", s.name.c_str());
  prop->totalGlobalMem = s.total_bytes;
  prop->sharedMemPerBlock = s.shared_per_block;
  prop->warpSize = s.warp_size;
  prop->maxThreadsPerBlock = s.max_threads_per_block;
  for (int i = 0; i < 3; ++i) prop->maxThreadsDim[i] = s.max_block_dims[i], prop->maxGridSize[i] = s.max_grid_dims[i];
  prop->major = s.major;
  prop->minor = s.minor;
  prop->multiProcessorCount = s.multiprocessors;
  prop->unifiedAddressing = 1;
  // Distinct per physical GPU, so a rank's start-up line shows which one it got.
  prop->pciBusID = 0x10 + visible_devices()[static_cast<size_t>(device)];
  prop->canMapHostMemory = 1;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* v) {
  if (!v) return set_error(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* v) {
  if (!v) return set_error(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureMerge: return "cudaErrorStreamCaptureMerge";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    default: return "cudaError(emulated)";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences";
    case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit: return "the legacy stream would depend on a capturing blocking stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread: return "a thread-local capture ended from another thread";
    default: return "error (emulated device)";
  }
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  Lock lock(api_lock());
  count(Counter::Allocs);
  if (forbidden_during_capture("cudaMalloc")) return set_error(cudaErrorStreamCaptureUnsupported);
  return allocate(p, bytes, MemKind::Device, "cudaMalloc");
}

cudaError_t cudaFree(void* p) {
  Lock lock(api_lock());
  count(Counter::Frees);
  if (forbidden_during_capture("cudaFree")) return set_error(cudaErrorStreamCaptureUnsupported);
  // cudaFree synchronises the device first (documented), so queued work using p finishes.
  run_until([] {
    for (CUstream_st* t : sched().streams)
      if (!t->queue.empty()) return false;
    return true;
  }, nullptr, "cudaFree");
  return release(p, MemKind::Device, "cudaFree");
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  Lock lock(api_lock());
  count(Counter::Allocs);
  if (forbidden_during_capture("cudaMallocHost")) return set_error(cudaErrorStreamCaptureUnsupported);
  return allocate(p, bytes, MemKind::PinnedHost, "cudaMallocHost");
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  Lock lock(api_lock());
  count(Counter::Allocs);
  if (forbidden_during_capture("cudaHostAlloc")) return set_error(cudaErrorStreamCaptureUnsupported);
  return allocate(p, bytes, MemKind::PinnedHost, "cudaHostAlloc");
}

cudaError_t cudaFreeHost(void* p) {
  Lock lock(api_lock());
  count(Counter::Frees);
  if (forbidden_during_capture("cudaFreeHost")) return set_error(cudaErrorStreamCaptureUnsupported);
  run_until([] {
    for (CUstream_st* t : sched().streams)
      if (!t->queue.empty()) return false;
    return true;
  }, nullptr, "cudaFreeHost");
  return release(p, MemKind::PinnedHost, "cudaFreeHost");
}

cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b) {
  Lock lock(api_lock());
  if (!free_b || !total_b) return set_error(cudaErrorInvalidValue);
  const size_t total = device_spec().total_bytes, used = mem().device_used[current_device()];
  *total_b = total;
  *free_b = used < total ? total - used : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  Lock lock(api_lock());
  count(Counter::DeviceSync);
  if (forbidden_during_capture("cudaDeviceSynchronize")) return set_error(cudaErrorStreamCaptureUnsupported);
  run_until([] {
    for (CUstream_st* t : sched().streams)
      if (!t->queue.empty()) return false;
    return true;
  }, nullptr, "cudaDeviceSynchronize");
  return cudaSuccess;
}

// ---- streams ----

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  Lock lock(api_lock());
  if (!s) return set_error(cudaErrorInvalidValue);
  auto* st = new CUstream_st;  // never deleted: a stale handle must stay recognisable
  st->id = static_cast<int>(sched().streams.size());
  sched().streams.push_back(st);
  *s = st;
  (void)flags;  // every emulated stream is non-blocking: the legacy stream orders nothing implicitly
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  Lock lock(api_lock());
  CUstream_st* st = stream_of(s, "cudaStreamDestroy");
  if (st == &sched().legacy) fault("cudaStreamDestroy: the legacy stream cannot be destroyed");
  if (st->capture) invalidate(st->capture, "cudaStreamDestroy (of a capturing stream)");
  // Queued work still completes (documented); only new use is an error.
  st->destroyed = true;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Lock lock(api_lock());
  count(Counter::StreamSync);
  CUstream_st* st = stream_of(s, "cudaStreamSynchronize");
  if (st->capture) {  // waits for work that does not run: conflicts with capture in every mode
    invalidate(st->capture, "cudaStreamSynchronize");
    return set_error(cudaErrorStreamCaptureUnsupported);
  }
  if (forbidden_during_capture("cudaStreamSynchronize")) return set_error(cudaErrorStreamCaptureUnsupported);
  sync_stream(st, "cudaStreamSynchronize");
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  query_started(s);  // before the lock: waiting for another thread's call is emulated device time
  Lock lock(api_lock());
  CUstream_st* st = stream_of(s, "cudaStreamQuery");
  if (st->capture) {
    invalidate(st->capture, "cudaStreamQuery");
    return set_error(cudaErrorStreamCaptureUnsupported);
  }
  if (forbidden_during_capture("cudaStreamQuery")) return set_error(cudaErrorStreamCaptureUnsupported);
  // A query lets the device run whatever the stream needs and can run now; work
  // blocked on a collective in flight stays pending: cudaErrorNotReady.
  const uint64_t target = st->enqueued;
  while (st->completed < target) {
    CUstream_st* pick = blocker(st);
    if (!pick) fault("cudaStreamQuery: streams wait for each other's events (deadlock):" + pending_summary());
    if (!step(pick)) {
      advance_others(pick);  // as run_until: the device does not idle while the host polls
      query_not_ready(s);
      return cudaErrorNotReady;
    }
  }
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  Lock lock(api_lock());
  CUstream_st* st = stream_of(s, "cudaStreamWaitEvent");
  CUevent_st* ev = event_of(e, "cudaStreamWaitEvent");
  (void)flags;
  if (Capture* c = ev->captured_in) {
    // An event recorded in a capture: the waiting stream joins that capture (a fork),
    // or, already in it, depends on the record (a join).
    if (st->capture && st->capture != c) {
      invalidate(st->capture, "cudaStreamWaitEvent (on an event of another capture)");
      return set_error(cudaErrorStreamCaptureMerge);
    }
    if (c->invalidated) return set_error(cudaErrorStreamCaptureInvalidated);
    if (st == &sched().legacy) {
      invalidate(c, "cudaStreamWaitEvent (the legacy stream cannot join a capture)");
      return set_error(cudaErrorStreamCaptureImplicit);
    }
    if (!st->capture) c->add_branch(st);
    std::vector<size_t>& mine = c->clock(st->branch);
    const std::vector<size_t>& theirs = c->slot_clocks[ev->captured_slot];
    for (size_t k = 0; k < theirs.size(); ++k) mine[k] = std::max(mine[k], theirs[k]);
    GraphOp g;
    g.kind = Op::Wait;
    g.what = "cudaStreamWaitEvent(event #" + std::to_string(ev->id) + ")";
    g.branch = st->branch;
    g.slot = ev->captured_slot;
    c->ops.push_back(std::move(g));
    return cudaSuccess;
  }
  if (ev->recorded == 0) return cudaSuccess;  // never recorded: nothing to wait for (documented)
  if (st->capture) {
    // Only in-stream order may cross into a capture; a graph cannot wait for outside work.
    invalidate(st->capture, "cudaStreamWaitEvent (on an event recorded outside the capture)");
    return set_error(cudaErrorStreamCaptureIsolation);
  }
  Op op;
  op.kind = Op::Wait;
  op.what = "cudaStreamWaitEvent(event #" + std::to_string(ev->id) + ")";
  op.event = ev;
  op.generation = ev->recorded;  // the most recent record at the time of the call
  push(st, std::move(op));
  return cudaSuccess;
}

// ---- events ----

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  Lock lock(api_lock());
  if (!e) return set_error(cudaErrorInvalidValue);
  auto* ev = new CUevent_st;  // never deleted, as streams
  ev->id = static_cast<int>(sched().events.size()) + 1;
  sched().events.push_back(ev);
  *e = ev;
  (void)flags;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  Lock lock(api_lock());
  event_of(e, "cudaEventDestroy")->destroyed = true;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  Lock lock(api_lock());
  CUevent_st* ev = event_of(e, "cudaEventRecord");
  CUstream_st* st = stream_of(s, "cudaEventRecord");
  if (Capture* c = st->capture) {
    if (c->invalidated) return set_error(cudaErrorStreamCaptureInvalidated);
    ev->captured_in = c;
    ev->recorded_in_graph = true;
    ev->captured_slot = c->slot_clocks.size();
    c->slot_clocks.push_back(c->clock(st->branch));
    c->events.push_back(ev);
    GraphOp g;
    g.kind = Op::Record;
    g.what = "cudaEventRecord(event #" + std::to_string(ev->id) + ")";
    g.branch = st->branch;
    g.slot = ev->captured_slot;
    c->ops.push_back(std::move(g));
    return cudaSuccess;
  }
  ev->captured_in = nullptr;  // this record replaces one made in a capture
  ev->recorded_in_graph = false;
  Op op;
  op.kind = Op::Record;
  op.what = "cudaEventRecord(event #" + std::to_string(ev->id) + ")";
  op.event = ev;
  op.generation = ++ev->recorded;
  push(st, std::move(op));
  return cudaSuccess;
}

// cudaEventRecordExternal: inside a capture an event record node (each launch records the
// event, which the host may then query, wait for or time); the flag is invalid outside one.
cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int flags) {
  if (!(flags & cudaEventRecordExternal)) return cudaEventRecord(e, s);
  Lock lock(api_lock());
  CUevent_st* ev = event_of(e, "cudaEventRecordWithFlags");
  CUstream_st* st = stream_of(s, "cudaEventRecordWithFlags");
  if (!st->capture) return set_error(cudaErrorInvalidValue);
  if (st->capture->invalidated) return set_error(cudaErrorStreamCaptureInvalidated);
  ev->recorded_in_graph = false;
  Op op;
  op.kind = Op::Record;
  op.what = "cudaEventRecordWithFlags(event #" + std::to_string(ev->id) + ", external)";
  op.event = ev;
  capture_op(st, std::move(op));
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  query_started(e);
  Lock lock(api_lock());
  CUevent_st* ev = event_of(e, "cudaEventQuery");
  if (ev->captured_in) {  // its work is not scheduled to run: conflicts in every mode
    invalidate(ev->captured_in, "cudaEventQuery");
    return set_error(cudaErrorCapturedEvent);
  }
  if (forbidden_during_capture("cudaEventQuery")) return set_error(cudaErrorStreamCaptureUnsupported);
  if (ev->recorded_in_graph) return set_error(cudaErrorInvalidValue);
  const uint64_t target = ev->recorded;
  while (!ev->done(target)) {
    CUstream_st* holder = nullptr;
    for (CUstream_st* t : sched().streams)
      for (const Op& op : t->queue)
        if (op.kind == Op::Record && op.event == ev && op.generation == target) holder = t;
    if (!holder) break;
    CUstream_st* pick = blocker(holder);
    if (!pick) fault("cudaEventQuery: streams wait for each other's events (deadlock):" + pending_summary());
    if (!step(pick)) {
      advance_others(pick);
      query_not_ready(e);
      return cudaErrorNotReady;
    }
  }
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  Lock lock(api_lock());
  count(Counter::EventSync);
  CUevent_st* ev = event_of(e, "cudaEventSynchronize");
  if (ev->captured_in) {
    invalidate(ev->captured_in, "cudaEventSynchronize");
    return set_error(cudaErrorCapturedEvent);
  }
  if (forbidden_during_capture("cudaEventSynchronize")) return set_error(cudaErrorStreamCaptureUnsupported);
  if (ev->recorded_in_graph) return set_error(cudaErrorInvalidValue);
  const uint64_t target = ev->recorded;
  CUstream_st* holder = nullptr;
  for (CUstream_st* t : sched().streams)
    for (const Op& op : t->queue)
      if (op.kind == Op::Record && op.event == ev && op.generation == target) holder = t;
  run_until([&] { return ev->done(target); }, holder, "cudaEventSynchronize");
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Lock lock(api_lock());
  CUevent_st* a = event_of(start, "cudaEventElapsedTime");
  CUevent_st* b = event_of(end, "cudaEventElapsedTime");
  if (!ms || a->recorded_in_graph || b->recorded_in_graph) return set_error(cudaErrorInvalidValue);
  if (!a->done(a->recorded) || !b->done(b->recorded)) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
  return cudaSuccess;
}

}  // extern "C"

// ---- copies ----

namespace {

void memset_on(void* p, int value, size_t bytes, cudaStream_t s, const char* call) {
  require_device(p, bytes, call, "destination");
  if (!bytes) return;
  enqueue(s, call, [p, value, bytes] { std::memset(p, value, bytes); });
}

// The copy of cudaMemcpyAsync; `blocking`: cudaMemcpy's (which counts as a blocking
// copy and then waits itself, not as a pageable one).
cudaError_t memcpy_on(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s, bool blocking) {
  CUstream_st* st = stream_of(s, blocking ? "cudaMemcpy" : "cudaMemcpyAsync");
  if (!bytes) return cudaSuccess;
  const Allocation* da = find_allocation(dst);
  const Allocation* sa = find_allocation(src);
  const bool dst_dev = da && da->kind == MemKind::Device, src_dev = sa && sa->kind == MemKind::Device;
  if (kind == cudaMemcpyDefault) {
    kind = dst_dev ? (src_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                   : (src_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  const char* name = kind == cudaMemcpyHostToDevice   ? "cudaMemcpyAsync(HostToDevice)"
                     : kind == cudaMemcpyDeviceToHost ? "cudaMemcpyAsync(DeviceToHost)"
                     : kind == cudaMemcpyDeviceToDevice ? "cudaMemcpyAsync(DeviceToDevice)"
                                                        : "cudaMemcpyAsync(HostToHost)";
  // The direction must match the pointers: a wrong one is a silent corruption or a
  // crash on some systems, so it is a fault here.
  auto must_be_host = [&](const void* p, const Allocation* a, const char* role) {
    if (a && a->kind == MemKind::Device)
      fault(std::string(name) + ": " + role + " is " + describe_pointer(p) + ", but the direction says host memory");
    if (!a && describe_pointer(p).rfind("freed", 0) == 0)
      fault(std::string(name) + ": " + role + " is " + describe_pointer(p));
  };
  const bool pinned_src = sa && sa->kind == MemKind::PinnedHost, pinned_dst = da && da->kind == MemKind::PinnedHost;
  // A pageable host side makes the asynchronous call wait or stage on the host.
  const bool pageable = (kind == cudaMemcpyHostToDevice && !pinned_src) ||
                        (kind == cudaMemcpyDeviceToHost && !pinned_dst) ||
                        (kind == cudaMemcpyHostToHost && !(pinned_src && pinned_dst));
  if (pageable && !blocking) {
    count(Counter::PageableCopy);
    // The host side is read or written at the call (staged, or waited for): a graph
    // replaying it later could not, so it conflicts with a capture of its stream.
    if (st->capture) {
      invalidate(st->capture, "cudaMemcpyAsync (pageable host memory)");
      return set_error(cudaErrorStreamCaptureUnsupported);
    }
    if (forbidden_during_capture("cudaMemcpyAsync (pageable host memory)"))
      return set_error(cudaErrorStreamCaptureUnsupported);
  }
  switch (kind) {
    case cudaMemcpyHostToDevice: {
      require_device(dst, bytes, name, "dst");
      must_be_host(src, sa, "src");
      if (pinned_src) {
        enqueue(s, name, [dst, src, bytes] { std::memcpy(dst, src, bytes); });
      } else {
        // Pageable source: staged before the call returns (documented), so the
        // caller may reuse it at once; the device writes dst later.
        auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                          static_cast<const char*>(src) + bytes);
        enqueue(s, name, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
      }
      return cudaSuccess;
    }
    case cudaMemcpyDeviceToHost: {
      require_device(src, bytes, name, "src");
      must_be_host(dst, da, "dst");
      enqueue(s, name, [dst, src, bytes] { std::memcpy(dst, src, bytes); });
      // Pageable destination: the call returns only once the copy is done (documented).
      if (!pinned_dst) sync_stream(st, name);
      return cudaSuccess;
    }
    case cudaMemcpyDeviceToDevice:
      require_device(src, bytes, name, "src");
      require_device(dst, bytes, name, "dst");
      enqueue(s, name, [dst, src, bytes] { std::memmove(dst, src, bytes); });
      return cudaSuccess;
    case cudaMemcpyHostToHost:
      must_be_host(src, sa, "src");
      must_be_host(dst, da, "dst");
      enqueue(s, name, [dst, src, bytes] { std::memmove(dst, src, bytes); });
      if (!pinned_dst) sync_stream(st, name);
      return cudaSuccess;
    default:
      return set_error(cudaErrorInvalidMemcpyDirection);
  }
}

}  // namespace

extern "C" {

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  Lock lock(api_lock());
  memset_on(p, value, bytes, s, "cudaMemsetAsync");
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  Lock lock(api_lock());
  count(Counter::BlockingCopy);
  if (forbidden_during_capture("cudaMemset")) return set_error(cudaErrorStreamCaptureUnsupported);
  memset_on(p, value, bytes, nullptr, "cudaMemset");
  sync_stream(&sched().legacy, "cudaMemset");
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  Lock lock(api_lock());
  return memcpy_on(dst, src, bytes, kind, s, false);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  Lock lock(api_lock());
  count(Counter::BlockingCopy);
  if (forbidden_during_capture("cudaMemcpy")) return set_error(cudaErrorStreamCaptureUnsupported);
  const cudaError_t e = memcpy_on(dst, src, bytes, kind, nullptr, true);
  if (e == cudaSuccess) sync_stream(&sched().legacy, "cudaMemcpy");
  return e;
}

}  // extern "C"

// ---- stream capture and graphs ------------------------------------------------------------------

struct CUgraph_st {
  bool destroyed = false;
  std::shared_ptr<const std::vector<GraphOp>> ops;
  size_t branches = 1, slots = 0;
};

// An executable graph owns a stream per side branch and an event per record slot, made
// once at instantiation (never freed, as all streams); `finished` orders its launches.
struct CUgraphExec_st {
  int id = 0;
  bool destroyed = false;
  std::shared_ptr<const std::vector<GraphOp>> ops;
  std::vector<CUstream_st*> side;
  std::vector<CUevent_st*> slot_events;
  CUevent_st* finished = nullptr;
};

namespace {

std::vector<CUgraph_st*>& graphs() {  // every graph ever made: a stale handle stays recognisable
  static auto* v = new std::vector<CUgraph_st*>;
  return *v;
}
std::vector<CUgraphExec_st*>& graph_execs() {
  static auto* v = new std::vector<CUgraphExec_st*>;
  return *v;
}

CUgraph_st* graph_of(cudaGraph_t g, const char* call) {
  auto& all = graphs();
  if (!g || std::find(all.begin(), all.end(), g) == all.end())
    fault(std::string(call) + ": graph handle was never created by cudaStreamEndCapture");
  if (g->destroyed) fault(std::string(call) + ": graph was destroyed by cudaGraphDestroy");
  return g;
}

CUgraphExec_st* exec_of(cudaGraphExec_t g, const char* call) {
  auto& all = graph_execs();
  if (!g || std::find(all.begin(), all.end(), g) == all.end())
    fault(std::string(call) + ": executable graph handle was never created by cudaGraphInstantiate");
  if (g->destroyed)
    fault(std::string(call) + ": executable graph #" + std::to_string(g->id) +
          " was destroyed by cudaGraphExecDestroy");
  return g;
}

CUevent_st* internal_event() {
  auto* ev = new CUevent_st;
  ev->id = static_cast<int>(sched().events.size()) + 1;
  sched().events.push_back(ev);
  return ev;
}

}  // namespace

extern "C" {

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  Lock lock(api_lock());
  if (!mode || (*mode != cudaStreamCaptureModeGlobal && *mode != cudaStreamCaptureModeThreadLocal &&
                *mode != cudaStreamCaptureModeRelaxed))
    return set_error(cudaErrorInvalidValue);
  std::swap(*mode, t_capture_mode);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  Lock lock(api_lock());
  CUstream_st* st = stream_of(s, "cudaStreamBeginCapture");
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return set_error(cudaErrorInvalidValue);
  if (st == &sched().legacy) return set_error(cudaErrorStreamCaptureUnsupported);  // documented
  if (st->capture) return set_error(cudaErrorIllegalState);
  auto* c = new Capture;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->add_branch(st);
  captures().push_back(c);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  Lock lock(api_lock());
  CUstream_st* st = stream_of(s, "cudaStreamIsCapturing");
  if (!status) return set_error(cudaErrorInvalidValue);
  *status = !st->capture               ? cudaStreamCaptureStatusNone
            : st->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                       : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  Lock lock(api_lock());
  CUstream_st* st = stream_of(s, "cudaStreamEndCapture");
  if (!graph) return set_error(cudaErrorInvalidValue);
  *graph = nullptr;
  Capture* c = st->capture;
  if (!c) return set_error(cudaErrorIllegalState);
  if (c->branches[0] != st) {
    invalidate(c, "cudaStreamEndCapture (on a stream that joined the capture, not the one that began it)");
    return set_error(cudaErrorStreamCaptureUnmatched);
  }
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
    return set_error(cudaErrorStreamCaptureWrongThread);  // the capture goes on
  end_capture(c);
  std::unique_ptr<Capture> owned(c);
  if (c->invalidated) return set_error(cudaErrorStreamCaptureInvalidated);
  // Every stream that joined must have rejoined: the origin's tail must follow all work.
  const std::vector<size_t>& origin = c->clock(0);
  for (size_t b = 1; b < c->branches.size(); ++b)
    if (origin[b] < c->work[b]) {
      note("cudaStreamEndCapture: stream #" + std::to_string(c->branches[b]->id) +
           " joined the capture and its work was not joined back into the origin stream");
      return set_error(cudaErrorStreamCaptureUnjoined);
    }
  auto* g = new CUgraph_st;
  g->ops = std::make_shared<const std::vector<GraphOp>>(std::move(c->ops));
  g->branches = c->branches.size();
  g->slots = c->slot_clocks.size();
  graphs().push_back(g);
  *graph = g;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  Lock lock(api_lock());
  CUgraph_st* g = graph_of(graph, "cudaGraphInstantiate");
  if (!exec) return set_error(cudaErrorInvalidValue);
  (void)flags;  // no memory nodes, uploads or device launches here: nothing depends on them
  auto* x = new CUgraphExec_st;
  x->id = static_cast<int>(graph_execs().size()) + 1;
  x->ops = g->ops;
  for (size_t b = 1; b < g->branches; ++b) {
    auto* t = new CUstream_st;
    t->id = static_cast<int>(sched().streams.size());
    sched().streams.push_back(t);
    x->side.push_back(t);
  }
  for (size_t k = 0; k < g->slots; ++k) x->slot_events.push_back(internal_event());
  x->finished = internal_event();
  graph_execs().push_back(x);
  *exec = x;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  return cudaGraphInstantiate(exec, graph, flags);
}

// The recorded work, queued again in call order: branch 0 on `s`, the side branches on
// the graph's own streams, the records and waits between them on its own events. Work
// keeps the addresses and host scalars it was captured with, and reads device memory
// when it runs.
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  Lock lock(api_lock());
  CUgraphExec_st* x = exec_of(exec, "cudaGraphLaunch");
  CUstream_st* st = stream_of(s, "cudaGraphLaunch");
  if (st->capture) {
    invalidate(st->capture, "cudaGraphLaunch (into a capturing stream: child graphs are not emulated)");
    return set_error(cudaErrorStreamCaptureUnsupported);
  }
  count(Counter::GraphLaunches);
  const std::string tag = "graph #" + std::to_string(x->id) + ": ";
  auto wait_for = [&](CUstream_st* t, CUevent_st* ev, const std::string& what) {
    Op op;
    op.kind = Op::Wait;
    op.what = tag + what;
    op.event = ev;
    op.generation = ev->recorded;
    push(t, std::move(op));
  };
  auto record = [&](CUstream_st* t, CUevent_st* ev, const std::string& what) {
    Op op;
    op.kind = Op::Record;
    op.what = tag + what;
    op.event = ev;
    op.generation = ++ev->recorded;
    push(t, std::move(op));
  };
  // One launch of a graph at a time (documented): this one starts after the previous.
  if (x->finished->recorded) wait_for(st, x->finished, "the previous launch");
  for (const GraphOp& g : *x->ops) {
    CUstream_st* t = g.branch == 0 ? st : x->side[g.branch - 1];
    switch (g.kind) {
      case Op::Record:
        record(t, g.external ? g.external : x->slot_events[g.slot], g.what);
        break;
      case Op::Wait:
        wait_for(t, x->slot_events[g.slot], g.what);
        break;
      case Op::Run:
      case Op::Async: {
        Op op;
        op.kind = g.kind;
        op.what = tag + g.what;
        op.run = g.run;
        op.done = g.done;
        push(t, std::move(op));
        break;
      }
    }
  }
  record(st, x->finished, "end");
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  Lock lock(api_lock());
  exec_of(exec, "cudaGraphExecDestroy")->destroyed = true;  // launched work still completes
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  Lock lock(api_lock());
  graph_of(graph, "cudaGraphDestroy")->destroyed = true;  // its executable graphs stay usable
  return cudaSuccess;
}

}  // extern "C"
