#include "resnet_ddp/train/mixing.h"

#include <algorithm>
#include <cmath>

#include "resnet_ddp/errors.h"

namespace rd::train {

namespace {

// Uniform in the open interval (0, 1) from 53 random bits.
double open_uniform(std::mt19937_64& gen) {
  return (static_cast<double>(gen() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double standard_normal(std::mt19937_64& gen) {  // Box-Muller
  const double u1 = open_uniform(gen), u2 = open_uniform(gen);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// log of a Gamma(shape, 1) draw (Marsaglia and Tsang, 2000).
double log_gamma_draw(std::mt19937_64& gen, double shape) {
  if (shape < 1.0) {
    // Gamma(a) = Gamma(a + 1) * U^(1/a): in logs, so it cannot underflow to 0.
    const double boost = std::log(open_uniform(gen)) / shape;
    return log_gamma_draw(gen, shape + 1.0) + boost;
  }
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = standard_normal(gen);
    const double t = 1.0 + c * x;
    if (t <= 0.0) continue;
    const double v = t * t * t;
    if (std::log(open_uniform(gen)) < 0.5 * x * x + d - d * v + d * std::log(v)) return std::log(d) + std::log(v);
  }
}

// Uniform integer in [0, n), as torch.randint(n, (1,)).
int64_t uniform_below(std::mt19937_64& gen, int64_t n) {
  return std::min<int64_t>(n - 1, static_cast<int64_t>(open_uniform(gen) * static_cast<double>(n)));
}

}  // namespace

double sample_symmetric_beta(std::mt19937_64& gen, double alpha) {
  RD_CHECK(alpha > 0.0 && std::isfinite(alpha), "Beta(alpha, alpha): alpha " << alpha << " must be > 0");
  const double lx = log_gamma_draw(gen, alpha), ly = log_gamma_draw(gen, alpha);
  // X / (X + Y) = 1 / (1 + exp(log Y - log X)).
  return 1.0 / (1.0 + std::exp(ly - lx));
}

BatchMixing cutmix_box(double lambda, int64_t r_x, int64_t r_y, int64_t h, int64_t w) {
  const double r = 0.5 * std::sqrt(1.0 - lambda);
  const auto r_w_half = static_cast<int64_t>(r * static_cast<double>(w));
  const auto r_h_half = static_cast<int64_t>(r * static_cast<double>(h));
  BatchMixing out;
  math::ImageMix& m = out.image;
  m.cutmix = true;
  m.x0 = std::max<int64_t>(r_x - r_w_half, 0);
  m.y0 = std::max<int64_t>(r_y - r_h_half, 0);
  m.x1 = std::min<int64_t>(r_x + r_w_half, w);
  m.y1 = std::min<int64_t>(r_y + r_h_half, h);
  const double area = static_cast<double>((m.x1 - m.x0) * (m.y1 - m.y0));
  out.target_lambda = static_cast<float>(1.0 - area / static_cast<double>(w * h));
  return out;
}

BatchMixing draw_batch_mixing(const MixingOptions& o, const MixingDrawKey& key, int64_t height, int64_t width) {
  RD_CHECK(o.enabled(), "draw_batch_mixing: neither MixUp nor CutMix is on");
  RD_CHECK(height > 0 && width > 0, "draw_batch_mixing: empty image " << width << " x " << height);
  const auto lo = [](uint64_t v) { return static_cast<uint32_t>(v); };
  const auto hi = [](uint64_t v) { return static_cast<uint32_t>(v >> 32); };
  const auto ep = static_cast<uint64_t>(key.epoch), st = static_cast<uint64_t>(key.step);
  std::seed_seq seq{0x6d697875u /* "mixu" */, lo(key.seed), hi(key.seed), lo(ep), hi(ep), lo(st), hi(st),
                    static_cast<uint32_t>(key.micro), static_cast<uint32_t>(key.rank)};
  std::mt19937_64 gen(seq);
  // RandomChoice over [MixUp, CutMix] (those that are on), then the transform's own draws.
  bool cutmix = o.cutmix_alpha > 0.0;
  if (o.mixup_alpha > 0.0 && o.cutmix_alpha > 0.0) cutmix = uniform_below(gen, 2) == 1;
  const double lambda = sample_symmetric_beta(gen, cutmix ? o.cutmix_alpha : o.mixup_alpha);
  if (cutmix) {
    const int64_t r_x = uniform_below(gen, width), r_y = uniform_below(gen, height);
    return cutmix_box(lambda, r_x, r_y, height, width);
  }
  BatchMixing out;
  out.image.lambda = static_cast<float>(lambda);
  out.target_lambda = static_cast<float>(lambda);
  return out;
}

std::vector<int32_t> partner_labels(const int32_t* labels, int n) {
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out[static_cast<size_t>(i)] = labels[i == 0 ? n - 1 : i - 1];
  return out;
}

int32_t mixed_target_class(int32_t label, int32_t partner, float lambda) {
  if (label == partner) return label;
  // The two target entries as torch holds them: float(lambda) and float(1 - lambda).
  const float own = lambda, other = static_cast<float>(1.0 - static_cast<double>(lambda));
  if (own != other) return own > other ? label : partner;
  return std::min(label, partner);
}

BatchMixer::BatchMixer(Backend& backend, const MixingOptions& options, uint64_t seed, int rank)
    : backend_(&backend), options_(options) {
  key_.seed = seed;
  key_.rank = rank;
}

std::string BatchMixer::description() const {
  if (!enabled()) return "";
  const bool both = options_.mixup_alpha > 0 && options_.cutmix_alpha > 0;
  return std::string("Batch mixing: ") +
         (both ? "MixUp or CutMix (one per batch)" : options_.mixup_alpha > 0 ? "MixUp" : "CutMix") +
         " on each rank's batch, lambda ~ Beta(alpha, alpha)";
}

MixedBatch BatchMixer::mix(const Tensor& input, const int32_t* labels, int n, int64_t epoch, int64_t step,
                           int micro) {
  if (!enabled()) return {&input, labels, nullptr};
  // torchvision mixes the normalised batch; so do we (input is ToTensor + Normalize).
  // Mixing is affine, so it would commute with the normalisation anyway, up to float
  // rounding.
  key_.epoch = epoch;
  key_.step = step;
  key_.micro = micro;
  const BatchMixing m = draw_batch_mixing(options_, key_, input.shape[2], input.shape[3]);
  if (!mixed_input_.defined() || mixed_input_.shape != input.shape)
    mixed_input_ = backend_->activation(input.shape[0], input.shape[1], input.shape[2], input.shape[3]);
  backend_->mix_images(input, mixed_input_, m.image);
  partner_labels_ = partner_labels(labels, n);
  targets_ = {partner_labels_.data(), m.target_lambda};
  // Accuracy against the mixed target's argmax, as torchvision's utils.accuracy.
  target_classes_.resize(static_cast<size_t>(n));
  for (size_t i = 0; i < target_classes_.size(); ++i)
    target_classes_[i] = mixed_target_class(labels[i], partner_labels_[i], m.target_lambda);
  return {&mixed_input_, target_classes_.data(), &targets_};
}

}  // namespace rd::train
