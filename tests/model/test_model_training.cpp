// The whole model on the CPU backend: forward against a float64 reference
// ResNet, gradients against finite differences, BN running statistics and eval
// mode, optimizer steps on the flat arenas, and a loss that falls.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/backend_checks.h"
#include "model/reference_resnet.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"

using namespace rd;
using namespace rd::test;

namespace {

constexpr int kClasses = 3;

std::unique_ptr<ResNet> tiny_model(Backend& be, HeadKind head, uint64_t seed) {
  ResNetConfig cfg;
  cfg.arch = "resnet_tiny";
  cfg.head = head;
  cfg.num_classes = kClasses;
  cfg.init_seed = seed;
  return std::make_unique<ResNet>(be, cfg);
}

// BN starts at weight 1 / bias 0, a special case that would hide a swapped or
// ignored gamma/beta: give every BN random affine parameters.
void randomize_batchnorm(ResNet& m, uint64_t seed) {
  Arena& p = m.params();
  for (size_t i = 0; i < p.slices().size(); ++i) {
    const std::string& name = p.slice(i).name;
    const bool is_bn = name.find("bn") != std::string::npos || name.find("downsample.1") != std::string::npos;
    if (!is_bn) continue;
    const bool weight = name.size() > 7 && name.substr(name.size() - 7) == ".weight";
    const auto v = weight ? random_floats(p.slice(i).count, seed + i, 0.5f, 1.5f)
                          : random_floats(p.slice(i).count, seed + i, -0.3f, 0.3f);
    m.backend().copy_from_host(p.ptr(i), v.data(), v.size() * sizeof(float));
  }
}

Tensor& load_input(ResNet& m, const std::vector<float>& x, int64_t n, int64_t h, int64_t w) {
  Tensor& t = m.input_buffer(n, h, w);
  m.backend().copy_from_host_nchw(x.data(), t);
  return t;
}

// Mean label-smoothed cross-entropy of the model on (input, labels).
double model_loss(ResNet& m, Tensor& input, const std::vector<int32_t>& labels, float smoothing,
                  Tensor* dlogits) {
  const Tensor& z = m.forward(input);
  return m.backend().softmax_xent(z, labels.data(), smoothing, 1.f, dlogits, nullptr) /
         static_cast<double>(labels.size());
}

std::vector<size_t> top_and_random(const std::vector<double>& g, size_t top, size_t random, uint64_t seed) {
  std::vector<size_t> order(g.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::partial_sort(order.begin(), order.begin() + static_cast<long>(std::min(top, g.size())), order.end(),
                    [&](size_t a, size_t b) { return std::fabs(g[a]) > std::fabs(g[b]); });
  std::vector<size_t> pick(order.begin(), order.begin() + static_cast<long>(std::min(top, g.size())));
  if (random > 0)
    for (size_t i : sample_indices(g.size(), random, seed))
      if (std::find(pick.begin(), pick.end(), i) == pick.end()) pick.push_back(i);
  std::sort(pick.begin(), pick.end());
  return pick;
}

std::vector<std::unique_ptr<Backend>> model_backends() {
  std::vector<std::unique_ptr<Backend>> all;
  for (Layout layout : {Layout::NHWC, Layout::NCHW}) {
    BackendOptions opts;
    opts.layout = layout;
    try {
      all.push_back(make_cpu_backend(opts));
    } catch (const rd::Error& e) {
      if (layout == Layout::NHWC) FAIL("default NHWC layout rejected: " << e.what());
      WARN("skipping layout " << layout_name(layout) << ": " << e.what());
    }
  }
  return all;
}

}  // namespace

TEST_CASE("model: whole-model gradients match finite differences (resnet_tiny)", "[model]") {
  auto be = make_cpu_backend();
  for (HeadKind head : {HeadKind::Mlp, HeadKind::Fc}) {
    INFO("head " << head_name(head));
    auto m = tiny_model(*be, head, 5);
    randomize_batchnorm(*m, 100);
    // 36 px: 18 after the stem, 9 after the pool, then 5, 3, 2 -> odd sizes and
    // at least 8 values per channel in the last batch norm.
    const int64_t N = 2, H = 36, W = 36;
    const auto xh = random_floats(static_cast<size_t>(N * 3 * H * W), 7);
    const std::vector<int32_t> labels{0, 2};
    const float smoothing = 0.1f;
    m->train(true);
    m->keep_input_grad(true);
    Tensor& input = load_input(*m, xh, N, H, W);
    Tensor dz = be->matrix(N, kClasses);
    const double loss = model_loss(*m, input, labels, smoothing, &dz);
    m->backward(dz, false);

    HostState grads;
    add_arena(*be, m->grads(), grads);
    const auto dx = to_double(download_activation(*be, m->input_grad()));
    HostState work = download_state(*m);
    const HostState start = work;
    ref::Act xr = to_act(xh, N, 3, H, W);
    auto ref_loss = [&]() {
      return ref::softmax_xent(reference_resnet_forward(work, xr, true), labels, smoothing).mean_loss;
    };
    REQUIRE(ref_loss() == Approx(loss).epsilon(1e-5));

    double gmax = 0;
    for (auto& [name, g] : grads.values)
      for (double v : g) gmax = std::max(gmax, std::fabs(v));
    REQUIRE(gmax > 0);
    GradCheckOptions opt;
    opt.step = 1e-5;
    opt.threshold = 5e-4;
    opt.scale_floor = 1e-2 * gmax;  // far smaller gradients are checked absolutely
    // Every parameter tensor: its largest-gradient element and one at random.
    size_t slice_no = 0;
    for (const ParamSlice& s : m->params().slices()) {
      opt.indices = top_and_random(grads.at(s.name), 1, 1, 200 + slice_no++);
      auto f = [&](const std::vector<double>& v) {
        work.values[s.name] = v;
        return ref_loss();
      };
      RD_CHECK_GRADIENT("d loss / d " + s.name, check_gradient<double>(f, start.values.at(s.name),
                                                                       grads.at(s.name), opt));
      work.values[s.name] = start.values.at(s.name);
    }
    opt.indices = top_and_random(dx, 6, 6, 300);
    auto fx = [&](const std::vector<double>& v) {
      xr.v = v;
      return ref_loss();
    };
    RD_CHECK_GRADIENT("d loss / d input", check_gradient<double>(fx, to_double(xh), dx, opt));

    // The same elements through the float model itself (kinks skipped).
    GradCheckOptions fopt;
    fopt.step = 1e-3;
    fopt.threshold = 3e-2;
    fopt.scale_floor = 1e-2 * gmax;
    fopt.skip_kinks = true;
    fopt.max_skip_fraction = 0.34;
    for (const char* name : {"conv1.weight", "layer1.0.conv2.weight", "layer2.0.downsample.0.weight",
                             "layer4.0.bn1.weight", "layer3.0.bn2.bias"}) {
      const long idx = m->params().find(name);
      REQUIRE(idx >= 0);
      const size_t i = static_cast<size_t>(idx);
      fopt.indices = top_and_random(grads.at(name), 3, 0, 0);
      auto f = [&](const std::vector<float>& v) {
        be->copy_from_host(m->params().ptr(i), v.data(), v.size() * sizeof(float));
        return model_loss(*m, input, labels, smoothing, nullptr);
      };
      const auto orig = to_float(start.values.at(name));
      RD_CHECK_GRADIENT(std::string("float model d loss / d ") + name,
                        check_gradient<float>(f, orig, grads.at(name), fopt));
      be->copy_from_host(m->params().ptr(i), orig.data(), orig.size() * sizeof(float));
    }
  }
}

TEST_CASE("model: train-mode logits and running statistics equal the reference over several steps",
          "[model]") {
  for (auto& be : model_backends()) {
    INFO(be->name());
    auto m = tiny_model(*be, HeadKind::Mlp, 11);
    randomize_batchnorm(*m, 400);
    HostState st = download_state(*m);
    const int64_t N = 3, H = 33, W = 37;
    m->train(true);
    const int steps = 4;
    for (int s = 0; s < steps; ++s) {
      const auto xh = random_floats(static_cast<size_t>(N * 3 * H * W), 500 + static_cast<uint64_t>(s),
                                    -1.f + 0.3f * static_cast<float>(s), 1.5f);
      const Tensor& z = m->forward(load_input(*m, xh, N, H, W));
      const ref::Mat zr = reference_resnet_forward(st, to_act(xh, N, 3, H, W), true);
      RD_CHECK_CLOSE("train logits step " << s, download_rowmajor(*be, z), zr.v, (Tol{1e-4, 1e-4}));
    }
    CHECK(m->num_batches_tracked() == steps);
    HostState got = download_state(*m);
    for (const ParamSlice& s : m->buffers().slices())
      RD_CHECK_CLOSE(s.name << " after " << steps << " steps", got.at(s.name), st.at(s.name), (Tol{1e-4, 1e-5}));
  }
}

TEST_CASE("model: eval mode normalises with the running statistics", "[model]") {
  for (auto& be : model_backends()) {
    INFO(be->name());
    auto m = tiny_model(*be, HeadKind::Mlp, 12);
    randomize_batchnorm(*m, 600);
    const int64_t N = 4, H = 32, W = 32;
    m->train(true);
    for (int s = 0; s < 3; ++s)
      m->forward(load_input(*m, random_floats(static_cast<size_t>(N * 3 * H * W), 700 + static_cast<uint64_t>(s)),
                            N, H, W));
    HostState st = download_state(*m);
    const int64_t tracked = m->num_batches_tracked();

    m->train(false);
    CHECK_FALSE(m->training());
    const auto xh = random_floats(static_cast<size_t>(N * 3 * H * W), 800, -2.f, 2.f);
    const auto logits = download_rowmajor(*be, m->forward(load_input(*m, xh, N, H, W)));
    HostState st_eval = st;
    const ref::Mat zr = reference_resnet_forward(st_eval, to_act(xh, N, 3, H, W), false);
    RD_CHECK_CLOSE("eval logits", logits, zr.v, (Tol{1e-4, 1e-4}));
    // The batch-statistics forward gives different logits: eval really used the running stats.
    HostState st_train = st;
    const ref::Mat zt = reference_resnet_forward(st_train, to_act(xh, N, 3, H, W), true);
    CHECK_FALSE(compare_close(logits, zt.v, Tol{1e-2, 1e-2}).ok);

    // Eval changes no statistics and each sample's logits do not depend on its batch.
    CHECK(m->num_batches_tracked() == tracked);
    HostState after = download_state(*m);
    for (const ParamSlice& s : m->buffers().slices()) CHECK(after.at(s.name) == st.at(s.name));
    const std::vector<float> one(xh.begin() + 3 * 3 * H * W, xh.end());  // the last sample alone
    const auto single = download_rowmajor(*be, m->forward(load_input(*m, one, 1, H, W)));
    const std::vector<float> last(logits.end() - kClasses, logits.end());
    RD_CHECK_CLOSE("last sample alone vs in its batch", single, to_double(last), (Tol{1e-5, 1e-5}));
  }
}

TEST_CASE("model: loss falls over 20 Adam steps on a fixed synthetic batch", "[model]") {
  auto be = make_cpu_backend();
  auto m = tiny_model(*be, HeadKind::Mlp, 21);
  const int64_t N = 8, H = 32, W = 32;
  const auto xh = random_floats(static_cast<size_t>(N * 3 * H * W), 900);
  std::vector<int32_t> labels(N);
  for (int64_t i = 0; i < N; ++i) labels[static_cast<size_t>(i)] = static_cast<int32_t>(i % kClasses);
  Tensor& input = load_input(*m, xh, N, H, W);
  Tensor dz = be->matrix(N, kClasses);
  const size_t count = m->params().size();
  DeviceVector mom(*be, filled(count, 0.f)), var(*be, filled(count, 0.f));
  std::vector<double> losses;
  m->train(true);
  for (int step = 1; step <= 20; ++step) {
    losses.push_back(model_loss(*m, input, labels, 0.1f, &dz));
    m->backward(dz, false);
    be->adam_step(m->params().data(), m->grads().data(), mom.ptr(), var.ptr(), count,
                  math::AdamArgs{.lr = 1e-2f, .step = step});
  }
  losses.push_back(model_loss(*m, input, labels, 0.1f, nullptr));
  std::ostringstream trace;
  for (double l : losses) trace << l << " ";
  INFO("losses: " << trace.str());
  for (double l : losses) REQUIRE(std::isfinite(l));
  // Eight samples are memorised quickly; label smoothing 0.1 keeps the floor above 0.
  CHECK(losses.back() < 0.5 * losses.front());
  CHECK(*std::max_element(losses.begin() + 10, losses.end()) < losses.front());
}

TEST_CASE("model: Adam and SGD steps on the flat arenas equal hand-computed values", "[model]") {
  auto be = make_cpu_backend();
  auto m = tiny_model(*be, HeadKind::Mlp, 31);
  const int64_t N = 2, H = 36, W = 36;
  const std::vector<int32_t> labels{1, 2};
  Tensor dz = be->matrix(N, kClasses);
  m->train(true);
  model_loss(*m, load_input(*m, random_floats(static_cast<size_t>(N * 3 * H * W), 1000), N, H, W), labels, 0.f,
             &dz);
  m->backward(dz, false);
  const size_t count = m->params().size();
  std::vector<float> p0(count), g(count);
  be->copy_to_host(p0.data(), m->params().data(), count * sizeof(float));
  be->copy_to_host(g.data(), m->grads().data(), count * sizeof(float));
  auto params_now = [&] {
    std::vector<float> p(count);
    be->copy_to_host(p.data(), m->params().data(), count * sizeof(float));
    return p;
  };

  SECTION("Adam") {
    // With the same gradient twice, bias correction gives m_hat = g and
    // v_hat = g^2 at both steps: each step moves p by lr * g / (|g| + eps).
    const float lr = 1e-3f, eps = 1e-8f;
    DeviceVector mom(*be, filled(count, 0.f)), var(*be, filled(count, 0.f));
    for (int step = 1; step <= 2; ++step)
      be->adam_step(m->params().data(), m->grads().data(), mom.ptr(), var.ptr(), count,
                    math::AdamArgs{.lr = lr, .eps = eps, .step = step});
    std::vector<double> expected(count);
    size_t moved = 0;
    for (size_t i = 0; i < count; ++i) {
      expected[i] = p0[i] - 2.0 * lr * g[i] / (std::fabs(static_cast<double>(g[i])) + eps);
      moved += std::fabs(g[i]) > 1e-6f;
    }
    CHECK(moved > count / 2);
    RD_CHECK_CLOSE("Adam, 2 steps", params_now(), expected, (Tol{1e-6, 2e-6}));

    // And with weight decay the full reference agrees.
    ref::Vec pr = to_double(params_now());
    ref::AdamState st;
    DeviceVector m2(*be, filled(count, 0.f)), v2(*be, filled(count, 0.f));
    be->adam_step(m->params().data(), m->grads().data(), m2.ptr(), v2.ptr(), count,
                  math::AdamArgs{.lr = lr, .eps = eps, .weight_decay = 0.01f, .step = 1});
    ref::adam_step(pr, to_double(g), st, lr, 0.9, 0.999, eps, 0.01);
    RD_CHECK_CLOSE("Adam with weight decay", params_now(), pr, (Tol{1e-6, 1e-6}));
  }
  SECTION("SGD with momentum") {
    // First step: buf = g, p -= lr g. Second (same g): buf = (1 + momentum) g.
    const float lr = 0.1f, mu = 0.9f;
    DeviceVector buf(*be, filled(count, 5.f));
    be->sgd_step(m->params().data(), m->grads().data(), buf.ptr(), count,
                 math::SgdHyper{.lr = lr, .momentum = mu, .dampening = 0.f, .weight_decay = 0.f, .nesterov = false,
                                .first_step = true});
    be->sgd_step(m->params().data(), m->grads().data(), buf.ptr(), count,
                 math::SgdHyper{.lr = lr, .momentum = mu, .dampening = 0.f, .weight_decay = 0.f, .nesterov = false,
                                .first_step = false});
    std::vector<double> expected(count), expected_buf(count);
    for (size_t i = 0; i < count; ++i) {
      expected[i] = p0[i] - lr * (2.0 + mu) * g[i];
      expected_buf[i] = (1.0 + mu) * g[i];
    }
    RD_CHECK_CLOSE("SGD, 2 steps", params_now(), expected, (Tol{1e-6, 1e-6}));
    RD_CHECK_CLOSE("SGD momentum buffer", buf.host(), expected_buf, (Tol{1e-6, 1e-6}));
  }
}

TEST_CASE("model: backward overwrites or accumulates gradients and reports each once", "[model]") {
  auto be = make_cpu_backend();
  auto m = tiny_model(*be, HeadKind::Mlp, 41);
  const int64_t N = 2, H = 36, W = 36;
  const std::vector<int32_t> labels{0, 1};
  Tensor dz = be->matrix(N, kClasses);
  m->train(true);
  Tensor& input = load_input(*m, random_floats(static_cast<size_t>(N * 3 * H * W), 1100), N, H, W);
  model_loss(*m, input, labels, 0.1f, &dz);

  struct Recorder : BackwardHooks {
    std::vector<size_t> order;
    size_t polls = 0;
    void on_grad_ready(size_t index) override { order.push_back(index); }
    void poll() override { ++polls; }
  } hooks;
  be->fill(m->grads().data(), 42.f, m->grads().size());  // stale values must be overwritten
  m->backward(dz, false, &hooks);
  HostState first;
  add_arena(*be, m->grads(), first);

  const size_t n_params = m->params().slices().size();
  REQUIRE(hooks.order.size() == n_params);
  std::vector<size_t> sorted = hooks.order;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < n_params; ++i) CHECK(sorted[i] == i);
  // Layers report in reverse registration (state_dict) order, which DDP's
  // buckets rely on; within one layer (weight, bias) the order is free.
  auto module_of = [&](size_t i) {
    const std::string& n = m->params().slice(i).name;
    return n.substr(0, n.rfind('.'));
  };
  for (size_t k = 1; k < hooks.order.size(); ++k) {
    INFO(m->params().slice(hooks.order[k - 1]).name << " then " << m->params().slice(hooks.order[k]).name);
    CHECK((hooks.order[k] < hooks.order[k - 1] || module_of(hooks.order[k]) == module_of(hooks.order[k - 1])));
  }
  CHECK(hooks.polls > 0);

