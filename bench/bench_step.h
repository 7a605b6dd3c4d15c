// The training step both step benchmarks time (train_step_bench, op_profile_bench):
// the trainer's TrainStep on a ResNet with initialised parameters and one fixed
// random batch already on the device: label-smoothed (0.1) cross-entropy, backward,
// the optimizer (Adam lr 1e-4, or torchvision's SGD recipe), synchronise. One step of the trainer minus data loading and
// communication.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/train/optimizer.h"
#include "resnet_ddp/train/train_step.h"

namespace rd::bench {

class TrainStep {
 public:
  TrainStep(Backend& backend, const std::string& arch, HeadKind head, int num_classes, int batch, int size,
            const std::string& optimizer = "adam")
      : be_(backend),
        model_(backend, config(arch, head, num_classes)),
        opt_(backend, model_.params(), model_.grads(), optimizer_config(optimizer)),
        step_(model_, opt_, nullptr, 0.1f) {
    model_.init_parameters(0);
    model_.train(true);
    std::mt19937 rng(0);
    std::normal_distribution<float> normal;
    std::vector<float> host(static_cast<size_t>(batch) * 3 * static_cast<size_t>(size) * static_cast<size_t>(size));
    for (float& v : host) v = normal(rng);
    labels_.resize(static_cast<size_t>(batch));
    for (size_t i = 0; i < labels_.size(); ++i) labels_[i] = static_cast<int32_t>(i % static_cast<size_t>(num_classes));
    input_ = &model_.input_buffer(batch, size, size);
    be_.copy_from_host_nchw(host.data(), *input_);
  }

  void operator()() {
    step_.forward(*input_, labels_.data());
    step_.backward_and_reduce();
    step_.update();
    be_.synchronize();
  }

 private:
  // adam: OptimizerConfig's defaults (the tutorial's Adam, lr 1e-4). sgd: torchvision's
  // recipe, whose --norm-weight-decay 0 takes the per-tensor (segment) update.
  static train::OptimizerConfig optimizer_config(const std::string& name) {
    train::OptimizerConfig c;
    if (name == "sgd") {
      c.type = train::OptimizerKind::Sgd;
      c.lr = 0.1, c.momentum = 0.9, c.weight_decay = 1e-4, c.norm_weight_decay = 0.0;
    }
    return c;
  }

  static ResNetConfig config(const std::string& arch, HeadKind head, int num_classes) {
    ResNetConfig cfg;
    cfg.arch = arch;
    cfg.head = head;
    cfg.num_classes = num_classes;
    return cfg;
  }

  Backend& be_;
  ResNet model_;
  train::Optimizer opt_;
  train::TrainStep step_;
  Tensor* input_ = nullptr;
  std::vector<int32_t> labels_;
};

}  // namespace rd::bench
