// The training step both step benchmarks time (train_step_bench, op_profile_bench):
// a ResNet with initialised parameters, one fixed random batch already on the
// device, label-smoothed (0.1) cross-entropy, backward, Adam (lr 1e-4), synchronise.
// The same work as one step of the trainer minus data loading and communication.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/nn/resnet.h"

namespace rd::bench {

class TrainStep {
 public:
  TrainStep(Backend& backend, const std::string& arch, HeadKind head, int num_classes, int batch, int size)
      : be_(backend), model_(backend, config(arch, head, num_classes)) {
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
    m_ = be_.allocate(model_.params().bytes());
    v_ = be_.allocate(model_.params().bytes());
    dlogits_ = be_.matrix(batch, num_classes);
  }

  void operator()() {
    const Tensor& logits = model_.forward(*input_);
    be_.softmax_xent(logits, labels_.data(), 0.1f, 1.f, &dlogits_, nullptr);
    model_.backward(dlogits_, false);
    Arena& params = model_.params();
    be_.adam_step(params.data(), model_.grads().data(), static_cast<float*>(m_.get()), static_cast<float*>(v_.get()),
                  params.size(), math::AdamArgs{.lr = 1e-4f, .step = ++adam_step_});
    be_.synchronize();
  }

 private:
  static ResNetConfig config(const std::string& arch, HeadKind head, int num_classes) {
    ResNetConfig cfg;
    cfg.arch = arch;
    cfg.head = head;
    cfg.num_classes = num_classes;
    return cfg;
  }

  Backend& be_;
  ResNet model_;
  Tensor* input_ = nullptr;
  std::vector<int32_t> labels_;
  std::shared_ptr<void> m_, v_;  // Adam moments
  Tensor dlogits_;
  int64_t adam_step_ = 0;
};

}  // namespace rd::bench