  m->backward(dz, true);
  HostState twice;
  add_arena(*be, m->grads(), twice);
  for (const ParamSlice& s : m->grads().slices()) {
    std::vector<double> doubled = first.at(s.name);
    for (double& v : doubled) v *= 2;
    RD_CHECK_CLOSE(s.name << " after accumulate", twice.at(s.name), doubled, (Tol{1e-6, 1e-7}));
  }
}

TEST_CASE("model: bad configuration and input are clear errors", "[model]") {
  auto be = make_cpu_backend();
  ResNetConfig cfg;
  cfg.arch = "resnet19";
  CHECK_THROWS_AS(ResNet(*be, cfg), UsageError);
  CHECK_THROWS_AS(validate_arch("vgg16"), UsageError);
  CHECK_THROWS_AS(parse_head("conv"), UsageError);
  CHECK(parse_head("fc") == HeadKind::Fc);
  CHECK(parse_head("mlp") == HeadKind::Mlp);
  cfg.arch = "resnet_tiny";
  cfg.num_classes = 0;
  CHECK_THROWS_AS(ResNet(*be, cfg), Error);
  auto m = tiny_model(*be, HeadKind::Fc, 1);
  CHECK_THROWS_WITH(m->forward(m->input_buffer(1, 31, 40)), Catch::Contains("32"));
  m->train(false);
  m->forward(m->input_buffer(1, 32, 32));
  Tensor dz = be->matrix(1, kClasses);
  CHECK_THROWS_AS(m->backward(dz, false), Error);  // backward after an eval forward
}
