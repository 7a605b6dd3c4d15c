// Kernel execution on the emulated device: the launch check, then, when the stream
// reaches the launch, every block of the grid as a team of fibers (one per CUDA
// thread) on the host thread that runs the device.
//
// Fibers switch with a few instructions (rd_emu_swap below, x86-64 System V), so a
// thread that never waits costs two switches and a stack from the pool; a block of
// 256 threads meeting at __syncthreads holds 256 stacks. Threads run in reverse
// order and blocks in reverse order (random ones under RD_EMU_SCHEDULE=random), so
// code that assumes an order the hardware does not promise gives wrong results.
#include "cuda_emu/device.h"

#include <sys/mman.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <unordered_map>

#include "cuda_emu/emu.h"
#include "cuda_emu/internal.h"

#if !defined(__x86_64__)
#error "the emulated CUDA device's fibers are written for x86-64"
#endif

// Saves the callee-saved registers and the FPU/SSE control words on the current
// stack, stores the stack pointer in *save, switches to `to` and restores its state.
extern "C" void rd_emu_swap(void** save, void* to);
extern "C" void rd_emu_fiber_entry();
asm(R"(
  .pushsection .text
  .globl rd_emu_swap
  .type rd_emu_swap, @function
rd_emu_swap:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  fnstcw (%rsp)
  stmxcsr 8(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  fldcw (%rsp)
  ldmxcsr 8(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size rd_emu_swap, .-rd_emu_swap
  .popsection
)");

namespace rd::emu {
namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr int kWarp = 32;

struct Fiber {
  enum State { Ready, AtBlockBarrier, AtWarpBarrier, Done };
  void* sp = nullptr;
  char* stack = nullptr;
  uint3 tid{};
  int linear = 0;
  State state = Ready;
  unsigned mask = 0;  // at a warp barrier: the lanes it waits for
  const char* op = nullptr;
};

struct Team {
  const char* kernel = nullptr;
  dim3 grid, block;
  uint3 bidx{};
  std::vector<Fiber> fibers;
  std::vector<uint64_t> slots;  // per thread: what it offers to a warp operation
  void* scheduler_sp = nullptr;
  Fiber* current = nullptr;
  const std::function<void()>* body = nullptr;
};

Team* g_team = nullptr;
std::vector<char*> g_stacks;  // free fiber stacks

char* take_stack() {
  if (!g_stacks.empty()) {
    char* s = g_stacks.back();
    g_stacks.pop_back();
    return s;
  }
  const size_t guard = 4096;
  void* m = mmap(nullptr, kStackBytes + guard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) fault("cannot map a fiber stack");
  mprotect(m, guard, PROT_NONE);  // overflow: a SIGSEGV, not silent corruption
  return static_cast<char*>(m) + guard;
}

void prepare(Fiber& f) {
  f.stack = take_stack();
  auto* sp = reinterpret_cast<uint64_t*>(f.stack + kStackBytes);
  *--sp = 0;  // the entry's "return address": it never returns
  *--sp = reinterpret_cast<uint64_t>(&rd_emu_fiber_entry);
  for (int i = 0; i < 6; ++i) *--sp = 0;  // rbp rbx r12-r15
  sp -= 2;
  sp[0] = 0x037F;  // x87 control word: the default
  sp[1] = 0x1F80;  // MXCSR: the default (no flush-to-zero, as CUDA without -ftz)
  f.sp = sp;
}

void yield_to_scheduler() {
  Team& t = *g_team;
  rd_emu_swap(&t.current->sp, t.scheduler_sp);
}

[[noreturn]] void team_fault(const std::string& what) {
  const Team& t = *g_team;
  fault("kernel " + std::string(t.kernel) + ", block (" + std::to_string(t.bidx.x) + "," +
        std::to_string(t.bidx.y) + "," + std::to_string(t.bidx.z) + "): " + what);
}

bool random_order() {
  static const bool r = [] {
    const char* v = std::getenv("RD_EMU_SCHEDULE");
    return v && std::string(v) == "random";
  }();
  return r;
}

std::mt19937_64& order_rng() {
  static std::mt19937_64 rng(7);
  return rng;
}

std::vector<int> adversarial_order(int n) {
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (random_order())
    std::shuffle(order.begin(), order.end(), order_rng());
  else
    std::reverse(order.begin(), order.end());
  return order;
}

void release_warp_barriers(Team& t, bool& released) {
  const int n = static_cast<int>(t.fibers.size());
  for (int base = 0; base < n; base += kWarp) {
    const int end = std::min(n, base + kWarp);
    bool any = false, all = true;
    unsigned mask = 0;
    for (int i = base; i < end; ++i)
      if (t.fibers[static_cast<size_t>(i)].state == Fiber::AtWarpBarrier) {
        any = true;
        mask |= t.fibers[static_cast<size_t>(i)].mask;
      }
    if (!any) continue;
    for (int lane = 0; lane < end - base; ++lane) {
      if (!(mask >> lane & 1u)) continue;
      const Fiber& f = t.fibers[static_cast<size_t>(base + lane)];
      if (f.state == Fiber::Done)
        team_fault("warp operation's mask names lane " + std::to_string(lane) + " of warp " +
                   std::to_string(base / kWarp) + ", which has exited");
      if (f.state != Fiber::AtWarpBarrier) all = false;
    }
    if (!all) continue;
    for (int i = base; i < end; ++i)
      if (t.fibers[static_cast<size_t>(i)].state == Fiber::AtWarpBarrier) t.fibers[static_cast<size_t>(i)].state = Fiber::Ready;
    released = true;
  }
}

void run_block(Team& t, const std::vector<int>& thread_order) {
  const int n = static_cast<int>(t.fibers.size());
  const unsigned bx = t.block.x, by = t.block.y;
  for (int i = 0; i < n; ++i) {
    Fiber& f = t.fibers[static_cast<size_t>(i)];
    f = Fiber{};
    f.linear = i;
    f.tid = uint3{static_cast<unsigned>(i) % bx, (static_cast<unsigned>(i) / bx) % by, static_cast<unsigned>(i) / (bx * by)};
  }
  int done = 0;
  for (;;) {
    bool ran = false;
    for (int i : thread_order) {
      Fiber& f = t.fibers[static_cast<size_t>(i)];
      if (f.state != Fiber::Ready) continue;
      if (!f.stack) prepare(f);
      t.current = &f;
      rd_emu_swap(&t.scheduler_sp, f.sp);
      ran = true;
      if (f.state == Fiber::Done) {
        g_stacks.push_back(f.stack);  // we are off its stack now
        f.stack = nullptr;
        ++done;
      }
    }
    if (done == n) return;
    bool released = false;
    bool all_at_block = true, any_at_block = false;
    for (const Fiber& f : t.fibers) {
      if (f.state == Fiber::AtBlockBarrier) any_at_block = true;
      if (f.state == Fiber::Ready || f.state == Fiber::AtWarpBarrier) all_at_block = false;
    }
    if (any_at_block && all_at_block) {
      // Threads that exited never arrive: __syncthreads in code not every thread
      // reaches is undefined (CUDA Programming Guide), however it happens to behave.
      if (done > 0)
        team_fault("__syncthreads reached while " + std::to_string(done) +
                   " threads of the block have exited: a barrier in divergent code");
      for (Fiber& f : t.fibers)
        if (f.state == Fiber::AtBlockBarrier) f.state = Fiber::Ready;
      released = true;
    }
    release_warp_barriers(t, released);
    if (!ran && !released) {
      int at_block = 0, at_warp = 0;
      for (const Fiber& f : t.fibers) at_block += f.state == Fiber::AtBlockBarrier, at_warp += f.state == Fiber::AtWarpBarrier;
      team_fault("threads wait at barriers that can never open (" + std::to_string(at_block) +
                 " at __syncthreads, " + std::to_string(at_warp) + " at a warp operation, " +
                 std::to_string(done) + " exited): a barrier in divergent code");
    }
  }
}

// Kernels that never met a barrier or warp operation in their first launch run
// their threads straight on the host stack (no fibers: ~10x faster on large
// element-wise launches); RD_EMU_FIBERS=always keeps every launch on fibers.
struct KernelTraits {
  bool seen = false;
  bool cooperative = false;
};
std::unordered_map<std::string, KernelTraits>& traits() {
  static auto* t = new std::unordered_map<std::string, KernelTraits>;
  return *t;
}
bool always_fibers() {
  static const bool a = [] {
    const char* v = std::getenv("RD_EMU_FIBERS");
    return v && std::string(v) == "always";
  }();
  return a;
}
bool g_cooperative_seen = false;  // set by any barrier or warp operation
bool g_direct = false;            // the running launch has no fibers

void run_block_direct(Team& t, const std::vector<int>& thread_order) {
  const unsigned bx = t.block.x, by = t.block.y;
  Fiber f;
  t.current = &f;
  for (int i : thread_order) {
    f.linear = i;
    f.tid = uint3{static_cast<unsigned>(i) % bx, (static_cast<unsigned>(i) / bx) % by,
                  static_cast<unsigned>(i) / (bx * by)};
    (*t.body)();
  }
}

void run_grid(const char* kernel, dim3 grid, dim3 block, const std::function<void()>& body) {
  Team t;
  t.kernel = kernel;
  t.grid = grid;
  t.block = block;
  t.body = &body;
  const int n = static_cast<int>(block.x * block.y * block.z);
  t.fibers.resize(static_cast<size_t>(n));
  t.slots.assign(static_cast<size_t>(n), 0);
  const std::vector<int> thread_order = adversarial_order(n);
  const int64_t blocks = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  Team* outer = g_team;
  g_team = &t;
  const bool shuffle = random_order();
  std::vector<int64_t> block_order;
  if (shuffle) {
    block_order.resize(static_cast<size_t>(blocks));
    std::iota(block_order.begin(), block_order.end(), 0);
    std::shuffle(block_order.begin(), block_order.end(), order_rng());
  }
  KernelTraits& kt = traits()[kernel];
  g_direct = kt.seen && !kt.cooperative && !always_fibers();
  g_cooperative_seen = false;
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t b = shuffle ? block_order[static_cast<size_t>(k)] : blocks - 1 - k;
    t.bidx = uint3{static_cast<unsigned>(b % grid.x), static_cast<unsigned>((b / grid.x) % grid.y),
                   static_cast<unsigned>(b / (static_cast<int64_t>(grid.x) * grid.y))};
    if (g_direct)
      run_block_direct(t, thread_order);
    else
      run_block(t, thread_order);
  }
  kt.seen = true;
  kt.cooperative = kt.cooperative || g_cooperative_seen;
  g_direct = false;
  g_team = outer;
}

void cooperative_call(const char* op) {
  g_cooperative_seen = true;
  if (g_direct)
    team_fault(std::string(op) + " in a launch run without fibers: its earlier launches never used a barrier "
               "or warp operation (run with RD_EMU_FIBERS=always)");
}

void warp_barrier(unsigned mask, const char* op) {
  cooperative_call(op);
  Fiber& f = *g_team->current;
  const unsigned lane = static_cast<unsigned>(f.linear % kWarp);
  if (!(mask >> lane & 1u))
    team_fault(std::string(op) + " called by lane " + std::to_string(lane) + ", which its mask does not name");
  f.state = Fiber::AtWarpBarrier;
  f.mask = mask;
  f.op = op;
  yield_to_scheduler();
}

}  // namespace

const uint3& thread_idx() { return g_team->current->tid; }
const uint3& block_idx() { return g_team->bidx; }
const dim3& block_dim() { return g_team->block; }
const dim3& grid_dim() { return g_team->grid; }
int lane_id() { return g_team->current->linear % kWarp; }

void sync_threads() {
  cooperative_call("__syncthreads");
  Fiber& f = *g_team->current;
  f.state = Fiber::AtBlockBarrier;
  yield_to_scheduler();
}

uint64_t warp_shuffle(unsigned mask, uint64_t value, int src_lane, const char* op) {
  Team& t = *g_team;
  Fiber& f = *t.current;
  const int base = f.linear - f.linear % kWarp;
  t.slots[static_cast<size_t>(f.linear)] = value;
  warp_barrier(mask, op);
  uint64_t out = value;
  const int src = base + src_lane;
  if (src_lane >= 0 && src_lane < kWarp && src < static_cast<int>(t.fibers.size()) && (mask >> src_lane & 1u))
    out = t.slots[static_cast<size_t>(src)];
  warp_barrier(mask, op);  // nobody offers again before every lane has read
  return out;
}

unsigned warp_ballot(unsigned mask, bool pred, const char* op) {
  Team& t = *g_team;
  Fiber& f = *t.current;
  const int base = f.linear - f.linear % kWarp;
  t.slots[static_cast<size_t>(f.linear)] = pred ? 1 : 0;
  warp_barrier(mask, op);
  unsigned bits = 0;
  for (int lane = 0; lane < kWarp && base + lane < static_cast<int>(t.fibers.size()); ++lane)
    if ((mask >> lane & 1u) && t.slots[static_cast<size_t>(base + lane)]) bits |= 1u << lane;
  warp_barrier(mask, op);
  return bits;
}

void launch_kernel(const char* name, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                   std::vector<const void*> pointers, std::function<void()> body) {
  std::lock_guard<std::recursive_mutex> lock(api_lock());
  count(Counter::KernelLaunches);
  const DeviceSpec& s = device_spec();
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  const bool ok = block.x >= 1 && block.y >= 1 && block.z >= 1 && grid.x >= 1 && grid.y >= 1 && grid.z >= 1 &&
                  block.x <= static_cast<unsigned>(s.max_block_dims[0]) &&
                  block.y <= static_cast<unsigned>(s.max_block_dims[1]) &&
                  block.z <= static_cast<unsigned>(s.max_block_dims[2]) &&
                  threads <= static_cast<uint64_t>(s.max_threads_per_block) &&
                  grid.x <= static_cast<unsigned>(s.max_grid_dims[0]) &&
                  grid.y <= static_cast<unsigned>(s.max_grid_dims[1]) &&
                  grid.z <= static_cast<unsigned>(s.max_grid_dims[2]) && shared_bytes <= s.shared_per_block;
  if (!ok) {
    note(std::string("launch of ") + name + " refused: grid (" + std::to_string(grid.x) + "," +
         std::to_string(grid.y) + "," + std::to_string(grid.z) + ") block (" + std::to_string(block.x) + "," +
         std::to_string(block.y) + "," + std::to_string(block.z) + ") shared " + std::to_string(shared_bytes) +
         " B exceeds the device's limits");
    set_last_error(cudaErrorInvalidConfiguration);
    return;
  }
  const std::string what = std::string("kernel ") + name;
  require_stream(stream, what.c_str());
  for (size_t i = 0; i < pointers.size(); ++i) {
    const void* p = pointers[i];
    if (p && !find_allocation(p))
      fault(what + ": pointer argument " + std::to_string(i + 1) + " is " + describe_pointer(p) +
            ", not device memory");
  }
  enqueue(stream, what, [name, grid, block, pointers = std::move(pointers), body = std::move(body)] {
    run_grid(name, grid, block, body);
    check_canaries_of(pointers, name);
  });
}

}  // namespace rd::emu

extern "C" void rd_emu_fiber_entry() {
  using namespace rd::emu;
  Team& t = *g_team;
  (*t.body)();
  t.current->state = Fiber::Done;
  rd_emu_swap(&t.current->sp, t.scheduler_sp);
  __builtin_unreachable();
}
