// Optimizers with PyTorch semantics (the LR schedulers: train/scheduler.h).
//
// The optimizer works on the model's flat parameter arena in one backend call per
// step (every parameter shares one param group), and keeps its state (Adam's
// exp_avg / exp_avg_sq, SGD's momentum_buffer) in arenas of the same layout, so a
// parameter's state is the slice at the parameter's offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/backend/names.h"
#include "resnet_ddp/io/optimizer_state.h"
#include "resnet_ddp/nn/arena.h"

namespace rd::train {

// The plain-value types live with the file formats that store them (io/optimizer_state.h).
using io::OptimizerConfig;
using io::OptimizerKind;
using io::OptimizerState;
using io::optimizer_names;

class Optimizer {
 public:
  // `params` and `grads` share one slice layout; state is allocated on `backend`.
  Optimizer(Backend& backend, Arena& params, Arena& grads, const OptimizerConfig& cfg);

  const OptimizerConfig& config() const { return cfg_; }
  std::string type_name() const { return name_of(optimizer_names(), cfg_.type); }
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  int64_t steps() const { return step_; }

  // One update of every parameter from the current gradients.
  void step();

  // State buffers: adam -> {exp_avg, exp_avg_sq}; sgd -> {momentum_buffer} (when
  // momentum > 0). Each has params().size() floats in the params' layout.
  size_t state_count() const;
  const char* state_name(size_t i) const;
  float* state(size_t i);

  // The whole state as plain values (the tensors as views of this optimizer's buffers),
  // and back: import_state takes the step and current LR; the tensors are filled in
  // place through export_state().tensors (CheckpointReader::load_optimizer, which also
  // refuses a state of another optimizer type).
  OptimizerState export_state();
  void import_state(const OptimizerState& s);

 private:
  Backend& backend_;
  Arena& params_;
  Arena& grads_;
  OptimizerConfig cfg_;
  double lr_;
  int64_t step_ = 0;
  std::shared_ptr<void> state_[2];
};

}  // namespace rd::train
