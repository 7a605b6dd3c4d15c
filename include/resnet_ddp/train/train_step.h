// One optimizer step of data-parallel training: the unit the trainer runs and the
// benchmarks and the DDP-equivalence and parity tests time and check, in llm.c's
// three calls:
//
//   for (int micro = 0; micro < group; ++micro) {
//     step.forward(input, labels, micro, group);   // forward + loss, dlogits
//     step.backward_and_reduce();                  // backward, buckets all-reduced
//   }
//   step.update();                                 // (unscale,) optimizer
//
// Gradients accumulate over the group's micro-batches, each loss scaled by 1/group,
// and are all-reduced (bucketed, overlapping backward) only during the last one.
// Input preparation and the cross-rank agreement on a non-finite loss stay with the
// caller, and so does timing, except inside backward_and_reduce, which alone can
// tell backward from the communication it did not hide.
#pragma once

#include <compare>
#include <cstdint>
#include <map>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/dist/reducer.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/train/mixing.h"
#include "resnet_ddp/train/optimizer.h"

namespace rd::train {

// fp16 dynamic loss scaling with PyTorch AMP's GradScaler defaults: start at 2^16,
// halve (not below 1) on an overflowing step, which is skipped, and double after
// 2000 good steps in a row. The scale, the verdict and the counts live in the backend's
// memory (math::AmpStepState): the loss op reads the scale there, the optimizer the
// verdict, and no host read decides a step. Disabled, the scale is 1 and nothing is checked.
class LossScaler {
 public:
  LossScaler(Backend& backend, bool enabled, double initial = 65536.0);
  bool enabled() const { return enabled_; }
  // Host reads of the device state (each waits for the queued work): for reports,
  // checkpoints and tests, never per step.
  double scale() const;
  int64_t skipped_steps() const;
  // The state in backend memory, null when disabled.
  math::AmpStepState* device_state() const { return state_; }
  // Queues the scale's division out of `grads`, the overflow check and GradScaler's
  // update; `any_nonfinite`: some rank's loss was not finite (the step is skipped).
  void unscale(Arena& grads, bool any_nonfinite);

 private:
  math::AmpStepState read() const;
  Backend& backend_;
  bool enabled_;
  std::shared_ptr<void> memory_;
  math::AmpStepState* state_ = nullptr;
};

class TrainStep {
 public:
  // `reducer` (dist::GradientBucketer) null: one process, no communication.
  // `loss_scaling`: fp16.
  TrainStep(ResNet& model, Optimizer& optimizer, dist::GradientReducer* reducer, float label_smoothing,
            bool loss_scaling = false, double initial_loss_scale = 65536.0);

  // MixUp / CutMix soft targets (train/mixing.h, which BatchMixer hands back).
  using MixedTargets = train::MixedTargets;

  // Forward and label-smoothed cross-entropy of micro-batch `micro` of `group`.
  // Returns the batch's summed (unscaled) loss; `predictions` (optional) receives each
  // sample's arg-max class. `mixed` (optional): soft targets instead of `labels` alone.
  double forward(const Tensor& input, const int32_t* labels, int micro = 0, int group = 1,
                 int32_t* predictions = nullptr, const MixedTargets* mixed = nullptr);
  const Tensor& logits() const { return *logits_; }
  // As forward, without a host wait: the loss sum, the rows whose arg-max equals
  // accuracy_targets[i] and a non-finite flag are added into `sums` (3 doubles in the
  // backend's memory, Backend::softmax_xent_sums), which the caller reads when it chooses.
  void forward_sums(const Tensor& input, const int32_t* labels, const int32_t* accuracy_targets, double* sums,
                    int micro = 0, int group = 1, const MixedTargets* mixed = nullptr);

  // Backward of the last forward. On the group's last micro-batch the gradient
  // buckets are all-reduced as they fill. Returns the seconds spent in backward and
  // waiting for communication afterwards (exposed, not overlapped), measured on the host
  // after a synchronize. With `backward_mark` (>= 0) the host does not wait: the backend's
  // timing mark of that index notes where backward ended on the device (Backend::
  // timing_mark), and only the host's wait for the buckets comes back (comm; 0 with
  // graphs on and a device communicator: the device waits for the buckets, the host at
  // the next read-back).
  struct Seconds {
    double backward = 0, comm = 0;
  };
  Seconds backward_and_reduce(int backward_mark = -1);
  // The data ran out inside a group: the all-reduce its last micro-batch would have done.
  void reduce_partial_group();

