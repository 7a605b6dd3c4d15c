// A Backend decorator for the parity driver: forwards every call to the real
// backend and, while recording, keeps each ReLU decision (fused BN+ReLU, add+ReLU,
// plain ReLU) and the max-pool input of the forward pass.
//
// Why: an activation within rounding of zero can switch a ReLU (or a near-tie can
// switch a max-pool window) between any two float32 implementations, and then the
// gradients of every earlier layer differ by far more than 1e-4 — PyTorch float32
// differs from PyTorch float64 that way too. ResNet-50 at 160x200 has ~16 ReLU
// inputs within 1e-7 of the tensor maximum, so such ties are not avoidable by
// choosing inputs. The parity script therefore replays resnet_ddp's decisions in
// the float64 PyTorch reference (and counts how many differ from float64's own,
// all of which must be within rounding of the kink).
//
// Every other call is forwarded unchanged by ForwardingBackend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/forwarding_backend.h"

namespace rd::parity {

struct ReluRecord {
  std::string kind;  // bn_relu | add_relu | relu
  std::vector<int64_t> dims;
  std::vector<uint8_t> kept;  // 1 where the output is > 0, in NCHW (or row-major) order
};

class RecordingBackend final : public ForwardingBackend {
 public:
  explicit RecordingBackend(Backend& inner) : ForwardingBackend(inner) {}

  bool recording = false;
  std::vector<ReluRecord> relus;
  std::vector<int64_t> maxpool_dims;
  std::vector<float> maxpool_input;  // NCHW


 protected:
  void batchnorm_forward_train_impl(const Tensor& x, const BatchNormArgs& a, Tensor& y,
                                    BatchNormSaved& saved) override {
    ForwardingBackend::batchnorm_forward_train_impl(x, a, y, saved);
    if (a.relu) record("bn_relu", y);
  }
  void relu_forward_impl(const Tensor& x, Tensor& y) override {
    ForwardingBackend::relu_forward_impl(x, y);
    record("relu", y);
  }
  void add_forward_impl(const Tensor& a, const Tensor& b, bool relu, Tensor& y) override {
    ForwardingBackend::add_forward_impl(a, b, relu, y);
    if (relu) record("add_relu", y);
  }
  void maxpool_forward_impl(const Tensor& x, Tensor& y, int kernel, int stride, int pad, void* workspace) override {
    if (recording) {
      maxpool_dims = x.shape.vec();
      maxpool_input.resize(static_cast<size_t>(x.numel()));
      inner().copy_to_host_nchw(x, maxpool_input.data());
    }
    ForwardingBackend::maxpool_forward_impl(x, y, kernel, stride, pad, workspace);
  }

 private:
  void record(const char* kind, const Tensor& y) {
    if (!recording) return;
    ReluRecord r;
    r.kind = kind;
    r.dims = y.shape.vec();
    std::vector<float> host(static_cast<size_t>(y.numel()));
    if (y.shape.rank == 4)
      inner().copy_to_host_nchw(y, host.data());
    else
      inner().copy_to_host(host.data(), y.data, host.size() * sizeof(float));
    r.kept.resize(host.size());
    for (size_t i = 0; i < host.size(); ++i) r.kept[i] = host[i] > 0.f ? 1 : 0;
    relus.push_back(std::move(r));
  }
};

}  // namespace rd::parity
