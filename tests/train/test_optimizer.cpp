// Optimizers over the flat arena, against PyTorch 1.13's numbers (schedulers: test_scheduler.cpp).
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/train/optimizer.h"
#include "resnet_ddp/train/train_step.h"
#include "train/parse_cli.h"
#include "train/train_test_util.h"

using namespace rd;
using namespace rd::train;
using rd::test::host;

TEST_CASE("Adam and SGD over the flat arena follow PyTorch's update", "[train]") {
  auto be = make_cpu_backend({});
  Arena params, grads;
  params.add("a", Shape{3});
  params.add("b", Shape{2, 2});
  grads.add("a", Shape{3});
  grads.add("b", Shape{2, 2});
  params.allocate(*be);
  grads.allocate(*be);
  std::vector<float> p0 = {0.5f, -1.f, 2.f, 0.1f, 0.2f, -0.3f, 0.4f};

  auto load = [&](const std::vector<float>& v, Arena& a) {
    be->copy_from_host(a.ptr(0), v.data(), 3 * sizeof(float));
    be->copy_from_host(a.ptr(1), v.data() + 3, 4 * sizeof(float));
  };
  auto read = [&](Arena& a) {
    std::vector<float> v = host(*be, a.ptr(0), 3), w = host(*be, a.ptr(1), 4);
    v.insert(v.end(), w.begin(), w.end());
    return v;
  };
  const std::vector<std::vector<float>> g = {{0.1f, -0.2f, 0.3f, 0.05f, 0.0f, -0.4f, 1.0f},
                                             {-0.3f, 0.1f, 0.2f, 0.5f, 0.25f, 0.1f, -1.0f},
                                             {0.2f, 0.2f, -0.1f, -0.05f, 0.3f, 0.2f, 0.5f}};

  SECTION("adam with weight decay") {
    load(p0, params);
    OptimizerConfig cfg;
    cfg.lr = 0.01;
    cfg.weight_decay = 0.1;
    Optimizer opt(*be, params, grads, cfg);
    std::vector<double> p(p0.begin(), p0.end()), m(7, 0.0), v(7, 0.0);
    for (int t = 1; t <= 3; ++t) {
      load(g[static_cast<size_t>(t - 1)], grads);
      opt.step();
      for (size_t i = 0; i < 7; ++i) {
        const double gi = g[static_cast<size_t>(t - 1)][i] + 0.1 * p[i];
        m[i] = 0.9 * m[i] + 0.1 * gi;
        v[i] = 0.999 * v[i] + 0.001 * gi * gi;
        const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(0.999, t)) + 1e-8;
        p[i] -= 0.01 / (1 - std::pow(0.9, t)) * m[i] / denom;
      }
    }
    CHECK(opt.steps() == 3);
    std::vector<float> got = read(params);
    for (size_t i = 0; i < 7; ++i) CHECK(got[i] == Approx(p[i]).epsilon(1e-5));
  }
  SECTION("sgd with momentum seeds the buffer with the first gradient") {
    load(p0, params);
    OptimizerConfig cfg;
    cfg.type = OptimizerKind::Sgd;
    cfg.lr = 0.1;
    cfg.momentum = 0.9;
    Optimizer opt(*be, params, grads, cfg);
    REQUIRE(opt.state_count() == 1);
    std::vector<double> p(p0.begin(), p0.end()), buf(7, 0.0);
    for (int t = 1; t <= 3; ++t) {
      load(g[static_cast<size_t>(t - 1)], grads);
      opt.step();
      for (size_t i = 0; i < 7; ++i) {
        const double gi = g[static_cast<size_t>(t - 1)][i];
        buf[i] = t == 1 ? gi : 0.9 * buf[i] + gi;
        p[i] -= 0.1 * buf[i];
      }
    }
    std::vector<float> got = read(params);
    for (size_t i = 0; i < 7; ++i) CHECK(got[i] == Approx(p[i]).epsilon(1e-5));
  }
}

