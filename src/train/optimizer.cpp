#include "resnet_ddp/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "resnet_ddp/errors.h"

namespace rd::train {

namespace {
bool is_bias(const std::string& name) {
  return name == "bias" || (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0);
}
std::string module_of(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? "" : name.substr(0, dot);
}
}  // namespace

std::vector<float> parameter_weight_decays(const Arena& params, const OptimizerConfig& cfg) {
  std::vector<float> decay;
  for (const ParamSlice& s : params.slices()) {
    double d = cfg.weight_decay;
    const std::string module = module_of(s.name);
    const long weight = params.find(module.empty() ? "weight" : module + ".weight");
    // Batch norm is the only module here with a 1-D weight (convolutions and linears have 2-D+).
    const bool in_norm = weight >= 0 && params.slice(static_cast<size_t>(weight)).shape.rank == 1;
    if (cfg.bias_weight_decay >= 0 && is_bias(s.name)) d = cfg.bias_weight_decay;
    else if (cfg.norm_weight_decay >= 0 && in_norm) d = cfg.norm_weight_decay;
    decay.push_back(static_cast<float>(d));
  }
  return decay;
}

Optimizer::Optimizer(Backend& backend, Arena& params, Arena& grads, const OptimizerConfig& cfg)
    : backend_(backend), params_(params), grads_(grads), cfg_(cfg), lr_(cfg.lr) {
  RD_CHECK(params.allocated() && grads.allocated() && params.size() == grads.size(),
           "Optimizer: parameter and gradient arenas must be allocated with the same layout");
  const size_t bytes = std::max<size_t>(params.size(), 1) * sizeof(float);
  for (size_t i = 0; i < state_count(); ++i) state_[i] = backend_.allocate(bytes);
  scalars_memory_ = backend_.allocate(sizeof(math::OptimizerStepScalars));
  device_scalars_ = static_cast<math::OptimizerStepScalars*>(scalars_memory_.get());
  for (const ParamSlice& s : params.slices()) {
    ranges_.push_back(static_cast<int64_t>(s.offset));
    ranges_.push_back(static_cast<int64_t>(s.offset + s.count));
  }
  decay_ = parameter_weight_decays(params, cfg);
  scale_.assign(decay_.size(), 1.f);
  sq_params_.assign(decay_.size(), 0.0);
  sq_grads_.assign(decay_.size(), 0.0);
  const bool uniform_decay =
      std::all_of(decay_.begin(), decay_.end(), [&](float d) { return d == static_cast<float>(cfg.weight_decay); });
  segmented_ = !(uniform_decay && (cfg.type == OptimizerKind::Adam || cfg.type == OptimizerKind::Sgd));
}

size_t Optimizer::state_count() const {
  if (uses_adam_moments(cfg_.type)) return 2;
  if (cfg_.type == OptimizerKind::RmsProp) return cfg_.momentum > 0.0 ? 2 : 1;
  return cfg_.momentum != 0.0 ? 1 : 0;
}

const char* Optimizer::state_name(size_t i) const {
  if (uses_adam_moments(cfg_.type)) return i == 0 ? "exp_avg" : "exp_avg_sq";
  if (cfg_.type == OptimizerKind::RmsProp && i == 0) return "square_avg";
  return "momentum_buffer";
}

float* Optimizer::state(size_t i) {
  RD_CHECK(i < state_count(), "Optimizer: no state buffer " << i);
  return static_cast<float*>(state_[i].get());
}

math::AmpStepState Optimizer::read_device_step() const {
  math::AmpStepState s;
  backend_.copy_to_host(&s, amp_, sizeof s);
  return s;
}

int64_t Optimizer::steps() const { return amp_ ? static_cast<int64_t>(read_device_step().steps) : step_; }

// --clip-grad-norm, LARS and LAMB read gradient norms on the host every step (segment_sum_squares
// waits), so their steps stay eager: they read the device's verdict there too and run with the
// host's step count, which costs them no extra stall.
bool Optimizer::step_is_recordable() const {
  return clip_grad_norm_ <= 0.0 && cfg_.type != OptimizerKind::Lars && cfg_.type != OptimizerKind::Lamb;
}

bool Optimizer::device_decides() const { return amp_ && step_is_recordable(); }

// LARS's and LAMB's scalars go to the backend in their hyper-parameters (their steps are eager).
bool Optimizer::reads_device_scalars() const {
  return cfg_.type != OptimizerKind::Lars && cfg_.type != OptimizerKind::Lamb;
}

void Optimizer::write_step_scalars() {
  if (!reads_device_scalars()) return;
  // fp16 with the device deciding: the update ops count with the AmpStepState, and a 0 here
  // keeps the block unchanged while the learning rate is.
  const math::OptimizerStepScalars values{lr_, device_decides() ? 0.0 : static_cast<double>(step_)};
  // Unchanged since the last write: the backend memory holds them (only this object writes it).
  if (values.lr == written_scalars_.lr && values.steps == written_scalars_.steps) return;
  backend_.set_optimizer_scalars(device_scalars_, values);
  written_scalars_ = values;
}

OptimizerState Optimizer::export_state() {
  OptimizerState s;
  s.present = true;
  s.config = cfg_;
  s.step = steps();
  s.lr = lr_;
  for (size_t i = 0; i < state_count(); ++i) s.tensors.push_back({state_name(i), state(i)});
  return s;
}

void Optimizer::import_state(const OptimizerState& s) {
  RD_CHECK(s.config.type == cfg_.type, "Optimizer: state of another optimizer type");
  step_ = s.step;
  lr_ = s.lr;
  if (amp_) {
    math::AmpStepState device = read_device_step();
    device.steps = static_cast<double>(s.step);
    backend_.copy_from_host(amp_, &device, sizeof device);
  }
}

double Optimizer::clip_gradients(double max_norm) {
  backend_.segment_sum_squares(grads_.data(), ranges_.data(), decay_.size(), sq_grads_.data());
  double total = 0.0;
  for (double sq : sq_grads_) total += sq;
  total = std::sqrt(total);
  // torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to 1 (a multiply by 1 changes nothing).
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) backend_.scale(grads_.data(), static_cast<float>(coef), grads_.size());
  return total;
}

