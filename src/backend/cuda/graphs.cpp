// CUDA graphs on the compute stream: the ops' device work recorded once by stream capture
// and replayed with one cudaGraphLaunch (ops.def, "graphs"). A ResNet-34 step issues some
// 600 launches; replayed, the host issues one per graph.
//
// A replay uses the addresses it was recorded with, so the backend keeps two promises:
//  - no memory it uses was freed since: every allocation and free of the backend and its
//    scratch buffers is counted (memory_events), and a graph recorded at another count is
//    dropped at launch instead of replayed;
//  - staged convolution weights (conv.cpp: NHWC / 16-bit copies, converted only when a
//    weight changed) are what the graph expects: a graph converts the weights that were
//    stale when it was recorded, and relies on those that were fresh; a launch marks the
//    first current and is refused when one of the second changed since (record it again);
//  - a graph holding an optimizer update (or an EMA step) marks every staged weight stale
//    at each launch, as the eager update op does when it is called.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "resnet_ddp/errors.h"

namespace rd::cuda {

namespace {
std::atomic<uint64_t> g_memory_events{0};
// A staged copy that no version equals: converted by a graph that has not run yet.
constexpr uint64_t kNotYetConverted = ~uint64_t{0};
}  // namespace

uint64_t memory_events_so_far() { return g_memory_events.load(); }
void count_memory_event() { ++g_memory_events; }

uint64_t CudaBackend::memory_events() { return memory_events_so_far(); }

bool CudaBackend::graph_begin() {
  RD_CHECK(!recording_, "graph_begin: a graph is already being recorded");
  // A dropped graph's id is used again, so re-recording does not grow the table.
  auto free_slot = std::find_if(graphs_.begin(), graphs_.end(), [](const Graph& g) { return !g.exec; });
  if (free_slot == graphs_.end()) free_slot = graphs_.insert(graphs_.end(), Graph{});
  recording_ = &*free_slot;
  recording_->memory_events = memory_events_so_far();
  // Thread-local: the loader's threads may allocate pinned memory meanwhile; only this
  // thread's unsafe calls (a sync, an allocation) would break the capture.
  const cudaError_t e = cudaStreamBeginCapture(compute_, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    recording_ = nullptr;
    fail_cuda(e, "cudaStreamBeginCapture", __FILE__, __LINE__);
  }
  return true;
}

int CudaBackend::graph_end() {
  RD_CHECK(recording_, "graph_end: no graph is being recorded (graph_begin first)");
  Graph& g = *recording_;
  recording_ = nullptr;
  const int id = static_cast<int>(&g - graphs_.data());
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(compute_, &graph);
  // The conversions were recorded, not run: until a launch runs them those copies are stale.
  for (const void* w : g.converts) staged_weights_[w].version = kNotYetConverted;
  if (e != cudaSuccess) {
    graphs_[static_cast<size_t>(id)] = Graph{};
    fail_cuda(e, "cudaStreamEndCapture (a call in the recorded work cannot be captured)", __FILE__, __LINE__);
  }
  const cudaError_t inst = cudaGraphInstantiate(&g.exec, graph, 0);
  cudaGraphDestroy(graph);
  if (inst != cudaSuccess) {
    g = Graph{};
    fail_cuda(inst, "cudaGraphInstantiate", __FILE__, __LINE__);
  }
  return id;
}

bool CudaBackend::graph_launch(int graph) {
  RD_CHECK(!recording_, "graph_launch: a graph is being recorded (graph_end first)");
  RD_CHECK(graph >= 0 && static_cast<size_t>(graph) < graphs_.size() && graphs_[static_cast<size_t>(graph)].exec,
           "graph_launch: no graph " << graph << " (never recorded, or dropped)");
  Graph& g = graphs_[static_cast<size_t>(graph)];
  bool replayable = g.memory_events == memory_events_so_far();
  for (const void* w : g.relies) {
    if (!replayable) break;
    const auto it = staged_weights_.find(w);
    const bool converted_here = std::find(g.converts.begin(), g.converts.end(), w) != g.converts.end();
    replayable = it != staged_weights_.end() && (converted_here || it->second.version == weights_version_);
  }
  if (!replayable) {
    graph_drop(graph);
    return false;
  }
  RD_CUDA(cudaGraphLaunch(g.exec, compute_));
  for (const void* w : g.converts) staged_weights_[w].version = weights_version_;
  for (const void* w : g.converts) staged_weights_[w].last_used_step = optimizer_steps_;
  for (const void* w : g.relies) staged_weights_[w].last_used_step = optimizer_steps_;
  if (!g.converts.empty() || !g.relies.empty()) convs_since_step_ = true;
  // After the conversions' marks: the graph's update follows its convolutions, and the
  // weights it writes leave every staged copy stale for the work queued after it.
  if (g.changes_weights) weights_changed_by_optimizer();
  return true;
}

void CudaBackend::drop_all_graphs() {
  for (Graph& g : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
}

void CudaBackend::graph_drop(int graph) {
  RD_CHECK(graph >= 0 && static_cast<size_t>(graph) < graphs_.size(), "graph_drop: no graph " << graph);
  Graph& g = graphs_[static_cast<size_t>(graph)];
  if (g.exec) cudaGraphExecDestroy(g.exec);
  g = Graph{};
}

}  // namespace rd::cuda
