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

}  // namespace rd::train