// ---- torchvision's and timm's recipes: AdamW, RMSprop, LARS, LAMB, param-group decays, gradient clipping --------------
// (their trajectories against torch / timm: tests/train/check_optimizers_vs_torch.py)

TEST_CASE("torchvision's norm and bias weight-decay groups by parameter name", "[train]") {
  auto be = make_cpu_backend({});
  auto model = rd::test::trained_tiny(*be, HeadKind::Mlp, 3, 11);
  const Arena& params = model->params();
  OptimizerConfig cfg;
  cfg.weight_decay = 0.5;
  auto decay_of = [&](const std::vector<float>& d, const std::string& name) {
    const long i = params.find(name);
    REQUIRE(i >= 0);
    return d[static_cast<size_t>(i)];
  };
  // Unset: every parameter takes --weight-decay.
  for (float d : parameter_weight_decays(params, cfg)) CHECK(d == 0.5f);
  cfg.norm_weight_decay = 0.0;
  std::vector<float> d = parameter_weight_decays(params, cfg);
  CHECK(decay_of(d, "conv1.weight") == 0.5f);
  CHECK(decay_of(d, "bn1.weight") == 0.f);
  CHECK(decay_of(d, "bn1.bias") == 0.f);
  CHECK(decay_of(d, "fc.0.weight") == 0.5f);
  CHECK(decay_of(d, "fc.0.bias") == 0.5f);  // a linear's bias is not a norm parameter
  // The bias key wins over the norm group (torchvision: custom keys first), norm weights keep theirs.
  cfg.bias_weight_decay = 0.25;
  d = parameter_weight_decays(params, cfg);
  CHECK(decay_of(d, "bn1.weight") == 0.f);
  CHECK(decay_of(d, "bn1.bias") == 0.25f);
  CHECK(decay_of(d, "fc.2.bias") == 0.25f);
  CHECK(decay_of(d, "fc.2.weight") == 0.5f);
  // Every batch norm is found, the downsample ones ("...downsample.1") included.
  size_t norm_weights = 0, ones = 0;
  for (const ParamSlice& s : params.slices()) {
    const bool is_norm_weight = s.shape.rank == 1 && s.name.size() > 7 && s.name.substr(s.name.size() - 7) == ".weight";
    norm_weights += is_norm_weight;
    ones += is_norm_weight && decay_of(d, s.name) == 0.f;
  }
  CHECK(norm_weights > 2);
  CHECK(ones == norm_weights);
}

TEST_CASE("clip_gradients is torch.nn.utils.clip_grad_norm_", "[train]") {
  auto be = make_cpu_backend({});
  Arena params, grads;
  for (Arena* a : {&params, &grads}) a->add("w", Shape{2, 2}), a->add("b", Shape{3});
  params.allocate(*be);
  grads.allocate(*be);
  const std::vector<float> g = {3.f, 0.f, 0.f, 0.f, 0.f, 4.f, 0.f};  // global norm 5
  be->copy_from_host(grads.ptr(0), g.data(), 4 * sizeof(float));
  be->copy_from_host(grads.ptr(1), g.data() + 4, 3 * sizeof(float));
  OptimizerConfig cfg;
  Optimizer opt(*be, params, grads, cfg);
  CHECK(opt.clip_gradients(10.0) == Approx(5.0).epsilon(1e-12));  // below the limit: unchanged
  CHECK(host(*be, grads.ptr(0), 4)[0] == 3.f);
  CHECK(opt.clip_gradients(1.0) == Approx(5.0).epsilon(1e-12));
  const float coef = static_cast<float>(1.0 / (5.0 + 1e-6));  // torch: max_norm / (norm + 1e-6)
  CHECK(host(*be, grads.ptr(0), 4)[0] == 3.f * coef);
  CHECK(host(*be, grads.ptr(1), 3)[1] == 4.f * coef);
}

