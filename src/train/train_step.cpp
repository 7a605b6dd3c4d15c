#include "resnet_ddp/train/train_step.h"

#include "resnet_ddp/errors.h"

#include <algorithm>
#include <chrono>
#include <limits>


namespace rd::train {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

LossScaler::LossScaler(Backend& backend, bool enabled, double initial) : backend_(backend), enabled_(enabled) {
  if (!enabled_) return;
  memory_ = backend_.allocate(sizeof(math::AmpStepState));
  state_ = static_cast<math::AmpStepState*>(memory_.get());
  math::AmpStepState start;
  start.loss_scale = initial;
  backend_.copy_from_host(state_, &start, sizeof start);
}

math::AmpStepState LossScaler::read() const {
  math::AmpStepState s;
  if (enabled_) backend_.copy_to_host(&s, state_, sizeof s);
  return s;
}

double LossScaler::scale() const { return enabled_ ? read().loss_scale : 1.0; }

int64_t LossScaler::skipped_steps() const { return enabled_ ? static_cast<int64_t>(read().skipped) : 0; }

void LossScaler::unscale(Arena& grads, bool any_nonfinite) {
  // One pass unscales and checks; an overflowing step's unscaled values are discarded.
  if (enabled_) backend_.amp_unscale(grads.data(), grads.size(), state_, any_nonfinite);
}

TrainStep::TrainStep(ResNet& model, Optimizer& optimizer, dist::GradientReducer* reducer, float label_smoothing,
                     bool loss_scaling, double initial_loss_scale)
    : model_(model),
      backend_(model.backend()),
      optimizer_(optimizer),
      reducer_(reducer),
      label_smoothing_(label_smoothing),
      scaler_(model.backend(), loss_scaling, initial_loss_scale) {
  // The optimizer skips and counts its steps by the device's verdict.
  if (scaler_.enabled()) optimizer_.use_device_step(scaler_.device_state());
}

void TrainStep::begin_forward(const Tensor& input, int micro, int group) {
  micro_ = micro;
  group_ = group;
  logits_ = &model_.forward(input);
  const int64_t n = logits_->shape[0], classes = logits_->shape[1];
  if (!dlogits_.defined() || dlogits_.shape[0] != n) dlogits_ = backend_.matrix(n, classes);
}

void TrainStep::after_loss(int micro) {
  if (inject_here_ && inject_at_ > 0 && updates_ + 1 == inject_at_ && micro == 0)
    backend_.fill(dlogits_.f32(), std::numeric_limits<float>::infinity(), 1);
}

double TrainStep::forward(const Tensor& input, const int32_t* labels, int micro, int group, int32_t* predictions,
                          const MixedTargets* mixed) {
  begin_forward(input, micro, group);
  // Accumulated micro-batches average: each contributes 1/group of the gradient. The
  // loss comes back to the host anyway, so reading the loss scale there costs no extra stall.
  const auto scale = static_cast<float>(scaler_.scale() / group);
  const double loss =
      mixed ? backend_.softmax_xent_mixed(*logits_, labels, mixed->partner_labels, mixed->lambda, label_smoothing_,
                                          scale, &dlogits_, predictions)
            : backend_.softmax_xent(*logits_, labels, label_smoothing_, scale, &dlogits_, predictions);
  after_loss(micro);
  return loss;
}

void TrainStep::forward_sums(const Tensor& input, const int32_t* labels, const int32_t* accuracy_targets,
                             double* sums, int micro, int group, const MixedTargets* mixed) {
  // fp16: the loss op reads the scale in the backend's memory and divides it by the group
  // there, so the host never waits for the last step's verdict (and a replayed graph uses
  // the scale of its launch).
  const math::AmpStepState* amp = scaler_.device_state();
  const float scale = amp ? static_cast<float>(group) : static_cast<float>(1.0 / group);
  // A replay reads the labels the backend staged before it; the mixing weight and an injected
  // overflow would be replayed as recorded, so those steps run eagerly. SyncBatchNorm's
  // collectives are stream-ordered (no host wait), so they are recorded too: every rank
  // records or replays them at the same steps (backward_reduce_on_device).
  const bool injecting = inject_at_ > 0 && updates_ + 1 == inject_at_ && micro == 0;
  if (graphs_on_ && !mixed && !injecting) {
    backend_.stage_loss_labels(labels, nullptr, accuracy_targets, input.shape[0]);
    micro_ = micro;
    group_ = group;
    const bool replayed = replay_or_record(GraphKey{input.data, sums, input.shape[0], scale, false, true}, [&] {
      begin_forward(input, micro, group);
      backend_.softmax_xent_sums(*logits_, labels, nullptr, 1.f, label_smoothing_, scale, &dlogits_, accuracy_targets,
                                 sums, amp);
    });
    if (replayed) model_.forward_replayed();
    return;
  }
  begin_forward(input, micro, group);
  backend_.softmax_xent_sums(*logits_, labels, mixed ? mixed->partner_labels : nullptr, mixed ? mixed->lambda : 1.f,
                             label_smoothing_, scale, &dlogits_, accuracy_targets, sums, amp);
  after_loss(micro);
}

template <class Work> bool TrainStep::replay_or_record(const GraphKey& key, Work&& work) {
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    if (backend_.graph_launch(it->second)) {
      ++graph_replays_;
      return true;
    }
    graphs_.erase(it);  // dropped: memory it used was freed, or a staged weight changed
  }
  GraphKey shape = key;
  shape.sums = nullptr;
  shape.grad_scale = 0.f;
  shape.mark = -1;
  // Settled: the last eager run of this shape allocated and freed nothing, and nothing
  // has since (a shape's buffers may have been given back and re-made elsewhere meanwhile).
  const auto entry = settled_.try_emplace(shape, kUnsettled).first;
  const bool settled = entry->second == backend_.memory_events();
  if (settled && backend_.graph_begin()) {
    work();
    const int graph = backend_.graph_end();
    ++graph_recordings_;
    graphs_[key] = graph;
    RD_CHECK(backend_.graph_launch(graph), "a CUDA graph could not be launched right after it was recorded");
    ++graph_replays_;
    return false;
  }
  if (settled) graphs_on_ = false;  // graph_begin said no: this backend records no graphs
  const uint64_t before = backend_.memory_events();
  work();
  const uint64_t after = backend_.memory_events();
  entry->second = after == before ? after : kUnsettled;
  return false;
}

