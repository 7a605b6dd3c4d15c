// Checkpoint round trips and the rejection of damaged or mismatched files, writes that
// fail part way, and unusable paths.
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <type_traits>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/train/optimizer.h"
#include "resnet_ddp/train/scheduler.h"
#include "train/train_test_util.h"

namespace fs = std::filesystem;
using namespace rd;
using namespace rd::train;
using namespace rd::io;
using rd::test::TempDir;
using rd::test::eval_logits;
using rd::test::host;
using rd::test::same_slices;
using rd::test::tiny_meta;
using rd::test::trained_tiny;

namespace {

size_t open_fd_count() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Bytes of the largest state_dict tensor as the model holds them, and its name.
std::pair<std::string, std::vector<float>> largest_tensor(ResNet& model) {
  const Arena& params = model.params();
  size_t big = 0;
  for (size_t i = 0; i < params.slices().size(); ++i)
    if (params.slice(i).count > params.slice(big).count) big = i;
  return {params.slice(big).name, host(model.backend(), params.ptr(big), params.slice(big).count)};
}

// `good` with one byte flipped inside the stored values of `values`.
std::string flip_inside(const std::string& good, const std::vector<float>& values, const std::string& p) {
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(values.data()), 64));
  REQUIRE(at != std::string::npos);
  bytes[at + 10] = static_cast<char>(bytes[at + 10] ^ 0x5a);
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

}  // namespace

TEST_CASE("checkpoint round trip restores the exact training state", "[train]") {
  TempDir dir;
  auto be = make_cpu_backend({});
  auto model = trained_tiny(*be, HeadKind::Mlp, 3, 11);
  OptimizerConfig oc;
  oc.lr = 1e-3;
  Optimizer opt(*be, model->params(), model->grads(), oc);
  // Non-trivial optimizer state: one step on pseudo-random gradients.
  std::vector<float> gr = rd::test::random_floats(model->grads().size(), 5);
  be->copy_from_host(model->grads().data(), gr.data(), gr.size() * sizeof(float));
  opt.step();
  opt.set_lr(3e-4);
  Scheduler sched(SchedulerKind::Plateau, 1e-3, 5);
  sched.step(1e-3, 0.8);
  sched.step(1e-3, 0.9);

  const std::string path = dir.file("last.h5");
  const OptimizerState opt_state = opt.export_state();
  const SchedulerState sched_state = sched.export_state();
  CheckpointMeta meta = tiny_meta("mlp", 3);
  meta.val_resize_size = 36;  // torchvision's eval preset (--val-resize-size / --val-crop-size)
  meta.val_crop_size = 32;
  write_checkpoint(path, *model, &opt_state, &sched_state, meta);
  REQUIRE(fs::exists(path));
  for (const auto& e : fs::directory_iterator(dir.path))  // no temp file left behind
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);

  CheckpointReader ck(path);
  CHECK(ck.path() == path);
  const CheckpointMeta& m = ck.meta();
  CHECK(m.arch == "resnet_tiny");
  CHECK(m.head == "mlp");
  CHECK(m.num_classes == 3);
  CHECK(m.epoch == 3);
  CHECK(m.global_step == 42);
  CHECK(m.best_val_acc == 0.75);
  CHECK(m.world_size == 2);
  CHECK((m.val_resize_size == 36 && m.val_crop_size == 32));
  CHECK(m.args == "resnet_ddp --data 'a b'");
  CHECK(m.class_names == std::vector<std::string>{"class_0", "class_1", "class_2"});
  CHECK(m.optimizer.present);
  CHECK(m.optimizer.config.type == OptimizerKind::Adam);
  CHECK(m.optimizer.config.lr == 1e-3);
  CHECK(m.optimizer.step == 1);
  CHECK(m.scheduler.type == "plateau");
  // torchvision state_dict order: a BN's buffers right after its weight and bias.
  const std::vector<TensorInfo> sd = ck.check_tensors();
  REQUIRE(sd.size() > 5);
  CHECK(sd[0].name == "conv1.weight");
  CHECK(sd[1].name == "bn1.weight");
  CHECK(sd[2].name == "bn1.bias");
  CHECK(sd[3].name == "bn1.running_mean");
  CHECK(sd[4].name == "bn1.running_var");
  CHECK(sd[5].name == "bn1.num_batches_tracked");
  CHECK(sd[5].is_int64_scalar);
  CHECK(sd[5].int_value == 1);
  CHECK(sd.back().name == "fc.2.bias");

  ResNet other(*be, model->config());
  other.init_parameters(99);
  Optimizer opt2(*be, other.params(), other.grads(), oc);
  Scheduler sched2(SchedulerKind::Plateau, 1e-3, 5);
  check_compatible(m, other, m.class_names, path);
  CHECK(ck.load_model(other, false).empty());
  ck.load_optimizer(other, opt2.export_state());
  opt2.import_state(m.optimizer);
  sched2.import_state(m.scheduler);
  CHECK(same_slices(*be, model->params(), other.params().data(), model->params().data()));
  CHECK(same_slices(*be, model->buffers(), other.buffers().data(), model->buffers().data()));
  CHECK(other.num_batches_tracked() == model->num_batches_tracked());
  CHECK(opt2.steps() == 1);
  CHECK(opt2.lr() == 3e-4);
  for (size_t k = 0; k < 2; ++k) CHECK(same_slices(*be, model->params(), opt2.state(k), opt.state(k)));
  CHECK(sched2.last_epoch() == 2);
  CHECK(sched2.plateau.best == 0.8);
  CHECK(sched2.plateau.num_bad_epochs == 1);
  CHECK(eval_logits(other, 3) == eval_logits(*model, 3));

  // A preemption checkpoint carries the partial epoch; cosine state round-trips.
  CheckpointMeta preempted = tiny_meta("mlp", 3);
  preempted.step_in_epoch = 2;
  preempted.partial_count = 5;
  Scheduler cosine(SchedulerKind::Cosine, 1e-3, 5);
  cosine.step(1e-3, 0.5);
  const SchedulerState cosine_state = cosine.export_state();
  write_checkpoint(path, *model, &opt_state, &cosine_state, preempted);
  CheckpointReader p(path);
  CHECK(p.meta().step_in_epoch == 2);
  CHECK(p.meta().partial_count == 5);
  CHECK(p.meta().scheduler.type == "cosine");
  CHECK(p.meta().scheduler.last_epoch == 1);
  CHECK(p.meta().scheduler.cosine.base_lr == cosine.cosine.base_lr);

  // A model-only file: the optimizer cannot resume from it, with the file named.
  const std::string weights = dir.file("weights.h5");
  write_checkpoint(weights, *model, nullptr, nullptr, tiny_meta("mlp", 3));
  CheckpointReader w(weights);
  CHECK_FALSE(w.meta().optimizer.present);
  CHECK_THROWS_WITH(w.load_optimizer(other, opt2.export_state()), Catch::Contains(weights) && Catch::Contains("no /optimizer"));
  Optimizer sgd(*be, other.params(), other.grads(), [] {
    OptimizerConfig c;
    c.type = OptimizerKind::Sgd;
    return c;
  }());
  CHECK_THROWS_WITH(ck.load_optimizer(other, sgd.export_state()), Catch::Contains("--optimizer adam"));
}

