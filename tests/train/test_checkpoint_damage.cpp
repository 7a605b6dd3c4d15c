// Damaged checkpoints (docs/checkpoint_format.md, "Damaged files"): a real
// checkpoint truncated at many offsets and with single bits flipped across the
// whole file goes through the read path of each command (info, predict, --init,
// --resume). Each must refuse it with a UsageError naming the file, or load it
// where the damage hit nothing that matters, and then load exactly the original
// state. A crash fails this test; a hang runs into ctest's timeout.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/train/optimizer.h"
#include "resnet_ddp/train/scheduler.h"

namespace fs = std::filesystem;
using namespace rd;
using namespace rd::train;
using namespace rd::io;

namespace {

std::vector<float> arena_values(Backend& be, const Arena& a) {
  std::vector<float> v(a.size());
  be.copy_to_host(v.data(), a.data(), v.size() * sizeof(float));
  return v;
}

struct State {
  std::vector<float> params, buffers, adam0, adam1;
  int64_t nbt = 0, steps = 0;
  bool operator==(const State&) const = default;
};

struct Trainee {
  std::unique_ptr<ResNet> model;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<Scheduler> sched;
  Trainee(Backend& be, uint64_t seed) {
    ResNetConfig cfg;
    cfg.arch = "resnet_tiny";
    cfg.num_classes = 3;
    model = std::make_unique<ResNet>(be, cfg);
    model->init_parameters(seed);
    OptimizerConfig oc;
    opt = std::make_unique<Optimizer>(be, model->params(), model->grads(), oc);
    sched = std::make_unique<Scheduler>(SchedulerKind::Plateau, 1e-3, 5);
  }
  State state(Backend& be) {
    State s{arena_values(be, model->params()), arena_values(be, model->buffers()), {}, {}, model->num_batches_tracked(),
            opt->steps()};
    const size_t n = model->params().size();
    s.adam0.resize(n);
    s.adam1.resize(n);
    be.copy_to_host(s.adam0.data(), opt->state(0), n * sizeof(float));
    be.copy_to_host(s.adam1.data(), opt->state(1), n * sizeof(float));
    return s;
  }
};

enum class Outcome { Refused, Loaded };

}  // namespace