  // One optimizer update from the reduced gradients (fp16: unscaled and checked
  // first, the skip decided on the device). `any_nonfinite`: some rank's loss was not
  // finite; the update is skipped.
  void update(bool any_nonfinite = false);

  LossScaler& scaler() { return scaler_; }
  // Updates skipped so far (fp16: a non-finite gradient on some rank; a host read of the
  // device state, not for every step).
  int64_t skipped_steps() const { return skipped_ + scaler_.skipped_steps(); }
  // Test hook (RD_INJECT_OVERFLOW_STEP, tests/gpu_emu): this rank's loss gradient
  // becomes inf at the given 1-based update, as an fp16 overflow would; the
  // all-reduce spreads it, so every rank must skip that update.
  // `here` false: another rank injects; this one runs that step eagerly too, as NCCL wants
  // every rank to run a collective from a graph or none (backward_reduce_on_device).
  void inject_overflow_at(int64_t update, bool here = true) {
    inject_at_ = update;
    inject_here_ = here;
  }

  // CUDA graphs (Backend::graph_begin): each micro-batch's forward (with the loss) and its
  // backward (with the gradient buckets' all-reduces when a reducer can wait on the device:
  // NCCL) are recorded as graphs once a run of the same shape allocated nothing, and
  // replayed from then on: ~600 kernel launches of a ResNet-34 step become two. The
  // optimizer step (fp16: with its unscale) is a third graph, its lr and step count read in
  // backend memory. The timing marks sit between the graphs or, with a reducer, inside the
  // backward's (event record nodes). Eager instead: the backward with a host communicator
  // (MPI), MixUp / CutMix's forward, an injected overflow, a backend without graphs, the
  // optimizer steps that read gradient norms on the host (LARS, LAMB, --clip-grad-norm) and
  // an update after a rank's non-finite loss. Replays compute what the eager step computes, bit for bit
  // (tests/gpu_emu/graphs_emu.sh).
  void use_graphs(bool on) { graphs_on_ = on; }
  // Graph launches and recordings so far (the trainer's report, the tests).
  int64_t graph_replays() const { return graph_replays_; }
  int64_t graph_recordings() const { return graph_recordings_; }

 private:
  ResNet& model_;
  Backend& backend_;
  Optimizer& optimizer_;
  dist::GradientReducer* reducer_;
  float label_smoothing_;
  LossScaler scaler_;
  // forward's and forward_sums' common start: the model's forward.
  void begin_forward(const Tensor& input, int micro, int group);
  void after_loss(int micro);
  // One graph per distinct set of addresses and constants its work was recorded with.
  struct GraphKey {
    const void* input;   // forward: the input; backward: the loss gradient
    const void* sums;    // forward: the step's sums slot
    int64_t rows;
    float grad_scale;    // forward: the loss op's grad_scale (from the accumulation group)
    bool accumulate;     // backward: a later micro-batch adds to the gradients
    bool forward;
    bool reduce = false;  // backward: the gradient buckets all-reduced in it (the group's last)
    int mark = -1;        // backward with a reducer: the timing mark recorded in it
    bool update = false;  // the optimizer step (input: the gradients)
    auto operator<=>(const GraphKey&) const = default;
  };
  // Runs `work` as the graph of `key`, recording it once the work of its shape (the key
  // without its sums slot, scale and timing mark) ran eagerly without allocating or freeing memory.
  // True: a recorded graph replayed it, and `work`'s host side did not run.
  template <class Work> bool replay_or_record(const GraphKey& key, Work&& work);
  // backward_and_reduce with a reducer that waits on the device (recordable).
  Seconds backward_reduce_on_device(int backward_mark, bool sync);
  bool graphs_on_ = false;
  std::map<GraphKey, int> graphs_;     // recorded graph ids
  // By shape: memory_events() after its last eager run when that run allocated and freed
  // nothing, else kUnsettled.
  static constexpr uint64_t kUnsettled = ~uint64_t{0};
  std::map<GraphKey, uint64_t> settled_;
  int64_t graph_replays_ = 0, graph_recordings_ = 0;
  const Tensor* logits_ = nullptr;
  Tensor dlogits_;
  int micro_ = 0, group_ = 1;
  int64_t updates_ = 0, skipped_ = 0, inject_at_ = 0;
  bool inject_here_ = true;
};

}  // namespace rd::train