TEST_CASE("damaged checkpoints are rejected with the file named", "[train]") {
  TempDir dir;
  auto be = make_cpu_backend({});
  auto model = trained_tiny(*be, HeadKind::Fc, 3, 1);
  const std::string good = dir.file("good.h5");
  write_checkpoint(good, *model, nullptr, nullptr, tiny_meta("fc", 3));
  const auto size = fs::file_size(good);

  SECTION("truncated") {
    const std::string p = dir.file("truncated.h5");
    fs::copy_file(good, p);
    fs::resize_file(p, size / 2);
    CHECK_THROWS_WITH(CheckpointReader(p), Catch::Contains(p));
  }
  SECTION("not HDF5 at all") {
    const std::string p = dir.file("garbage.h5");
    std::ofstream(p) << "this is not a checkpoint\n";
    CHECK_THROWS_AS(CheckpointReader(p), UsageError);
    CHECK_THROWS_WITH(CheckpointReader(p), Catch::Contains("not an HDF5 file") && Catch::Contains(p));
  }
  SECTION("flipped bytes inside tensor data fail the checksum") {
    const auto [name, values] = largest_tensor(*model);
    const std::string p = flip_inside(good, values, dir.file("flipped.h5"));
    CHECK_THROWS_WITH(CheckpointReader(p).check_tensors(), Catch::Contains(p) && Catch::Contains(name));
    auto other = trained_tiny(*be, HeadKind::Fc, 3, 5);
    CHECK_THROWS_WITH(CheckpointReader(p).load_model(*other, false), Catch::Contains(p) && Catch::Contains(name));
  }
  SECTION("missing file") {
    CHECK_THROWS_WITH(CheckpointReader(dir.file("missing.h5")), Catch::Contains("no such file"));
  }
}