TEST_CASE("the new optimizers' state checkpoints and resumes to the same trajectory", "[train]") {
  using K = OptimizerKind;
  const auto [kind, momentum, names] = GENERATE(table<K, double, std::vector<std::string>>({
      {K::AdamW, 0.0, {"exp_avg", "exp_avg_sq"}},
      {K::RmsProp, 0.9, {"square_avg", "momentum_buffer"}},
      {K::RmsProp, 0.0, {"square_avg"}},
      {K::Lars, 0.9, {"momentum_buffer"}},
      {K::Lamb, 0.0, {"exp_avg", "exp_avg_sq"}},
  }));
  INFO(name_of(optimizer_names(), kind) << " momentum " << momentum);
  rd::test::TempDir dir;
  auto be = make_cpu_backend({});
  auto model = rd::test::trained_tiny(*be, HeadKind::Mlp, 3, 11);
  OptimizerConfig oc;
  oc.type = kind;
  oc.lr = 0.01;
  oc.weight_decay = 0.01;
  oc.momentum = momentum;
  oc.norm_weight_decay = 0.0;
  oc.bias_weight_decay = 0.001;
  oc.alpha = 0.9;
  oc.eps = kind == K::RmsProp ? 0.0316 : kind == K::Lamb ? 1e-6 : 1e-8;
  Optimizer opt(*be, model->params(), model->grads(), oc);
  REQUIRE(opt.state_count() == names.size());
  for (size_t i = 0; i < names.size(); ++i) CHECK(opt.state_name(i) == names[i]);
  auto step_with = [&](ResNet& m, Optimizer& o, uint64_t seed) {
    std::vector<float> gr = rd::test::random_floats(m.grads().size(), seed);
    be->copy_from_host(m.grads().data(), gr.data(), gr.size() * sizeof(float));
    o.step();
  };
  for (uint64_t s = 1; s <= 3; ++s) step_with(*model, opt, s);

  const std::string path = dir.file("last.h5");
  const OptimizerState state = opt.export_state();
  rd::io::write_checkpoint(path, *model, &state, nullptr, rd::test::tiny_meta("mlp", 3));
  rd::io::CheckpointReader ck(path);
  const OptimizerState& saved = ck.meta().optimizer;
  CHECK(saved.config.type == kind);
  CHECK(saved.step == 3);
  CHECK(saved.config.norm_weight_decay == 0.0);
  CHECK(saved.config.bias_weight_decay == 0.001);
  CHECK(saved.config.eps == oc.eps);

  ResNet other(*be, model->config());
  other.init_parameters(99);
  Optimizer opt2(*be, other.params(), other.grads(), oc);
  CHECK(ck.load_model(other, false).empty());
  ck.load_optimizer(other, opt2.export_state());
  opt2.import_state(saved);
  CHECK(opt2.steps() == 3);
  for (size_t k = 0; k < opt.state_count(); ++k)
    CHECK(rd::test::same_slices(*be, model->params(), opt2.state(k), opt.state(k)));
  // Both continue identically: the resumed run is the uninterrupted one, bit for bit.
  for (uint64_t s = 4; s <= 5; ++s) {
    step_with(*model, opt, s);
    step_with(other, opt2, s);
  }
  CHECK(rd::test::same_slices(*be, model->params(), other.params().data(), model->params().data()));
}

