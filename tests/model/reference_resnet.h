// A float64 ResNet forward built from the reference ops and a model's own
// parameter names: the structure (blocks, downsample branches, bottlenecks,
// head) is read from the torchvision names present, so the same code follows
// resnet_tiny, resnet18/34 and resnet50. The model tests compare logits,
// running statistics and finite-difference gradients against it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "backend/backend_checks.h"
#include "reference/reference_ops.h"
#include "resnet_ddp/nn/resnet.h"

namespace rd::test {

// Host copy (double) of every parameter and buffer of a model, by name.
struct HostState {
  std::map<std::string, ref::Vec> values;
  std::map<std::string, Shape> shapes;

  bool has(const std::string& name) const { return values.count(name) != 0; }
  ref::Vec& at(const std::string& name) {
    auto it = values.find(name);
    if (it == values.end()) throw std::invalid_argument("reference resnet: no tensor '" + name + "'");
    return it->second;
  }
  const Shape& shape(const std::string& name) const { return shapes.at(name); }
};

inline void add_arena(Backend& be, Arena& arena, HostState& st) {
  for (size_t i = 0; i < arena.slices().size(); ++i) {
    const ParamSlice& s = arena.slice(i);
    std::vector<float> host(s.count);
    be.copy_to_host(host.data(), arena.ptr(i), s.count * sizeof(float));
    st.values[s.name] = to_double(host);
    st.shapes[s.name] = s.shape;
  }
}

inline HostState download_state(ResNet& model) {
  HostState st;
  add_arena(model.backend(), model.params(), st);
  add_arena(model.backend(), model.buffers(), st);
  return st;
}

inline void upload_arena(Backend& be, Arena& arena, const HostState& st) {
  for (size_t i = 0; i < arena.slices().size(); ++i) {
    const auto host = to_float(st.values.at(arena.slice(i).name));
    be.copy_from_host(arena.ptr(i), host.data(), host.size() * sizeof(float));
  }
}

// Forward pass in double. Training mode normalises with batch statistics and
// updates the running statistics in `st` (momentum 0.1, eps 1e-5), as the model does.
inline ref::Mat reference_resnet_forward(HostState& st, const ref::Act& x, bool training) {
  const double momentum = 0.1, eps = 1e-5;
  auto conv = [&](const ref::Act& in, const std::string& name, int stride) {
    const Shape& s = st.shape(name + ".weight");
    const int k = static_cast<int>(s[2]);
    return ref::conv2d_forward(in, st.at(name + ".weight"), s[0], k, stride, k / 2);
  };
  auto bn = [&](const ref::Act& in, const std::string& name, bool relu) {
    const ref::Vec& g = st.at(name + ".weight");
    const ref::Vec& b = st.at(name + ".bias");
    ref::Vec& rm = st.at(name + ".running_mean");
    ref::Vec& rv = st.at(name + ".running_var");
    if (training) return ref::batchnorm_forward_train(in, g, b, rm, rv, momentum, eps, relu).y;
    return ref::batchnorm_forward_eval(in, g, b, rm, rv, eps, relu);
  };
  auto linear = [&](const ref::Mat& in, const std::string& name) {
    const Shape& s = st.shape(name + ".weight");
    ref::Mat w(s[0], s[1]);
    w.v = st.at(name + ".weight");
    return ref::linear_forward(in, w, st.at(name + ".bias"));
  };

  ref::Act h = ref::maxpool_forward(bn(conv(x, "conv1", 2), "bn1", true), 3, 2, 1).y;
  for (int stage = 1; stage <= 4; ++stage) {
    for (int b = 0;; ++b) {
      const std::string p = "layer" + std::to_string(stage) + "." + std::to_string(b);
      if (!st.has(p + ".conv1.weight")) break;
      const int stride = (stage > 1 && b == 0) ? 2 : 1;
      ref::Act out;
      if (st.has(p + ".conv3.weight")) {  // Bottleneck: stride on the 3x3 conv
        out = bn(conv(h, p + ".conv1", 1), p + ".bn1", true);
        out = bn(conv(out, p + ".conv2", stride), p + ".bn2", true);
        out = bn(conv(out, p + ".conv3", 1), p + ".bn3", false);
      } else {
        out = bn(conv(h, p + ".conv1", stride), p + ".bn1", true);
        out = bn(conv(out, p + ".conv2", 1), p + ".bn2", false);
      }
      const ref::Act identity = st.has(p + ".downsample.0.weight")
                                    ? bn(conv(h, p + ".downsample.0", stride), p + ".downsample.1", false)
                                    : h;
      h = ref::add_forward(out, identity, true);
    }
  }
  const ref::Mat pooled = ref::global_avgpool_forward(h);
  if (st.has("fc.weight")) return linear(pooled, "fc");
  ref::Mat hidden = linear(pooled, "fc.0");
  for (double& v : hidden.v) v = v > 0 ? v : 0;
  return linear(hidden, "fc.2");
}

}  // namespace rd::test