TEST_CASE("checkpoints of another arch, head or class set do not fit", "[train]") {
  TempDir dir;
  auto be = make_cpu_backend({});
  auto fc3 = trained_tiny(*be, HeadKind::Fc, 3, 1);
  const std::string path = dir.file("fc3.h5");
  write_checkpoint(path, *fc3, nullptr, nullptr, tiny_meta("fc", 3));
  const CheckpointMeta meta = CheckpointReader(path).meta();
  const auto names = meta.class_names;

  SECTION("metadata") {
    auto mlp3 = trained_tiny(*be, HeadKind::Mlp, 3, 2);
    CHECK_THROWS_WITH(check_compatible(meta, *mlp3, names, path), Catch::Contains("--head") && Catch::Contains(path));
    auto fc4 = trained_tiny(*be, HeadKind::Fc, 4, 2);
    CHECK_THROWS_WITH(check_compatible(meta, *fc4, {}, path), Catch::Contains("classes"));
    CHECK_THROWS_WITH(check_compatible(meta, *fc3, {"x", "y", "z"}, path), Catch::Contains("class names"));
    ResNetConfig r18;
    r18.arch = "resnet18";
    r18.head = HeadKind::Fc;
    r18.num_classes = 3;
    ResNet big(*be, r18);
    CHECK_THROWS_WITH(check_compatible(meta, big, names, path), Catch::Contains("--arch"));
  }
  SECTION("a head of another size: an error, or kept at its init for --init") {
    auto fc4 = trained_tiny(*be, HeadKind::Fc, 4, 2);
    CHECK_THROWS_AS(CheckpointReader(path).load_model(*fc4, false), UsageError);
    CHECK_THROWS_WITH(CheckpointReader(path).load_model(*fc4, false), Catch::Contains(path) && Catch::Contains("fc.weight"));
    const size_t fcw = static_cast<size_t>(fc4->params().find("fc.weight"));
    const std::vector<float> head_before = host(*be, fc4->params().ptr(fcw), fc4->params().slice(fcw).count);
    CheckpointReader init(path, true);
    CHECK(init.load_model(*fc4, true) == std::vector<std::string>{"fc.weight", "fc.bias"});
    const size_t conv1 = static_cast<size_t>(fc4->params().find("conv1.weight"));
    CHECK(host(*be, fc4->params().ptr(conv1), fc4->params().slice(conv1).count) ==
          host(*be, fc3->params().ptr(conv1), fc3->params().slice(conv1).count));
    CHECK(host(*be, fc4->params().ptr(fcw), head_before.size()) == head_before);
    CHECK(fc4->num_batches_tracked() == fc3->num_batches_tracked());
  }
  SECTION("another head kind: a missing tensor") {
    auto mlp = trained_tiny(*be, HeadKind::Mlp, 3, 2);
    CHECK_THROWS_WITH(CheckpointReader(path).load_model(*mlp, false), Catch::Contains(path) && Catch::Contains("missing"));
  }
  SECTION("NaN in a tensor") {
    const ParamSlice& s = fc3->params().slice(0);
    const float nan = std::nanf("");
    be->copy_from_host(fc3->params().ptr(0) + 3, &nan, sizeof nan);
    const std::string p = dir.file("nan.h5");
    write_checkpoint(p, *fc3, nullptr, nullptr, tiny_meta("fc", 3));
    CHECK_THROWS_WITH(CheckpointReader(p).load_model(*fc3, false),
                      Catch::Contains(p) && Catch::Contains(s.name) && Catch::Contains("NaN"));
  }
}

