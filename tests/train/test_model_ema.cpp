// The weight EMA (--model-ema, train/model_ema.h): torchvision's decay adjustment,
// AveragedModel's copy-then-average and warmup resets, the evaluation swap, and its
// round trip through last.h5. The arithmetic against torch itself: check_ema_vs_torch.py.
#include <catch2/catch.hpp>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/train/model_ema.h"
#include "train/train_test_util.h"

using namespace rd;
using namespace rd::train;
using rd::test::host;
using rd::test::TempDir;

namespace {

std::vector<float> arena_host(Backend& be, const float* p, size_t n) { return host(be, p, n); }

// Moves every parameter and buffer of `m` by a pseudo-random amount.
void perturb(Backend& be, ResNet& m, uint64_t seed) {
  for (Arena* a : {&m.params(), &m.buffers()}) {
    std::vector<float> v = arena_host(be, a->data(), a->size());
    const std::vector<float> d = rd::test::random_floats(v.size(), seed);
    for (size_t i = 0; i < v.size(); ++i) v[i] += 0.1f * d[i];
    be.copy_from_host(a->data(), v.data(), v.size() * sizeof(float));
  }
  m.set_num_batches_tracked(m.num_batches_tracked() + 7);
}

}  // namespace

TEST_CASE("the EMA decay follows torchvision's adjustment", "[train]") {
  // adjust = world * batch * steps / epochs; alpha = min(1, (1 - decay) * adjust).
  CHECK(ModelEma::adjusted_decay(8, 128, 32, 600, 0.99998) == Approx(1.0 - 2e-5 * 8 * 128 * 32 / 600.0).epsilon(1e-12));
  CHECK(ModelEma::adjusted_decay(1, 32, 32, 90, 0.99998) == Approx(1.0 - 2e-5 * 32 * 32 / 90.0).epsilon(1e-12));
  CHECK(ModelEma::adjusted_decay(64, 1024, 32, 1, 0.9) == 0.0);  // alpha clamped to 1
}

TEST_CASE("the EMA copies, averages, restarts and swaps like AveragedModel", "[train]") {
  auto be = make_cpu_backend({});
  auto model = rd::test::trained_tiny(*be, HeadKind::Fc, 3, 5);
  const size_t np = model->params().size(), nb = model->buffers().size();
  const double decay = 0.75;
  ModelEma ema(*model, decay);
  CHECK(ema.n_averaged() == 0);
  perturb(*be, *model, 1);
  ema.update(*model);  // n_averaged 0: a copy
  io::EmaState s = ema.export_state();
  CHECK(arena_host(*be, s.params, np) == arena_host(*be, model->params().data(), np));
  CHECK(arena_host(*be, s.buffers, nb) == arena_host(*be, model->buffers().data(), nb));
  CHECK(ema.num_batches_tracked() == model->num_batches_tracked());
  std::vector<double> expect_p(np), expect_b(nb);
  {
    const auto p = arena_host(*be, model->params().data(), np), b = arena_host(*be, model->buffers().data(), nb);
    for (size_t i = 0; i < np; ++i) expect_p[i] = p[i];
    for (size_t i = 0; i < nb; ++i) expect_b[i] = b[i];
  }
  const int64_t nbt0 = model->num_batches_tracked();
  perturb(*be, *model, 2);
  ema.update(*model);  // decay * avg + (1 - decay) * model over params AND buffers
  CHECK(ema.n_averaged() == 2);
  {
    const auto p = arena_host(*be, model->params().data(), np), b = arena_host(*be, model->buffers().data(), nb);
    const auto ep = arena_host(*be, s.params, np), eb = arena_host(*be, s.buffers, nb);
    for (size_t i = 0; i < np; ++i)
      REQUIRE(ep[i] == Approx(decay * expect_p[i] + (1 - decay) * p[i]).epsilon(1e-6).margin(1e-7));
    for (size_t i = 0; i < nb; ++i)
      REQUIRE(eb[i] == Approx(decay * expect_b[i] + (1 - decay) * b[i]).epsilon(1e-6).margin(1e-7));
  }
  // num_batches_tracked: float32 arithmetic truncated, as torch's int64 buffer.
  CHECK(ema.num_batches_tracked() ==
        static_cast<int64_t>(0.75f * static_cast<float>(nbt0) + 0.25f * static_cast<float>(nbt0 + 7)));
  // A warmup epoch's reset: the next update copies again.
  ema.reset_count();
  perturb(*be, *model, 3);
  ema.update(*model);
  CHECK(arena_host(*be, s.params, np) == arena_host(*be, model->params().data(), np));
  // Evaluating the average puts it in the model's arenas and the model back afterwards.
  perturb(*be, *model, 4);
  ema.update(*model);
  const auto model_p = arena_host(*be, model->params().data(), np),
             model_b = arena_host(*be, model->buffers().data(), nb);
  const auto avg_p = arena_host(*be, s.params, np);
  ema.swap_in(*model);
  CHECK(arena_host(*be, model->params().data(), np) == avg_p);
  ema.swap_out(*model);
  CHECK(arena_host(*be, model->params().data(), np) == model_p);
  CHECK(arena_host(*be, model->buffers().data(), nb) == model_b);
}

TEST_CASE("the EMA round-trips through last.h5 and resumes the same average", "[train]") {
  TempDir dir;
  auto be = make_cpu_backend({});
  auto model = rd::test::trained_tiny(*be, HeadKind::Mlp, 3, 11);
  ModelEma ema(*model, 0.9);
  for (uint64_t k = 0; k < 3; ++k) {
    perturb(*be, *model, 10 + k);
    ema.update(*model);
  }
  const std::string path = dir.file("last.h5");
  const io::EmaState st = ema.export_state();
  io::write_checkpoint(path, *model, nullptr, nullptr, rd::test::tiny_meta("mlp", 3), &st);
  io::CheckpointReader ck(path);
  const io::CheckpointMeta& m = ck.meta();
  REQUIRE(m.ema.present);
  CHECK(m.ema.decay == 0.9);
  CHECK(m.ema.n_averaged == 3);
  CHECK(m.ema.num_batches_tracked == ema.num_batches_tracked());

  ResNet other(*be, model->config());
  other.init_parameters(99);
  ModelEma resumed(other, 0.9);
  ck.load_ema(other, resumed.export_state());
  resumed.import_state(m.ema);
  const io::EmaState rs = resumed.export_state();
  CHECK(rd::test::same_slices(*be, model->params(), rs.params, st.params));
  CHECK(rd::test::same_slices(*be, model->buffers(), rs.buffers, st.buffers));
  CHECK(resumed.n_averaged() == 3);
  // Both continue identically.
  perturb(*be, *model, 20);
  ema.update(*model);
  resumed.update(*model);
  CHECK(rd::test::same_slices(*be, model->params(), resumed.export_state().params, ema.export_state().params));
  CHECK(resumed.num_batches_tracked() == ema.num_batches_tracked());

  // A checkpoint without the group says so, with the file named.
  const std::string plain = dir.file("plain.h5");
  io::write_checkpoint(plain, *model, nullptr, nullptr, rd::test::tiny_meta("mlp", 3));
  io::CheckpointReader p(plain);
  CHECK_FALSE(p.meta().ema.present);
  CHECK_THROWS_WITH(p.load_ema(other, resumed.export_state()), Catch::Contains(plain) && Catch::Contains("model_ema"));
}
