#include "resnet_ddp/train/optimizer.h"

#include <cmath>
#include <limits>

#include "resnet_ddp/errors.h"

namespace rd::train {

Optimizer::Optimizer(Backend& backend, Arena& params, Arena& grads, const OptimizerConfig& cfg)
    : backend_(backend), params_(params), grads_(grads), cfg_(cfg), lr_(cfg.lr) {
  RD_CHECK(params.allocated() && grads.allocated() && params.size() == grads.size(),
           "Optimizer: parameter and gradient arenas must be allocated with the same layout");
  const size_t bytes = std::max<size_t>(params.size(), 1) * sizeof(float);
  for (size_t i = 0; i < state_count(); ++i) state_[i] = backend_.allocate(bytes);
}

size_t Optimizer::state_count() const {
  if (cfg_.type == OptimizerKind::Adam) return 2;
  return cfg_.momentum != 0.0 ? 1 : 0;
}

const char* Optimizer::state_name(size_t i) const {
  if (cfg_.type == OptimizerKind::Adam) return i == 0 ? "exp_avg" : "exp_avg_sq";
  return "momentum_buffer";
}

float* Optimizer::state(size_t i) {
  RD_CHECK(i < state_count(), "Optimizer: no state buffer " << i);
  return static_cast<float*>(state_[i].get());
}

OptimizerState Optimizer::export_state() {
  OptimizerState s;
  s.present = true;
  s.config = cfg_;
  s.step = step_;
  s.lr = lr_;
  for (size_t i = 0; i < state_count(); ++i) s.tensors.push_back({state_name(i), state(i)});
  return s;
}

void Optimizer::import_state(const OptimizerState& s) {
  RD_CHECK(s.config.type == cfg_.type, "Optimizer: state of another optimizer type");
  step_ = s.step;
  lr_ = s.lr;
}

void Optimizer::step() {
  ++step_;
  const size_t n = params_.size();
  if (cfg_.type == OptimizerKind::Adam) {
    math::AdamArgs a;
    a.lr = static_cast<float>(lr_);
    a.beta1 = static_cast<float>(cfg_.beta1);
    a.beta2 = static_cast<float>(cfg_.beta2);
    a.eps = static_cast<float>(cfg_.eps);
    a.weight_decay = static_cast<float>(cfg_.weight_decay);
    a.step = step_;
    backend_.adam_step(params_.data(), grads_.data(), state(0), state(1), n, a);
  } else {
    float* buf = cfg_.momentum != 0.0 ? state(0) : nullptr;
    // PyTorch seeds the momentum buffer with the first gradient it sees.
    math::SgdHyper h{};
    h.lr = static_cast<float>(lr_);
    h.momentum = static_cast<float>(cfg_.momentum);
    h.dampening = static_cast<float>(cfg_.dampening);
    h.weight_decay = static_cast<float>(cfg_.weight_decay);
    h.nesterov = cfg_.nesterov;
    h.first_step = step_ == 1;
    backend_.sgd_step(params_.data(), grads_.data(), buf, n, h);
  }
}

Scheduler::Scheduler(SchedulerKind kind, double base_lr, int64_t epochs) : kind_(kind) {
  plateau.best = std::numeric_limits<double>::infinity();
  cosine.t_max = std::max<int64_t>(epochs, 1);
  cosine.base_lr = base_lr;
}

SchedulerState Scheduler::export_state() const {
  SchedulerState s;
  s.present = true;
  s.type = type();
  s.last_epoch = last_epoch_;
  s.plateau = plateau;
  s.cosine = cosine;
  return s;
}

void Scheduler::import_state(const SchedulerState& s) {
  if (!s.present || s.type != type()) return;  // a changed --scheduler starts fresh
  last_epoch_ = s.last_epoch;
  plateau = s.plateau;
  cosine = s.cosine;
}

double Scheduler::step(double lr, double val_loss) {
  ++last_epoch_;
  if (kind_ == SchedulerKind::Plateau) {
    PlateauState& p = plateau;
    // mode "min", threshold_mode "rel": better when below best * (1 - threshold).
    if (val_loss < p.best * (1.0 - p.threshold)) {
      p.best = val_loss;
      p.num_bad_epochs = 0;
    } else {
      ++p.num_bad_epochs;
    }
    if (p.cooldown_counter > 0) {
      --p.cooldown_counter;
      p.num_bad_epochs = 0;
    }
    if (p.num_bad_epochs > p.patience) {
      const double new_lr = std::max(lr * p.factor, p.min_lr);
      if (lr - new_lr > p.eps) lr = new_lr;
      p.cooldown_counter = p.cooldown;
      p.num_bad_epochs = 0;
    }
    return lr;
  }
  if (kind_ == SchedulerKind::Cosine) {
    // torch's recursive (chainable) form, evaluated at the new last_epoch.
    const double pi = 3.14159265358979323846;
    const double T = static_cast<double>(cosine.t_max);
    const int64_t e = last_epoch_;
    const double eta_min = cosine.eta_min;
    if (e == 0) return cosine.base_lr;
    if ((e - 1 - cosine.t_max) % (2 * cosine.t_max) == 0)
      return lr + (cosine.base_lr - eta_min) * (1.0 - std::cos(pi / T)) / 2.0;
    return (1.0 + std::cos(pi * static_cast<double>(e) / T)) /
               (1.0 + std::cos(pi * static_cast<double>(e - 1) / T)) * (lr - eta_min) +
           eta_min;
  }
  return lr;
}

}  // namespace rd::train
