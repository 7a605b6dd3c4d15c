// ResNet-18/34/50 exactly as torchvision builds them (BasicBlock / Bottleneck with
// the stride on the 3x3 conv, downsample = 1x1 conv + BN), with either the plain
// `fc` head or the reference recipe's Linear(C,C) -> ReLU -> Linear(C,K) head
// (`fc.0`, `fc.2`). Parameters live in flat arenas (see arena.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/backend/names.h"
#include "resnet_ddp/nn/arena.h"

namespace rd {

enum class HeadKind { Fc, Mlp };

struct ResNetConfig {
  // resnet18 | resnet34 | resnet50 | resnet101 | resnet152 | wide_resnet50_2 |
  // resnext50_32x4d | resnet_tiny (tests)
  std::string arch = "resnet34";
  HeadKind head = HeadKind::Mlp;
  int num_classes = 3;
  uint64_t init_seed = 0;
};

// Accepts the names above (torchvision's); throws UsageError otherwise.
void validate_arch(const std::string& arch);
HeadKind parse_head(const std::string& head);
const char* head_name(HeadKind h);
inline NameTable<HeadKind> head_names() { return {{"mlp", HeadKind::Mlp}, {"fc", HeadKind::Fc}}; }

// Hooks the model calls during backward, in the order gradients are produced.
struct BackwardHooks {
  virtual ~BackwardHooks() = default;
  // Parameter `index` (into params().slices()) now holds its final gradient.
  virtual void on_grad_ready(size_t index) = 0;
  // Called between layers: a chance to progress outstanding communication.
  virtual void poll() {}
};

class ResNet {
 public:
  ResNet(Backend& backend, const ResNetConfig& cfg);
  ~ResNet();
  ResNet(const ResNet&) = delete;
  ResNet& operator=(const ResNet&) = delete;

  const ResNetConfig& config() const;
  Backend& backend();
  Arena& params();   // trainable parameters
  Arena& grads();    // same slices as params()
  Arena& buffers();  // running_mean / running_var of every BN
  int64_t num_batches_tracked() const;
  void set_num_batches_tracked(int64_t n);
  // A recorded training forward (a CUDA graph) ran again without forward(): its host-side
  // bookkeeping (num_batches_tracked).
  void forward_replayed();
  // Trainable elements (the arena's alignment padding not counted), as PyTorch counts them.
  size_t num_parameters() const;

  // Kaiming-normal (fan_out, relu) convs, BN weight 1 / bias 0, torchvision's
  // Linear init (kaiming-uniform a=sqrt(5), bias U(-1/sqrt(in), 1/sqrt(in))).
  void init_parameters(uint64_t seed);

  void train(bool on);  // train vs eval mode (BN batch vs running stats)
  bool training() const;
  // SyncBatchNorm: statistics summed over ranks through `reducer` (null = local).
  void set_batchnorm_reducer(ChannelReducer* reducer);

  // Forward pass on an input activation (N, 3, H, W); returns logits (N, K).
  // Buffers are sized for the first (N, H, W) seen and regrown when it changes,
  // so steady-state training allocates nothing.
  const Tensor& forward(const Tensor& input);
  // Backward from d(loss)/d(logits). Gradients are written (or added when
  // `accumulate`) into grads(); hooks fire as each parameter's gradient is final.
  void backward(const Tensor& dlogits, bool accumulate, BackwardHooks* hooks = nullptr);
  // Input gradient of the last backward (for gradient checks); only kept when
  // enabled before backward.
  void keep_input_grad(bool on);
  const Tensor& input_grad() const;

  // Every convolution of a forward on an (n, 3, h, w) input, and when `training` of its
  // backward, planned now (Backend::plan_convolution), so no algorithm search runs
  // inside a timed step. Changes no parameter, buffer or statistic.
  void plan_convolutions(int64_t n, int64_t h, int64_t w, bool training);
  // Convenience: input activation buffer of the right shape for this backend.
  Tensor& input_buffer(int64_t n, int64_t h, int64_t w);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// torchvision parameter counts (plain fc, 1000 classes) for the self-check.
int64_t torchvision_param_count(const std::string& arch);

}  // namespace rd