void Optimizer::step() {
  if (step_is_recordable()) {
    begin_step();
    return queue_update();
  }
  if (amp_) {
    const math::AmpStepState device = read_device_step();
    if (device.found_inf != 0.0) return;
    step_ = static_cast<int64_t>(device.steps);
  } else {
    ++step_;
  }
  if (clip_grad_norm_ > 0.0) last_grad_norm_ = clip_gradients(clip_grad_norm_);
  write_step_scalars();
  queue_update();
}

void Optimizer::begin_step() {
  RD_CHECK(step_is_recordable(), "Optimizer::begin_step: this optimizer's step reads gradient norms on the host "
                                 "(LARS, LAMB, --clip-grad-norm); call step()");
  ++step_;  // with amp_: unused, the device counts
  write_step_scalars();
}

void Optimizer::queue_update() {
  if (!segmented_) return flat_step();
  math::SegmentHyper h = segment_hyper();
  float* s0 = state_count() > 0 ? state(0) : nullptr;
  float* s1 = state_count() > 1 ? state(1) : nullptr;
  if (cfg_.type == OptimizerKind::Lars) return lars_step(h);
  if (cfg_.type == OptimizerKind::Lamb) return lamb_step(h);
  // The learning rate and step count are read in the backend's memory; AdamW's factor
  // 1 - lr * decay (torch.optim.AdamW's param.mul_) is formed there from that lr, so the
  // segment table stays the same from step to step.
  h.scalars = device_scalars_;
  if (device_decides()) h.amp = amp_;
  backend_.segment_step(params_.data(), grads_.data(), s0, s1, ranges_.data(), decay_.size(), decay_.data(),
                        scale_.data(), h);
}

math::SegmentHyper Optimizer::segment_hyper() const {
  using R = math::SegmentRule;
  math::SegmentHyper h;
  switch (cfg_.type) {
    case OptimizerKind::Sgd: h.rule = R::Sgd; break;
    case OptimizerKind::Adam: h.rule = R::Adam; break;
    case OptimizerKind::AdamW: h.rule = R::AdamW; break;
    case OptimizerKind::RmsProp: h.rule = R::RmsProp; break;
    case OptimizerKind::Lars: h.rule = R::Lars; break;
    case OptimizerKind::Lamb: h.rule = R::LambMoments; break;
  }
  h.lr = static_cast<float>(lr_);
  h.beta1 = static_cast<float>(cfg_.beta1);
  h.beta2 = static_cast<float>(cfg_.beta2);
  h.one_minus_beta1 = static_cast<float>(1.0 - cfg_.beta1);
  h.one_minus_beta2 = static_cast<float>(1.0 - cfg_.beta2);
  h.eps = static_cast<float>(cfg_.eps);
  h.alpha = static_cast<float>(cfg_.alpha);
  h.one_minus_alpha = static_cast<float>(1.0 - cfg_.alpha);
  h.momentum = static_cast<float>(cfg_.momentum);
  h.dampening = static_cast<float>(cfg_.dampening);
  h.nesterov = cfg_.nesterov;
  h.exact_lr = lr_;
  h.exact_beta1 = cfg_.beta1;
  h.exact_beta2 = cfg_.beta2;
  math::segment_step_scalars(h, static_cast<double>(std::max<int64_t>(step_, 1)), uses_adam_moments(cfg_.type));
  return h;
}