TEST_CASE("optimizer, --norm-weight-decay, --bias-weight-decay, --clip-grad-norm on the command line", "[train]") {
  const TrainOptions t = parse_cli({"--data", "d", "--opt", "lamb", "--norm-weight-decay", "0", "--bias-weight-decay",
                                    "1e-5", "--clip-grad-norm", "1.5"})
                             .train;
  CHECK(t.optimizer == OptimizerKind::Lamb);
  CHECK(t.norm_weight_decay == 0.0);
  CHECK(t.bias_weight_decay == 1e-5);
  CHECK(t.clip_grad_norm == 1.5);
  const TrainOptions d = parse_cli({"--data", "d"}).train;  // defaults keep the tutorial recipe
  CHECK(d.optimizer == OptimizerKind::Adam);
  CHECK(d.norm_weight_decay < 0.0);
  CHECK(d.bias_weight_decay < 0.0);
  CHECK(d.clip_grad_norm == 0.0);
  for (const char* name : {"adamw", "rmsprop", "lars"})
    CHECK(name_of(optimizer_names(), parse_cli({"--data", "d", "--optimizer", name}).train.optimizer) == name);
  CHECK(parse_cli({"--data", "d", "--optimizer", "lars", "--nesterov"}).train.nesterov);
  const auto usage_error = [](std::vector<std::string> args) -> std::string {
    try {
      parse_cli(std::move(args));
    } catch (const UsageError& e) {
      return e.what();
    }
    return "no error";
  };
  CHECK_THAT(usage_error({"--data", "d", "--norm-weight-decay", "-1"}), Catch::StartsWith("--norm-weight-decay: expected"));
  CHECK_THAT(usage_error({"--data", "d", "--bias-weight-decay", "x"}), Catch::StartsWith("--bias-weight-decay: expected"));
  CHECK_THAT(usage_error({"--data", "d", "--clip-grad-norm", "-2"}), Catch::StartsWith("--clip-grad-norm"));
  CHECK_THAT(usage_error({"--data", "d", "--optimizer", "adagrad"}),
             Catch::Contains("adam") && Catch::Contains("adamw") && Catch::Contains("lamb"));
  CHECK_THAT(usage_error({"--data", "d", "--optimizer", "adamw", "--nesterov"}), Catch::StartsWith("--nesterov"));
  const std::string help = command_help(Command::Train);
  for (const char* word : {"adamw", "rmsprop", "lars", "lamb", "--norm-weight-decay", "--bias-weight-decay",
                           "--clip-grad-norm", "[default: none]"})
    CHECK_THAT(help, Catch::Contains(word));
}

TEST_CASE("clip-grad-norm clips the unscaled gradients in the real fp16 training step", "[train]") {
  // torchvision's reference with GradScaler: scaler.unscale_(optimizer), then clip_grad_norm_.
  auto be = make_cpu_backend({});
  auto model = rd::test::trained_tiny(*be, HeadKind::Mlp, 3, 11);
  OptimizerConfig oc;
  oc.type = OptimizerKind::Sgd;
  oc.lr = 0.0;  // the parameters stay: this test reads the gradients the optimizer saw
  Optimizer opt(*be, model->params(), model->grads(), oc);
  opt.set_clip_grad_norm(0.5);
  TrainStep step(*model, opt, nullptr, 0.f, /*loss_scaling=*/true, 1024.0);
  Arena& grads = model->grads();
  const std::vector<float> g = rd::test::random_floats(grads.size(), 21);
  std::vector<float> scaled(g);
  for (float& x : scaled) x *= 1024.f;  // what backward leaves under a loss scale of 1024
  be->copy_from_host(grads.data(), scaled.data(), scaled.size() * sizeof(float));
  step.update();
  REQUIRE(step.skipped_steps() == 0);
  double norm = 0.0;
  for (const ParamSlice& s : grads.slices())
    for (size_t i = s.offset; i < s.offset + s.count; ++i) norm += static_cast<double>(g[i]) * g[i];
  norm = std::sqrt(norm);
  REQUIRE(norm > 0.5);
  CHECK(opt.last_grad_norm() == Approx(norm).epsilon(1e-6));  // the unscaled norm
  const std::vector<float> after = host(*be, grads.data(), grads.size());
  const double coef = 0.5 / (norm + 1e-6);
  const ParamSlice& first = grads.slice(0);
  for (size_t i = first.offset; i < first.offset + first.count; ++i)
    REQUIRE(after[i] == Approx(g[i] * coef).epsilon(1e-5).margin(1e-9));
}