TEST_CASE("truncated and bit-flipped checkpoints are refused or load intact, never crash", "[train][damage]") {
  const fs::path dir = fs::temp_directory_path() / ("rd_damage_" + std::to_string(getpid()));
  fs::create_directories(dir);
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{dir};

  auto be = make_cpu_backend({});
  Trainee src(*be, 1);
  {  // Non-trivial optimizer state, so a damaged Adam tensor would show.
    std::vector<float> g(src.model->grads().size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i % 13) * 0.01 - 0.05);
    be->copy_from_host(src.model->grads().data(), g.data(), g.size() * sizeof(float));
    src.opt->step();
  }
  CheckpointMeta meta;
  meta.arch = "resnet_tiny";
  meta.head = "mlp";
  meta.num_classes = 3;
  meta.image_size = 32;
  meta.epoch = 1;
  meta.world_size = 1;
  meta.class_names = {"a", "b", "c"};
  const std::string good = (dir / "good.h5").string();
  const OptimizerState opt_state = src.opt->export_state();
  const SchedulerState sched_state = src.sched->export_state();
  write_checkpoint(good, *src.model, &opt_state, &sched_state, meta);
  const State want = src.state(*be);
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t size = bytes.size();
  REQUIRE(size > 4096);

  Trainee dst(*be, 2);
  const std::vector<std::string> classes = {"a", "b", "c"};
  // The read path of each command, as in info.cpp, predict.cpp and trainer.cpp.
  const std::vector<std::pair<const char*, std::function<void(const std::string&)>>> commands = {
      {"info",
       [&](const std::string& p) {
         try {
           (void)CheckpointReader(p, false).check_tensors();
         } catch (const UsageError&) {
           (void)CheckpointReader(p, true).check_tensors();
         }
       }},
      {"predict",
       [&](const std::string& p) {
         CheckpointReader ck(p, false);
         (void)ck.load_model(*dst.model, false);
       }},
      {"--init",
       [&](const std::string& p) {
         CheckpointReader ck(p, true);
         (void)ck.load_model(*dst.model, true);
       }},
      {"--resume",
       [&](const std::string& p) {
         CheckpointReader ck(p, false);
         check_compatible(ck.meta(), *dst.model, classes, p);
         (void)ck.load_model(*dst.model, false);
         ck.load_optimizer(*dst.model, dst.opt->export_state());
         dst.opt->import_state(ck.meta().optimizer);
         dst.sched->import_state(ck.meta().scheduler);
       }},
  };

  size_t refused = 0, loaded = 0, loaded_outside_header = 0;
  const std::string damaged = (dir / "damaged.h5").string();
  auto check = [&](const std::string& content, const std::string& what) {
    {
      std::ofstream out(damaged, std::ios::binary | std::ios::trunc);
      out.write(content.data(), static_cast<std::streamsize>(content.size()));
    }
    for (const auto& [name, run] : commands) {
      INFO(what << ", " << name);
      dst = Trainee(*be, 2);
      Outcome o = Outcome::Loaded;
      try {
        run(damaged);
      } catch (const UsageError& e) {
        o = Outcome::Refused;
        CHECK_THAT(e.what(), Catch::Contains("checkpoint '" + damaged + "'"));
      }
      if (o == Outcome::Refused) {
        ++refused;
        continue;
      }
      ++loaded;
      // Loaded: only where nothing that matters was hit, so the state is the original.
      State got = dst.state(*be);
      if (std::string(name) == "info") continue;
      if (std::string(name) != "--resume") got.adam0 = want.adam0, got.adam1 = want.adam1, got.steps = want.steps;
      CHECK(got.params == want.params);
      CHECK(got.buffers == want.buffers);
      CHECK(got.adam0 == want.adam0);
      CHECK(got.adam1 == want.adam1);
      CHECK(got.nbt == want.nbt);
      CHECK(got.steps == want.steps);
    }
  };

  // Truncation: inside the checksum header, around the HDF5 superblock, then
  // evenly spaced across the file, and one byte short.
  std::vector<size_t> cuts = {0, 1, 8, 23, 24, 60, 100, 511, 512, 513, 520, 600, 1024, 2048, size - 1};
  for (size_t i = 1; i < 100; ++i) cuts.push_back(size * i / 100);
  for (size_t cut : cuts) check(bytes.substr(0, cut), "truncated at " + std::to_string(cut));
  const size_t truncations = cuts.size();

  // Single bit flips: every byte of the header text, then bytes spread evenly
  // across the file (a seeded random bit in each).
  std::mt19937 rng(20);
  std::vector<size_t> flips;
  for (size_t i = 0; i < 64; ++i) flips.push_back(i);
  for (size_t i = 0; i < 300; ++i) flips.push_back(512 + (size - 512) * i / 300 + rng() % 7);
  for (size_t at : flips) {
    if (at >= size) continue;
    std::string b = bytes;
    const int bit = static_cast<int>(rng() % 8);
    b[at] = static_cast<char>(b[at] ^ (1 << bit));
    const size_t before = loaded;
    check(b, "bit " + std::to_string(bit) + " of byte " + std::to_string(at) + " flipped");
    if (loaded != before && at >= 512) ++loaded_outside_header;
  }
  std::printf("damaged checkpoints (%zu bytes): %zu truncations, %zu bit flips, 4 commands each: "
              "%zu refused, %zu loaded intact (damage in the header's magic only)\n",
              size, truncations, flips.size(), refused, loaded);
  CHECK(loaded_outside_header == 0);  // everything past the header is covered by the checksum
  CHECK(refused + loaded == (truncations + flips.size()) * commands.size());
}
