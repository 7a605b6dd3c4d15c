// torch rounds each multiply and the add of ema_avg on its own; GCC must not fuse the
// host-side num_batches_tracked arithmetic into an FMA.
#include "resnet_ddp/exact_fp.h"  // first: no FMA contraction in this file

#include "resnet_ddp/train/model_ema.h"

#include <algorithm>

#include "resnet_ddp/errors.h"

namespace rd::train {

double ModelEma::adjusted_decay(int64_t world, int64_t batch_size, int64_t steps, int64_t epochs, double decay) {
  const double adjust = static_cast<double>(world * batch_size * steps) / static_cast<double>(epochs);
  const double alpha = std::min(1.0, (1.0 - decay) * adjust);
  return 1.0 - alpha;
}

int64_t ModelEma::average_count(int64_t averaged, int64_t current, float decay, float one_minus_decay) {
  const float a = decay * static_cast<float>(averaged);
  const float b = one_minus_decay * static_cast<float>(current);
  return static_cast<int64_t>(a + b);
}

ModelEma::ModelEma(ResNet& model, double decay, int64_t every_steps, int64_t warmup_epochs)
    : backend_(model.backend()),
      decay_(decay),
      every_steps_(every_steps),
      warmup_epochs_(warmup_epochs),
      params_size_(model.params().size()),
      buffers_size_(model.buffers().size()) {
  params_ = backend_.allocate(std::max<size_t>(params_size_, 1) * sizeof(float));
  buffers_ = backend_.allocate(std::max<size_t>(buffers_size_, 1) * sizeof(float));
  nbt_ = model.num_batches_tracked();
  copy(model, static_cast<float*>(params_.get()), static_cast<float*>(buffers_.get()), false);
}

// Between the model's arenas and a pair of ours, either way.
void ModelEma::copy(ResNet& model, float* params, float* buffers, bool into_model) {
  RD_CHECK(model.params().size() == params_size_ && model.buffers().size() == buffers_size_,
           "ModelEma: the model's layout changed");
  if (into_model) {
    backend_.ema_update(model.params().data(), params, params_size_, 0.f, 1.f, true);
    if (buffers_size_) backend_.ema_update(model.buffers().data(), buffers, buffers_size_, 0.f, 1.f, true);
  } else {
    backend_.ema_update(params, model.params().data(), params_size_, 0.f, 1.f, true);
    if (buffers_size_) backend_.ema_update(buffers, model.buffers().data(), buffers_size_, 0.f, 1.f, true);
  }
}

void ModelEma::update(ResNet& model) {
  if (n_averaged_ == 0) {
    copy(model, static_cast<float*>(params_.get()), static_cast<float*>(buffers_.get()), false);
    nbt_ = model.num_batches_tracked();
  } else {
    // torch evaluates decay * avg and (1 - decay) * model in float32 (the Python floats
    // rounded to it), then adds; the int64 counter goes through the same float32
    // arithmetic and copy_ truncates it back.
    const float d = static_cast<float>(decay_), omd = static_cast<float>(1.0 - decay_);
    backend_.ema_update(static_cast<float*>(params_.get()), model.params().data(), params_size_, d, omd, false);
    if (buffers_size_)
      backend_.ema_update(static_cast<float*>(buffers_.get()), model.buffers().data(), buffers_size_, d, omd, false);
    nbt_ = average_count(nbt_, model.num_batches_tracked(), d, omd);
  }
  ++n_averaged_;
}

void ModelEma::start(ResNet& model, dist::Comm& comm, bool resumed, int64_t n_averaged, int64_t num_batches_tracked) {
  if (!resumed) {
    restart(model);
    return;
  }
  comm.broadcast(params_.get(), params_size_ * sizeof(float), 0);
  comm.broadcast(buffers_.get(), buffers_size_ * sizeof(float), 0);
  n_averaged_ = n_averaged;
  nbt_ = num_batches_tracked;
}

void ModelEma::after_optimizer_step(ResNet& model, int64_t epoch, int64_t step_in_epoch) {
  if (step_in_epoch % every_steps_ != 0) return;
  update(model);
  if (epoch < warmup_epochs_) reset_count();
}

void ModelEma::restart(ResNet& model) {
  copy(model, static_cast<float*>(params_.get()), static_cast<float*>(buffers_.get()), false);
  nbt_ = model.num_batches_tracked();
  n_averaged_ = 0;
}

void ModelEma::swap_in(ResNet& model) {
  if (!saved_params_) {
    saved_params_ = backend_.allocate(std::max<size_t>(params_size_, 1) * sizeof(float));
    saved_buffers_ = backend_.allocate(std::max<size_t>(buffers_size_, 1) * sizeof(float));
  }
  copy(model, static_cast<float*>(saved_params_.get()), static_cast<float*>(saved_buffers_.get()), false);
  copy(model, static_cast<float*>(params_.get()), static_cast<float*>(buffers_.get()), true);
}

void ModelEma::swap_out(ResNet& model) {
  RD_CHECK(saved_params_, "ModelEma: swap_out without swap_in");
  copy(model, static_cast<float*>(saved_params_.get()), static_cast<float*>(saved_buffers_.get()), true);
}

io::EmaState ModelEma::export_state() {
  io::EmaState s;
  s.present = true;
  s.decay = decay_;
  s.n_averaged = n_averaged_;
  s.num_batches_tracked = nbt_;
  s.params = static_cast<float*>(params_.get());
  s.buffers = static_cast<float*>(buffers_.get());
  return s;
}

void ModelEma::import_state(const io::EmaState& s) {
  n_averaged_ = s.n_averaged;
  nbt_ = s.num_batches_tracked;
}

}  // namespace rd::train