TrainStep::Seconds TrainStep::backward_and_reduce(int backward_mark) {
  const bool accumulate = micro_ > 0;
  // Without a timing mark, the host waits below are for the timing split alone
  // (backward vs exposed communication), not for correctness: the optimizer and the
  // next forward are queued on the same stream. With a reducer the first costs nothing
  // more: finish() waits on the host for the last bucket, which follows all of backward.
  // With a mark the device notes where backward ended and the host does not wait.
  const bool host_timing = backward_mark < 0;
  if (!reducer_) {
    const auto t0 = Clock::now();
    if (graphs_on_)
      replay_or_record(GraphKey{dlogits_.data, nullptr, dlogits_.shape[0], 0.f, accumulate, false},
                       [&] { model_.backward(dlogits_, accumulate, nullptr); });
    else
      model_.backward(dlogits_, accumulate, nullptr);
    if (!host_timing) {
      backend_.timing_mark(backward_mark);
      return {};
    }
    backend_.synchronize();
    return {seconds_between(t0, Clock::now()), 0.0};
  }
  const bool sync = micro_ == group_ - 1;
  reducer_->set_sync(sync);
  if (graphs_on_ && reducer_->waits_on_device()) return backward_reduce_on_device(backward_mark, sync);
  const double exposed_before = reducer_->exposed_comm_s();
  const auto t0 = Clock::now();
  reducer_->begin_backward();
  model_.backward(dlogits_, accumulate, reducer_);
  if (host_timing)
    backend_.synchronize();
  else
    backend_.timing_mark(backward_mark);
  const auto t1 = Clock::now();
  // No synchronize after finish(): it waited for every bucket on the
  // host and ordered the compute stream after them (NCCL), or ran on the host (MPI).
  reducer_->finish();
  const auto t2 = Clock::now();
  const double exposed = reducer_->exposed_comm_s() - exposed_before;
  if (!host_timing) return {0.0, exposed};
  return {seconds_between(t0, t1), std::max(exposed, seconds_between(t1, t2))};
}

// The backward and its buckets with no host wait, so the pass can be recorded: the compute
// stream waits for the buckets, and the host for that stream at the next read-back, with
// the collective deadline (CudaBackend::wait_queued_copies). NCCL wants every rank to
// record, replay or run a collective eagerly together: each rank decides from its
// allocation count and weight versions, the same on every rank (docs/cuda.md, "CUDA
// graphs"; the emulated NCCL refuses a mix). The timing mark sits inside
// the recorded pass, so the step split still tells backward from exposed communication.
TrainStep::Seconds TrainStep::backward_reduce_on_device(int backward_mark, bool sync) {
  const bool accumulate = micro_ > 0;
  const auto t0 = Clock::now();
  const GraphKey key{dlogits_.data, nullptr, dlogits_.shape[0], 0.f, accumulate, false, sync, backward_mark};
  const bool replayed = replay_or_record(key, [&] {
    reducer_->begin_backward();
    model_.backward(dlogits_, accumulate, reducer_);
    if (backward_mark >= 0) backend_.timing_mark(backward_mark);
    reducer_->finish_on_device();
  });
  if (replayed) reducer_->count_replayed_pass();
  if (backward_mark >= 0) return {};
  backend_.synchronize();  // the split from the host: backward and its buckets together
  return {seconds_between(t0, Clock::now()), 0.0};
}

void TrainStep::reduce_partial_group() {
  if (!reducer_) return;
  reducer_->set_sync(true);
  reducer_->begin_backward();
  reducer_->finish();
}

void TrainStep::update(bool any_nonfinite) {
  ++updates_;
  if (!scaler_.enabled() && any_nonfinite) {
    ++skipped_;
    return;
  }
  // The update (fp16: the unscale and its verdict too) as one graph: the step's lr and count
  // go to the backend outside it (begin_step), and the ops read them there when it runs. A
  // rank's non-finite loss is a launch argument of the unscale: that rare step runs eagerly.
  if (graphs_on_ && optimizer_.step_is_recordable() && !any_nonfinite) {
    optimizer_.begin_step();
    replay_or_record(GraphKey{.input = model_.grads().data(), .sums = nullptr, .rows = 0, .grad_scale = 0.f,
                                      .accumulate = false, .forward = false, .update = true},
                     [&] {
      scaler_.unscale(model_.grads(), false);
      optimizer_.queue_update();
    });
    return;
  }
  // The optimizer's kernels read the verdict the unscale leaves on the device.
  scaler_.unscale(model_.grads(), any_nonfinite);
  optimizer_.step();
}

}  // namespace rd::train