TEST_CASE("a write that fails at any point keeps the previous checkpoint and closes the file", "[train]") {
  TempDir dir;
  auto be = make_cpu_backend({});
  auto model = trained_tiny(*be, HeadKind::Fc, 3, 1);
  OptimizerConfig oc;
  Optimizer opt(*be, model->params(), model->grads(), oc);
  const std::string path = dir.file("last.h5");
  CheckpointMeta meta = tiny_meta("fc", 3);
  const OptimizerState opt_state = opt.export_state();
  write_checkpoint(path, *model, &opt_state, nullptr, meta);
  const auto size = static_cast<rlim_t>(fs::file_size(path));
  // The limit decides where the write fails: the first dataset, a tensor in the
  // middle, or the metadata HDF5 writes when the file is closed.
  const rlim_t limit = GENERATE_COPY(rlim_t{4096}, size / 2, size - 1);
  CAPTURE(limit, size);

  const size_t fds_before = open_fd_count();
  struct rlimit old {};
  getrlimit(RLIMIT_FSIZE, &old);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = limit;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  meta.epoch = 4;
  std::string error;
  try {
    write_checkpoint(path, *model, &opt_state, nullptr, meta);
  } catch (const Error& e) {
    error = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  CHECK_THAT(error, Catch::Contains("cannot write checkpoint '" + path + "'") && Catch::Contains("unchanged") &&
                        Catch::Contains(std::strerror(EFBIG)));
  CHECK(open_fd_count() == fds_before);  // HDF5 let go of the temp file
  CHECK(static_cast<rlim_t>(fs::file_size(path)) == size);
  CHECK(CheckpointReader(path).meta().epoch == 3);
  for (const auto& e : fs::directory_iterator(dir.path))
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("a checkpoint in a missing directory or over a directory fails with the path named", "[train]") {
  TempDir dir;
  auto be = make_cpu_backend({});
  auto model = trained_tiny(*be, HeadKind::Fc, 3, 1);
  const CheckpointMeta meta = tiny_meta("fc", 3);
  const std::string missing = dir.file("no/such/dir/x.h5");
  CHECK_THROWS_WITH(write_checkpoint(missing, *model, nullptr, nullptr, meta),
                    Catch::Contains(missing) && Catch::Contains(std::strerror(ENOENT)));
  // The temp file is written, but a directory is in the way of the rename.
  const std::string blocked = dir.file("blocked.h5");
  fs::create_directories(fs::path(blocked) / "inside");
  CHECK_THROWS_WITH(write_checkpoint(blocked, *model, nullptr, nullptr, meta),
                    Catch::Contains(blocked) && Catch::Contains("rename"));
  CHECK(fs::is_directory(fs::path(blocked) / "inside"));
  for (const auto& e : fs::directory_iterator(dir.path))
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("every run position field is in the field list and round-trips through a checkpoint", "[train]") {
  // The list covers the struct: a field added to RunPosition but not to
  // for_each_position_field (so never written nor read) fails here.
  RunPosition distinct;
  size_t listed_bytes = 0;
  std::set<std::string> names;
  double next = 1;
  for_each_position_field(distinct, [&](const PositionField& field, auto& value) {
    listed_bytes += sizeof(value);
    CHECK(names.insert(field.name).second);
    value = static_cast<std::decay_t<decltype(value)>>(next++ * 3);  // distinct, non-default
  });
  CHECK(listed_bytes == sizeof(RunPosition));
  CHECK(names.count("global_step") == 1);
  CHECK(names.count("partial_train_count") == 1);  // the attribute keeps its on-disk name

  TempDir dir;
  auto be = make_cpu_backend({});
  auto model = trained_tiny(*be, HeadKind::Mlp, 3, 11);
  const std::string path = dir.file("position.h5");
  auto values = [](const RunPosition& p) {
    std::vector<double> out;
    for_each_position_field(p, [&](const PositionField&, auto v) { out.push_back(static_cast<double>(v)); });
    return out;
  };
  // A preemption checkpoint (step_in_epoch > 0) holds every field.
  CheckpointMeta preempted = tiny_meta("mlp", 3);
  static_cast<RunPosition&>(preempted) = distinct;
  REQUIRE(preempted.step_in_epoch > 0);
  write_checkpoint(path, *model, nullptr, nullptr, preempted);
  CHECK(values(CheckpointReader(path).meta()) == values(distinct));

  // An end-of-epoch one leaves out the partial-epoch sums: they read as none.
  CheckpointMeta at_epoch_end = preempted;
  at_epoch_end.step_in_epoch = 0;
  write_checkpoint(path, *model, nullptr, nullptr, at_epoch_end);
  const CheckpointMeta read = CheckpointReader(path).meta();
  CHECK(read.global_step == distinct.global_step);
  CHECK(read.best_val_loss == distinct.best_val_loss);
  CHECK(read.partial_loss_sum == 0.0);
  CHECK(read.partial_correct == 0);
  CHECK(read.partial_count == 0);
}