// timm's Lars: where a tensor's decay is non-zero, grad = (grad + decay * p) * trust, with
// trust = trust_coeff * |p| / (|g| + |p| * decay + eps) (1 when |p| or |g| is 0); then SGD.
void Optimizer::lars_step(math::SegmentHyper h) {
  const size_t n = decay_.size();
  backend_.segment_sum_squares(params_.data(), ranges_.data(), n, sq_params_.data());
  backend_.segment_sum_squares(grads_.data(), ranges_.data(), n, sq_grads_.data());
  for (size_t i = 0; i < n; ++i) {
    const double w = std::sqrt(sq_params_[i]), g = std::sqrt(sq_grads_[i]), wd = decay_[i];
    scale_[i] = 1.f;
    if (wd != 0.0 && w > 0.0 && g > 0.0) scale_[i] = static_cast<float>(cfg_.trust_coeff * w / (g + w * wd + cfg_.eps));
  }
  backend_.segment_step(params_.data(), grads_.data(), h.momentum != 0.f ? state(0) : nullptr, nullptr,
                        ranges_.data(), n, decay_.data(), scale_.data(), h);
}

// timm's Lamb: the gradients divided by max(|g|_global / max_grad_norm, 1); Adam's update
// u plus decay * p; where the decay is non-zero, u *= |p| / |u| (1 when either is 0);
// p -= lr * u. Two passes: the first leaves u in the gradient buffer.
void Optimizer::lamb_step(math::SegmentHyper h) {
  const size_t n = decay_.size();
  if (cfg_.max_grad_norm > 0.0) {
    backend_.segment_sum_squares(grads_.data(), ranges_.data(), n, sq_grads_.data());
    double total = 0.0;
    for (double sq : sq_grads_) total += sq;
    h.grad_divisor = static_cast<float>(std::max(std::sqrt(total) / cfg_.max_grad_norm, 1.0));
  }
  backend_.segment_step(params_.data(), grads_.data(), state(0), state(1), ranges_.data(), n, decay_.data(),
                        scale_.data(), h);
  backend_.segment_sum_squares(params_.data(), ranges_.data(), n, sq_params_.data());
  backend_.segment_sum_squares(grads_.data(), ranges_.data(), n, sq_grads_.data());
  for (size_t i = 0; i < n; ++i) {
    const double w = std::sqrt(sq_params_[i]), u = std::sqrt(sq_grads_[i]);
    scale_[i] = decay_[i] != 0.f && w > 0.0 && u > 0.0 ? static_cast<float>(w / u) : 1.f;
  }
  h.rule = math::SegmentRule::ScaledDescent;
  backend_.segment_step(params_.data(), grads_.data(), nullptr, nullptr, ranges_.data(), n, decay_.data(),
                        scale_.data(), h);
}

void Optimizer::flat_step() {
  const size_t n = params_.size();
  if (cfg_.type == OptimizerKind::Adam) {
    math::AdamArgs a;
    a.lr = static_cast<float>(lr_);
    a.beta1 = static_cast<float>(cfg_.beta1);
    a.beta2 = static_cast<float>(cfg_.beta2);
    a.eps = static_cast<float>(cfg_.eps);
    a.weight_decay = static_cast<float>(cfg_.weight_decay);
    a.step = std::max<int64_t>(step_, 1);  // the device's count (scalars, or amp) replaces it
    a.scalars = device_scalars_;
    if (device_decides()) a.amp = amp_;
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
    h.scalars = device_scalars_;
    if (device_decides()) h.amp = amp_;
    backend_.sgd_step(params_.data(), grads_.data(), buf, n, h);
  }
}

}  // namespace rd::train
