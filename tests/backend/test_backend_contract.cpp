// The one op contract (src/backend/contract.cpp) that every backend runs
// before its implementation. A probe backend with host memory stands for any
// device and activation dtype, so these CPU tests pin down what a GPU backend
// must accept (the MLP head's F32 matrices under fp16/bf16 activations: review
// defect #1) and what every backend must refuse.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/errors.h"

using namespace rd;

namespace {

// Accepts whatever the contract lets through and records which implementation ran.
class ProbeBackend final : public Backend {
 public:
  ProbeBackend(DType act_dtype, Layout layout) : act_dtype_(act_dtype), layout_(layout) {}

  std::vector<std::string> calls;

  DeviceKind device() const override { return DeviceKind::CUDA; }  // any device: the contract only compares
  std::string name() const override { return "probe"; }
  Layout activation_layout() const override { return layout_; }
  DType activation_dtype() const override { return act_dtype_; }
  std::shared_ptr<void> allocate(size_t bytes) override {
    return std::shared_ptr<void>(new unsigned char[std::max<size_t>(bytes, 1)](), [](void* p) {
      delete[] static_cast<unsigned char*>(p);
    });
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void fill(float*, float, size_t) override {}
  void synchronize() override {}
  void copy_to_host_queued(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void wait_queued_copies() override {}
  void timing_mark(int) override {}
  double timing_seconds(int, int) override { return 0.0; }
  size_t maxpool_workspace_bytes(const Tensor& y) override { return static_cast<size_t>(y.numel()) * 4; }
  void scale(float*, float, size_t) override {}
  bool all_finite(const float*, size_t) override { return true; }
  bool unscale_and_check(float*, float, size_t) override { return true; }
  bool graph_begin() override { return false; }
  int graph_end() override { return -1; }
  bool graph_launch(int) override { return false; }
  void graph_drop(int) override {}
  uint64_t memory_events() override { return 0; }

 protected:
  // Every contracted op records its name and returns a value-initialised result
  // (generated from the op list, so a new op is probed without an edit here).
#define RD_BACKEND_OP(name, ret, params, args, kind) \
  ret name##_impl params override {                  \
    calls.push_back(#name);                          \
    return ret();                                    \
  }
#include "resnet_ddp/backend/ops.def"

 private:
  DType act_dtype_;
  Layout layout_;
};

bool called(const ProbeBackend& be, const std::string& op) {
  for (const auto& c : be.calls)
    if (c == op) return true;
  return false;
}

struct Config {
  DType dtype;
  Layout layout;
};

const Config kConfigs[] = {
    {DType::F32, Layout::NHWC}, {DType::F16, Layout::NHWC}, {DType::BF16, Layout::NHWC},
    {DType::F16, Layout::NCHW}, {DType::F32, Layout::NCHW16C}, {DType::F32, Layout::NCHW8C},
};

}  // namespace

TEST_CASE("contract: relu takes the MLP head's F32 matrix under every activation dtype", "[kernel][contract]") {
  for (const Config& cfg : kConfigs) {
    ProbeBackend be(cfg.dtype, cfg.layout);
    INFO("activations " << dtype_name(cfg.dtype) << " " << layout_name(cfg.layout));
    // The head: linear (N, 512) -> ReLU -> linear, all RowMajor F32 matrices.
    Tensor h = be.matrix(16, 512), r = be.matrix(16, 512), dr = be.matrix(16, 512), dh = be.matrix(16, 512);
    REQUIRE_NOTHROW(be.relu_forward(h, r));
    REQUIRE_NOTHROW(be.relu_backward(r, dr, dh));
    REQUIRE_NOTHROW(be.relu_forward(h, h));  // in place
    CHECK(called(be, "relu_forward"));
    CHECK(called(be, "relu_backward"));
    // And 4-D activations in the backend's own dtype and layout.
    Tensor x = be.activation(2, 32, 3, 3), y = be.activation(2, 32, 3, 3);
    REQUIRE_NOTHROW(be.relu_forward(x, y));
    // A matrix and an activation do not mix, nor do other matrix dtypes.
    CHECK_THROWS_AS(be.relu_forward(x, r), Error);
    Tensor h16 = be.tensor(Shape{16, 512}, Layout::RowMajor, DType::F16);
    CHECK_THROWS_AS(be.relu_forward(h16, h16), Error);
  }
}

TEST_CASE("contract: activations are 4-D, in the backend's layout and activation dtype", "[kernel][contract]") {
  ProbeBackend be(DType::F16, Layout::NHWC);
  Tensor good = be.activation(2, 16, 4, 4), out = be.activation(2, 16, 4, 4);
  REQUIRE_NOTHROW(be.add_forward(good, good, true, out));
  Tensor f32 = be.tensor(Shape{2, 16, 4, 4}, Layout::NHWC, DType::F32);
  CHECK_THROWS_AS(be.add_forward(f32, f32, false, out), Error);
  Tensor nchw = be.tensor(Shape{2, 16, 4, 4}, Layout::NCHW, DType::F16);
  CHECK_THROWS_AS(be.add_forward(nchw, nchw, false, out), Error);
  Tensor matrix = be.tensor(Shape{2, 16}, Layout::RowMajor, DType::F16);
  CHECK_THROWS_AS(be.add_forward(matrix, matrix, false, matrix), Error);
  // Another device's tensor.
  Tensor host = good;
  host.device = DeviceKind::CPU;
  CHECK_THROWS_AS(be.add_forward(host, good, false, out), Error);

  // nChw16c applies only where channels fill its blocks: 3 channels are NCHW.
  ProbeBackend blocked(DType::F32, Layout::NCHW16C);
  Tensor image = blocked.activation(2, 3, 8, 8);
  CHECK(image.layout == Layout::NCHW);
  std::vector<float> host_image(static_cast<size_t>(image.numel()));
  REQUIRE_NOTHROW(blocked.copy_from_host_nchw(host_image.data(), image));
  Tensor image16 = blocked.tensor(Shape{2, 3, 8, 8}, Layout::NCHW16C);
  CHECK_THROWS_AS(blocked.copy_from_host_nchw(host_image.data(), image16), Error);
}

TEST_CASE("contract: convolution shapes, weight layout and aliasing", "[kernel][contract]") {
  ProbeBackend be(DType::BF16, Layout::NHWC);
  const ConvGeometry g{3, 2, 1};
  Tensor x = be.activation(2, 8, 9, 9), y = be.activation(2, 16, 5, 5);
  Tensor w = be.tensor(Shape{16, 8, 3, 3}, Layout::RowMajor);
  REQUIRE_NOTHROW(be.conv2d_forward(x, w, y, g));
  REQUIRE_NOTHROW(be.conv2d_backward_data(y, w, x, g));
  REQUIRE_NOTHROW(be.conv2d_backward_weights(x, y, w, g, true));
  Tensor wrong_y = be.activation(2, 16, 4, 5);
  CHECK_THROWS_AS(be.conv2d_forward(x, w, wrong_y, g), Error);
  Tensor wrong_w = be.tensor(Shape{16, 4, 3, 3}, Layout::RowMajor);
  CHECK_THROWS_AS(be.conv2d_forward(x, wrong_w, y, g), Error);
  Tensor bf16_w = be.tensor(Shape{16, 8, 3, 3}, Layout::RowMajor, DType::BF16);
  CHECK_THROWS_AS(be.conv2d_forward(x, bf16_w, y, g), Error);
  CHECK_THROWS_AS(be.conv2d_forward(x, w, y, ConvGeometry{3, 0, 1}), Error);
  // Grouped: the weight is (O, I / groups, k, k); groups must divide both channel counts.
  REQUIRE_NOTHROW(be.conv2d_forward(x, wrong_w, y, ConvGeometry{3, 2, 1, 2}));
  CHECK_THROWS_AS(be.conv2d_forward(x, w, y, ConvGeometry{3, 2, 1, 2}), Error);
  CHECK_THROWS_AS(be.conv2d_forward(x, wrong_w, y, ConvGeometry{3, 2, 1, 0}), Error);
  Tensor w_g3 = be.tensor(Shape{16, 3, 3, 3}, Layout::RowMajor);
  CHECK_THROWS_AS(be.conv2d_forward(x, w_g3, y, ConvGeometry{3, 2, 1, 3}), Error);
  // The output may not share memory with the input.
  Tensor same = be.activation(1, 8, 4, 4);
  Tensor w1 = be.tensor(Shape{8, 8, 1, 1}, Layout::RowMajor);
  CHECK_THROWS_AS(be.conv2d_forward(same, w1, same, ConvGeometry{1, 1, 0}), Error);
}

TEST_CASE("contract: elementwise outputs are the input itself or disjoint from it", "[kernel][contract]") {
  ProbeBackend be(DType::F32, Layout::NHWC);
  Tensor a = be.activation(2, 4, 4, 4);
  REQUIRE_NOTHROW(be.relu_forward(a, a));
  Tensor shifted = a;
  shifted.data = static_cast<char*>(a.data) + 4;  // overlaps a by all but one element
  shifted.owner.reset();
  CHECK_THROWS_AS(be.relu_forward(a, shifted), Error);
  CHECK_THROWS_AS(be.accumulate(a, a), Error);
}

TEST_CASE("contract: batch norm, pooling, linear, loss and optimizer arguments", "[kernel][contract]") {
  ProbeBackend be(DType::F16, Layout::NHWC);
  Tensor x = be.activation(4, 8, 3, 3), y = be.activation(4, 8, 3, 3), dx = be.activation(4, 8, 3, 3);
  std::vector<float> vec(8, 1.f), mean(8), invstd(8), dgamma(8), dbeta(8);
  BatchNormArgs a;
  a.gamma = vec.data(), a.beta = vec.data(), a.running_mean = mean.data(), a.running_var = vec.data();
  a.relu = true;
  BatchNormSaved saved;
  saved.mean = mean.data(), saved.invstd = invstd.data();
  BatchNormGrads grads;
  grads.dgamma = dgamma.data(), grads.dbeta = dbeta.data();
  REQUIRE_NOTHROW(be.batchnorm_forward_train(x, a, y, saved));
  REQUIRE_NOTHROW(be.batchnorm_backward(x, y, y, a, saved, dx, grads));
  BatchNormArgs no_eps = a;
  no_eps.eps = 0.f;
  CHECK_THROWS_AS(be.batchnorm_forward_train(x, no_eps, y, saved), Error);
  BatchNormArgs no_gamma = a;
  no_gamma.gamma = nullptr;
  CHECK_THROWS_AS(be.batchnorm_forward_eval(x, no_gamma, y), Error);
  CHECK_THROWS_AS(be.batchnorm_backward(x, y, y, a, saved, x, grads), Error);  // dx aliases x

  Tensor pooled = be.activation(4, 8, 2, 2);
  std::vector<int32_t> ws(64);
  REQUIRE_NOTHROW(be.maxpool_forward(x, pooled, 3, 2, 1, ws.data()));
  CHECK_THROWS_AS(be.maxpool_forward(x, pooled, 3, 2, 2, ws.data()), Error);  // pad > kernel / 2
  CHECK_THROWS_AS(be.maxpool_forward(x, pooled, 3, 2, 1, nullptr), Error);
  Tensor features = be.matrix(4, 8);
  REQUIRE_NOTHROW(be.global_avgpool_forward(x, features));
  CHECK_THROWS_AS(be.global_avgpool_forward(x, y), Error);

  Tensor w = be.matrix(10, 8), logits = be.matrix(4, 10), dlogits = be.matrix(4, 10), dw = be.matrix(10, 8);
  REQUIRE_NOTHROW(be.linear_forward(features, w, nullptr, logits));
  Tensor dfeatures = be.matrix(4, 8);
  REQUIRE_NOTHROW(be.linear_backward(features, w, dlogits, &dfeatures, dw, nullptr, false));
  CHECK_THROWS_AS(be.linear_backward(features, w, dlogits, &features, dw, nullptr, false), Error);
  CHECK_THROWS_AS(be.linear_forward(features, dw, nullptr, features), Error);
  const int32_t labels[4] = {0, 9, 3, 2}, bad_labels[4] = {0, 10, 3, 2};
  REQUIRE_NOTHROW(be.softmax_xent(logits, labels, 0.1f, 1.f, &dlogits, nullptr));
  CHECK_THROWS_AS(be.softmax_xent(logits, bad_labels, 0.1f, 1.f, &dlogits, nullptr), Error);
  CHECK_THROWS_AS(be.softmax_xent(logits, labels, 1.5f, 1.f, nullptr, nullptr), Error);

  std::vector<float> p(5), gr(5), m(5), v(5);
  REQUIRE_NOTHROW(be.adam_step(p.data(), gr.data(), m.data(), v.data(), 5, math::AdamArgs{.lr = 1e-3f, .step = 1}));
  CHECK_THROWS_AS(be.adam_step(p.data(), gr.data(), m.data(), v.data(), 5, math::AdamArgs{.lr = 1e-3f, .step = 0}),
                  Error);
  math::SgdHyper sgd{};
  sgd.lr = 0.1f, sgd.momentum = 0.9f;
  CHECK_THROWS_AS(be.sgd_step(p.data(), gr.data(), nullptr, 5, sgd), Error);
  sgd.momentum = 0.f;
  REQUIRE_NOTHROW(be.sgd_step(p.data(), gr.data(), nullptr, 5, sgd));
  // The step's scalars: a finite, non-negative lr and a whole step count (0: the device counts).
  math::OptimizerStepScalars block;
  REQUIRE_NOTHROW(be.set_optimizer_scalars(&block, math::OptimizerStepScalars{0.0, 0.0}));
  REQUIRE_NOTHROW(be.set_optimizer_scalars(&block, math::OptimizerStepScalars{0.1, 3.0}));
  CHECK(called(be, "set_optimizer_scalars"));
  CHECK_THROWS_WITH(be.set_optimizer_scalars(nullptr, math::OptimizerStepScalars{0.1, 1.0}),
                    Catch::Contains("destination"));
  for (const double lr : {-0.1, static_cast<double>(INFINITY), static_cast<double>(NAN)})
    CHECK_THROWS_WITH(be.set_optimizer_scalars(&block, math::OptimizerStepScalars{lr, 1.0}),
                      Catch::Contains("learning rate"));
  for (const double steps : {-1.0, 1.5})
    CHECK_THROWS_WITH(be.set_optimizer_scalars(&block, math::OptimizerStepScalars{0.1, steps}),
                      Catch::Contains("step count"));

  // Per-segment ops: ordered ranges, the state buffers the rule uses.
  const int64_t ranges[4] = {0, 2, 3, 5}, overlapping[4] = {0, 3, 2, 5}, reversed[4] = {0, 2, 5, 3};
  const float decay[2] = {0.1f, 0.f}, scale[2] = {1.f, 1.f};
  double sums[2];
  REQUIRE_NOTHROW(be.segment_sum_squares(p.data(), ranges, 2, sums));
  CHECK_THROWS_WITH(be.segment_sum_squares(p.data(), overlapping, 2, sums), Catch::Contains("segment 1"));
  CHECK_THROWS_AS(be.segment_sum_squares(p.data(), reversed, 2, sums), Error);
  CHECK_THROWS_AS(be.segment_sum_squares(p.data(), ranges, 2, nullptr), Error);
  math::SegmentHyper h;
  h.rule = math::SegmentRule::AdamW;
  REQUIRE_NOTHROW(be.segment_step(p.data(), gr.data(), m.data(), v.data(), ranges, 2, decay, scale, h));
  CHECK_THROWS_WITH(be.segment_step(p.data(), gr.data(), m.data(), nullptr, ranges, 2, decay, scale, h),
                    Catch::Contains("state buffers"));
  h.rule = math::SegmentRule::Lars, h.momentum = 0.9f;
  CHECK_THROWS_AS(be.segment_step(p.data(), gr.data(), nullptr, nullptr, ranges, 2, decay, scale, h), Error);
  h.momentum = 0.f;
  REQUIRE_NOTHROW(be.segment_step(p.data(), gr.data(), nullptr, nullptr, ranges, 2, decay, scale, h));
  h.grad_divisor = 0.f;
  CHECK_THROWS_AS(be.segment_step(p.data(), gr.data(), nullptr, nullptr, ranges, 2, decay, scale, h), Error);
}

TEST_CASE("cuda_device_for_rank: one GPU per task, or GPU i for local rank i", "[kernel][contract]") {
  // Slurm --gpus-per-task=1: every rank sees one GPU, index 0.
  for (int r = 0; r < 4; ++r) CHECK(cuda_device_for_rank(r, 4, 1) == 0);
  // All GPUs visible to every rank.
  for (int r = 0; r < 4; ++r) CHECK(cuda_device_for_rank(r, 4, 4) == r);
  CHECK(cuda_device_for_rank(1, 2, 4) == 1);
  // Several GPUs but more ranks than GPUs: they would share one; no GPU at all.
  CHECK(cuda_device_for_rank(3, 4, 2) == -1);
  CHECK(cuda_device_for_rank(0, 1, 0) == -1);
}

TEST_CASE("contract: mix_images and softmax_xent_mixed (MixUp / CutMix)", "[kernel][contract]") {
  ProbeBackend be(DType::F32, Layout::NHWC);
  Tensor src = be.activation(4, 3, 6, 5), dst = be.activation(4, 3, 6, 5), other = be.activation(4, 3, 5, 5);
  math::ImageMix cut;
  cut.cutmix = true;
  cut.x0 = 1, cut.y0 = 2, cut.x1 = 5, cut.y1 = 6;  // x < W = 5, y < H = 6
  REQUIRE_NOTHROW(be.mix_images(src, dst, cut));
  CHECK(called(be, "mix_images"));
  CHECK_THROWS_AS(be.mix_images(src, src, cut), Error);    // dst_i reads src_{i-1}: never in place
  CHECK_THROWS_AS(be.mix_images(src, other, cut), Error);  // shapes differ
  cut.x1 = 6;                                              // past the width
  CHECK_THROWS_AS(be.mix_images(src, dst, cut), Error);
  cut.x1 = 5, cut.x0 = 5, cut.y0 = 6;  // empty box: fine
  CHECK_NOTHROW(be.mix_images(src, dst, cut));
  math::ImageMix mixup;
  mixup.lambda = 1.5f;
  CHECK_THROWS_AS(be.mix_images(src, dst, mixup), Error);

  Tensor logits = be.matrix(3, 4), dlogits = be.matrix(3, 4), wrong = be.matrix(3, 5);
  const int32_t labels[3] = {0, 3, 1}, partners[3] = {1, 0, 3}, bad[3] = {1, 4, 0};
  REQUIRE_NOTHROW(be.softmax_xent_mixed(logits, labels, partners, 0.4f, 0.1f, 1.f, &dlogits, nullptr));
  CHECK(called(be, "softmax_xent_mixed"));
  CHECK_THROWS_AS(be.softmax_xent_mixed(logits, labels, bad, 0.4f, 0.1f, 1.f, &dlogits, nullptr), Error);
  CHECK_THROWS_AS(be.softmax_xent_mixed(logits, labels, partners, -0.1f, 0.1f, 1.f, &dlogits, nullptr), Error);
  CHECK_THROWS_AS(be.softmax_xent_mixed(logits, labels, partners, 0.4f, 1.5f, 1.f, &dlogits, nullptr), Error);
  CHECK_THROWS_AS(be.softmax_xent_mixed(logits, labels, nullptr, 0.4f, 0.1f, 1.f, &dlogits, nullptr), Error);
  CHECK_THROWS_AS(be.softmax_xent_mixed(logits, labels, partners, 0.4f, 0.1f, 1.f, &wrong, nullptr), Error);
}

TEST_CASE("contract: softmax_xent_sums checks labels, targets and the sums buffer", "[kernel][contract]") {
  ProbeBackend be(DType::F32, Layout::NHWC);
  Tensor logits = be.matrix(3, 4), dlogits = be.matrix(3, 4), wrong = be.matrix(3, 5);
  const int32_t labels[3] = {0, 3, 1}, partners[3] = {1, 0, 3}, bad[3] = {1, 4, 0};
  double sums[3] = {0, 0, 0};
  REQUIRE_NOTHROW(be.softmax_xent_sums(logits, labels, nullptr, 1.f, 0.1f, 1.f, &dlogits, labels, sums, nullptr));
  CHECK(called(be, "softmax_xent_sums"));
  CHECK_NOTHROW(be.softmax_xent_sums(logits, labels, partners, 0.4f, 0.1f, 1.f, nullptr, partners, sums, nullptr));
  CHECK_THROWS_AS(be.softmax_xent_sums(logits, bad, nullptr, 1.f, 0.1f, 1.f, &dlogits, labels, sums, nullptr), Error);
  CHECK_THROWS_AS(be.softmax_xent_sums(logits, labels, bad, 0.4f, 0.1f, 1.f, &dlogits, labels, sums, nullptr), Error);
  CHECK_THROWS_AS(be.softmax_xent_sums(logits, labels, nullptr, 1.f, 0.1f, 1.f, &dlogits, bad, sums, nullptr), Error);
  CHECK_THROWS_AS(be.softmax_xent_sums(logits, labels, nullptr, 1.f, 0.1f, 1.f, &dlogits, nullptr, sums, nullptr), Error);
  CHECK_THROWS_AS(be.softmax_xent_sums(logits, labels, nullptr, 1.f, 0.1f, 1.f, &dlogits, labels, nullptr, nullptr), Error);
  CHECK_THROWS_AS(be.softmax_xent_sums(logits, labels, partners, 1.5f, 0.1f, 1.f, &dlogits, labels, sums, nullptr), Error);
  CHECK_THROWS_AS(be.softmax_xent_sums(logits, labels, nullptr, 1.f, 0.1f, 1.f, &wrong, labels, sums, nullptr), Error);
}
