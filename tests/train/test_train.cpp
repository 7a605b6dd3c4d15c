// Trainer building blocks without MPI: CLI parsing, number formatting, LR
// schedulers and optimizers against PyTorch, checkpoint round trips and the
// rejection of damaged or mismatched files.
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "common/compare.h"
#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/dist/launcher.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/shell_quote.h"
#include "resnet_ddp/train/checkpoint.h"
#include "resnet_ddp/train/cli.h"
#include "parse_cli.h"
#include "resnet_ddp/train/optimizer.h"
#include "resnet_ddp/train/output_lock.h"
#include "resnet_ddp/train/report.h"

namespace fs = std::filesystem;
using namespace rd;
using namespace rd::train;

namespace {

ParsedCommand parse(std::vector<std::string> args) { return parse_cli(std::move(args)); }

std::string usage_error(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("rd_train_test_" + std::to_string(getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::vector<float> host(Backend& be, const float* p, size_t n) {
  std::vector<float> v(n);
  be.copy_to_host(v.data(), p, n * sizeof(float));
  return v;
}

// Slice-by-slice equality (the arena's alignment padding is not state).
bool same_slices(Backend& be, const Arena& layout, const float* a, const float* b) {
  for (const auto& s : layout.slices())
    if (host(be, a + s.offset, s.count) != host(be, b + s.offset, s.count)) {
      UNSCOPED_INFO("slice " << s.name << " differs");
      return false;
    }
  return true;
}

// A tiny model that has seen one training batch, so BN buffers and
// num_batches_tracked are not at their initial values.
std::unique_ptr<ResNet> trained_tiny(Backend& be, HeadKind head, int classes, uint64_t seed) {
  ResNetConfig cfg;
  cfg.arch = "resnet_tiny";
  cfg.head = head;
  cfg.num_classes = classes;
  auto m = std::make_unique<ResNet>(be, cfg);
  m->init_parameters(seed);
  m->train(true);
  Tensor& in = m->input_buffer(4, 32, 32);
  std::vector<float> x = rd::test::random_floats(static_cast<size_t>(4 * 3 * 32 * 32), seed + 1);
  be.copy_from_host_nchw(x.data(), in);
  m->forward(in);
  return m;
}

std::vector<float> eval_logits(ResNet& m, uint64_t seed) {
  Backend& be = m.backend();
  m.train(false);
  Tensor& in = m.input_buffer(2, 32, 32);
  std::vector<float> x = rd::test::random_floats(static_cast<size_t>(2 * 3 * 32 * 32), seed);
  be.copy_from_host_nchw(x.data(), in);
  const Tensor& y = m.forward(in);
  std::vector<float> out(static_cast<size_t>(y.numel()));
  be.copy_to_host(out.data(), y.data, out.size() * sizeof(float));
  return out;
}

CheckpointMeta tiny_meta(const std::string& head, int classes) {
  CheckpointMeta m;
  m.arch = "resnet_tiny";
  m.head = head;
  m.num_classes = classes;
  m.image_size = 32;
  m.epoch = 3;
  m.global_step = 42;
  m.best_val_acc = 0.75;
  m.best_val_loss = 0.5;
  m.val_acc = 0.625;
  m.val_loss = 0.6;
  m.world_size = 2;
  m.batch_size = 4;
  m.seed = 7;
  m.args = "resnet_ddp --data 'a b'";
  m.created_by = "test";
  for (int i = 0; i < classes; ++i) m.class_names.push_back("class_" + std::to_string(i));
  return m;
}

}  // namespace

TEST_CASE("py_float prints like Python's repr", "[train]") {
  CHECK(py_float(0.1) == "0.1");
  CHECK(py_float(1.0) == "1.0");
  CHECK(py_float(100.0) == "100.0");
  CHECK(py_float(0.875) == "0.875");
  CHECK(py_float(-0.3) == "-0.3");
  CHECK(py_float(0.0001) == "0.0001");
  CHECK(py_float(1e-05) == "1e-05");
  CHECK(py_float(1.0000000000000002e-06) == "1.0000000000000002e-06");
  CHECK(py_float(1e16) == "1e+16");
  CHECK(py_float(1234567890123456.0) == "1234567890123456.0");
  CHECK(py_float(static_cast<double>(0.5654761791229248f)) == "0.5654761791229248");
  CHECK(py_float(2.0 / 3.0) == "0.6666666666666666");
  CHECK(py_float(0.0) == "0.0");
  CHECK(py_float(NAN) == "nan");
}

TEST_CASE("train defaults are the reference recipe", "[train]") {
  ParsedCommand pc = parse({"--data", "/tmp/Dataset_2"});
  REQUIRE(pc.command == Command::Train);
  const TrainOptions& t = pc.train;
  CHECK(t.data == "/tmp/Dataset_2");
  CHECK(t.arch == Arch::ResNet34);
  CHECK(t.head == rd::HeadKind::Mlp);
  CHECK(t.image_size == 244);
  CHECK(t.batch_size == 16);
  CHECK(t.epochs == 5);
  CHECK(t.lr == 1e-4);
  CHECK(t.optimizer == OptimizerKind::Adam);
  CHECK(t.weight_decay == 0.0);
  CHECK(t.label_smoothing == 0.1);
  CHECK(t.scheduler == SchedulerKind::Plateau);
  CHECK(t.output_dir == "output_model");
  CHECK(t.resume == ResumeMode::Auto);
  CHECK(t.precision == rd::Precision::FP32);
  CHECK(t.device == Device::Auto);
  CHECK(t.accum_steps == 1);
  CHECK(t.metrics_path() == "output_model/metrics.csv");
  CHECK(t.command_line == "resnet_ddp --data /tmp/Dataset_2");
}

TEST_CASE("train flags parse in both spellings", "[train]") {
  ParsedCommand pc = parse({"train", "--data=/d", "--arch", "resnet18", "--head=fc", "--batch-size", "8",
                            "--lr", "3e-3", "--optimizer", "sgd", "--momentum", "0.8", "--nesterov", "--sync-bn",
                            "--scheduler", "cosine", "--max-steps", "5", "--deterministic", "--resume", "none",
                            "--metrics", "m.csv", "--precision", "bf16"});
  const TrainOptions& t = pc.train;
  CHECK(t.data == "/d");
  CHECK(t.arch == Arch::ResNet18);
  CHECK(t.head == rd::HeadKind::Fc);
  CHECK(t.batch_size == 8);
  CHECK(t.lr == 3e-3);
  CHECK(t.optimizer == OptimizerKind::Sgd);
  CHECK(t.momentum == 0.8);
  CHECK(t.nesterov);
  CHECK(t.sync_bn);
  CHECK(t.scheduler == SchedulerKind::Cosine);
  CHECK(t.max_steps == 5);
  CHECK(t.deterministic);
  CHECK(t.resume == ResumeMode::None);
  CHECK(t.metrics_path() == "m.csv");
  CHECK(t.precision == rd::Precision::BF16);
}

TEST_CASE("CLI errors name the flag", "[train]") {
  CHECK_THAT(usage_error({"--data", "x", "--lrr", "1"}), Catch::Contains("--lrr") && Catch::Contains("--lr?"));
  CHECK_THAT(usage_error({"--data", "x", "--lr", "abc"}), Catch::Contains("--lr") && Catch::Contains("abc"));
  CHECK_THAT(usage_error({"--data", "x", "--lr", "-1"}), Catch::Contains("--lr"));
  CHECK_THAT(usage_error({"--data", "x", "--batch-size", "0"}), Catch::Contains("--batch-size"));
  CHECK_THAT(usage_error({"--data", "x", "--epochs", "2.5"}), Catch::Contains("--epochs"));
  CHECK_THAT(usage_error({"--data", "x", "--arch", "resnet99"}), Catch::Contains("--arch") && Catch::Contains("resnet18"));
  CHECK_THAT(usage_error({"--data", "x", "--optimizer", "lion"}), Catch::Contains("--optimizer"));
  CHECK_THAT(usage_error({"--data", "x", "--precision", "fp8"}), Catch::Contains("--precision"));
  CHECK_THAT(usage_error({"--data"}), Catch::Contains("--data") && Catch::Contains("missing value"));
  CHECK_THAT(usage_error({"--epochs", "3"}), Catch::Contains("--data") && Catch::Contains("required"));
  CHECK_THAT(usage_error({"--data", "x", "stray"}), Catch::Contains("stray"));
  CHECK_THAT(usage_error({"--data", "x", "--sync-bn=yes"}), Catch::Contains("--sync-bn"));
  CHECK_THAT(usage_error({"--data", "x", "--nesterov"}), Catch::Contains("--nesterov"));
  CHECK_THAT(usage_error({"frobnicate"}), Catch::Contains("frobnicate"));
  CHECK_THAT(usage_error({"predict", "img.png"}), Catch::Contains("--checkpoint"));
  CHECK_THAT(usage_error({"predict", "--checkpoint", "c.h5"}), Catch::Contains("no input"));
  CHECK_THAT(usage_error({"info"}), Catch::Contains("checkpoint"));
  CHECK_THAT(usage_error({}), Catch::Contains("--data"));
}

TEST_CASE("every subcommand has --help", "[train]") {
  for (const char* cmd : {"train", "predict", "info"}) {
    ParsedCommand pc = parse({cmd, "--help"});
    CHECK(pc.command == Command::Help);
    CHECK_THAT(pc.help_text, Catch::Contains(std::string("resnet_ddp ") + (std::string(cmd) == "train" ? "" : cmd)));
  }
  ParsedCommand top = parse({"--help"});
  CHECK(top.command == Command::Help);
  CHECK_THAT(top.help_text, Catch::Contains("predict") && Catch::Contains("synth"));
  CHECK_THAT(command_help(Command::Train), Catch::Contains("--image-size") && Catch::Contains("[default: 244]") &&
                               Catch::Contains("--label-smoothing") && Catch::Contains("--resume"));
  ParsedCommand synth = parse({"synth", "--help"});
  CHECK(synth.command == Command::Synth);
  CHECK(synth.passthrough == std::vector<std::string>{"synth", "--help"});
}

TEST_CASE("shell quoting round-trips awkward arguments", "[train]") {
  CHECK(shell_quote("--lr") == "--lr");
  CHECK(shell_quote("a b") == "'a b'");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  CHECK(shell_quote("") == "''");
}

TEST_CASE("a recorded command line reads back into the same flags", "[train]") {
  // Resume compares this run's flags with the ones the checkpoint's `args` recorded.
  std::vector<std::string> args = {"resnet_ddp", "--data", "/d ir/it's", "--lr", "1e-2", "--no-sync-bn"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  const std::string line = join_command_line(static_cast<int>(argv.size()), argv.data());
  CHECK(split_command_line(line) == args);
  const std::vector<std::string> words = split_command_line(line);
  const ParsedCommand pc = parse(std::vector<std::string>(words.begin() + 1, words.end()));
  CHECK(pc.train.given == std::vector<std::string>{"--data", "--lr", "--no-sync-bn"});
  CHECK(pc.train.was_given("--lr"));
  CHECK_FALSE(pc.train.was_given("--epochs"));
  TrainOptions other = parse({"--data", "x", "--lr", "0.01"}).train;
  auto value = [](const TrainOptions& o, const std::string& flag) {
    for (auto& [f, v] : train_flag_values(o))
      if (f == flag) return v;
    return std::string("?");
  };
  CHECK(value(pc.train, "--lr") == "0.01");  // 1e-2 and 0.01 are one value
  CHECK(value(pc.train, "--lr") == value(other, "--lr"));
  CHECK(value(pc.train, "--sync-bn") == "off");
  CHECK(value(other, "--sync-bn") == "on");
  CHECK(value(other, "--epochs") == "5");
}

TEST_CASE("a world of 1 under a launcher that started more tasks is named with the fix", "[train]") {
  const char* vars[] = {"OMPI_COMM_WORLD_SIZE", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_NTASKS", "SLURM_NPROCS",
                        "WORLD_SIZE"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* v : vars) {
    if (const char* x = std::getenv(v)) saved.emplace_back(v, x);
    ::unsetenv(v);
  }
  CHECK(dist::launcher_world_mismatch(1).empty());
  ::setenv("SLURM_NTASKS", "4", 1);
  CHECK(dist::launcher_world_mismatch(1).empty());  // the batch script itself, not a step
  ::setenv("SLURM_STEP_ID", "0", 1);
  const std::string m = dist::launcher_world_mismatch(1);
  CHECK(m.find("SLURM_NTASKS=4") != std::string::npos);
  CHECK(m.find("srun --mpi=pmix") != std::string::npos);
  CHECK(m.find("srun --mpi=list") != std::string::npos);
  CHECK(m.find("mpirun -np N") != std::string::npos);
  CHECK(dist::launcher_world_mismatch(4).empty());
  ::unsetenv("SLURM_STEP_ID");
  ::unsetenv("SLURM_NTASKS");
  ::setenv("WORLD_SIZE", "2", 1);
  CHECK(dist::launcher_world_mismatch(1).find("WORLD_SIZE=2") != std::string::npos);
  ::unsetenv("WORLD_SIZE");
  ::setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
  CHECK(dist::launcher_world_mismatch(1).empty());
  ::setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
  CHECK(dist::launcher_world_mismatch(1).find("OMPI_COMM_WORLD_SIZE=3") != std::string::npos);
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  for (auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
}

TEST_CASE("the output folder lock is exclusive, names its holder and reports a crashed one", "[train]") {
  const fs::path dir = fs::temp_directory_path() / ("rd_lock_test." + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::string stale = "x";
    OutputLock a = OutputLock::acquire(dir.string(), &stale);
    CHECK(a.held());
    CHECK(stale.empty());
    try {
      OutputLock::acquire(dir.string());
      FAIL("a second lock on the same folder was granted");
    } catch (const UsageError& e) {
      const std::string m = e.what();
      CHECK(m.find("'" + dir.string() + "' is in use by another run") != std::string::npos);
      CHECK(m.find(" pid " + std::to_string(::getpid()) + " ") != std::string::npos);
    }
    CHECK(a.held());  // the refused attempt left the holder's record alone
  }
  {
    std::ifstream f(dir / "resnet_ddp.lock");
    std::string content((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    CHECK(content.empty());  // released cleanly
  }
  {
    std::ofstream(dir / "resnet_ddp.lock") << "host h pid 1 since then\n";  // as a killed holder leaves it
    std::string stale;
    OutputLock b = OutputLock::acquire(dir.string(), &stale);
    CHECK(stale == "host h pid 1 since then");
  }
  fs::remove_all(dir);
}

TEST_CASE("ReduceLROnPlateau matches torch 1.13", "[train]") {
  // lr after each step(loss), from torch.optim.lr_scheduler.ReduceLROnPlateau(Adam(lr=1e-4),
  // mode='min', factor=0.1, patience=5, min_lr=1e-8) on these losses (torch 1.13.1).
  const std::vector<double> losses = {1.0, 0.9, 0.95, 0.9, 0.8999, 0.91, 0.92, 0.93, 0.94, 0.95, 0.96, 0.5, 0.6, 0.6, 0.6,
                                      0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6};
  const std::vector<double> torch_lr = {
      0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001, 0.0001,
      1e-05, 1e-05, 1e-05, 1e-05, 1e-05, 1e-05, 1e-05, 1.0000000000000002e-06, 1.0000000000000002e-06,
      1.0000000000000002e-06, 1.0000000000000002e-06, 1.0000000000000002e-06, 1.0000000000000002e-06,
      1.0000000000000002e-07, 1.0000000000000002e-07, 1.0000000000000002e-07, 1.0000000000000002e-07,
      1.0000000000000002e-07, 1.0000000000000002e-07, 1.0000000000000004e-08};
  Scheduler s(SchedulerKind::Plateau, 1e-4, 5);
  double lr = 1e-4;
  for (size_t i = 0; i < losses.size(); ++i) {
    lr = s.step(lr, losses[i]);
    INFO("step " << i + 1);
    CHECK(lr == torch_lr[i]);
  }
  // min_lr is a floor and changes smaller than eps are not applied.
  for (int i = 0; i < 20; ++i) lr = s.step(lr, 0.6);
  CHECK(lr == Approx(1e-8).epsilon(1e-6));
}

TEST_CASE("CosineAnnealingLR matches torch 1.13", "[train]") {
  // CosineAnnealingLR(Adam(lr=0.1), T_max=5), lr after each step (torch 1.13.1),
  // including the restart beyond T_max.
  const std::vector<double> torch_lr = {0.09045084971874738, 0.06545084971874737, 0.03454915028125263,
                                        0.009549150281252633, 0.0, 0.009549150281252628, 0.03454915028125265,
                                        0.06545084971874741, 0.09045084971874744, 0.10000000000000006,
                                        0.09045084971874746, 0.06545084971874743};
  Scheduler s(SchedulerKind::Cosine, 0.1, 5);
  double lr = 0.1;
  for (size_t i = 0; i < torch_lr.size(); ++i) {
    lr = s.step(lr, 0.0);
    INFO("step " << i + 1);
    CHECK(lr == Approx(torch_lr[i]).margin(1e-15));
  }
  Scheduler none(SchedulerKind::None, 0.1, 5);
  CHECK(none.step(0.1, 1.0) == 0.1);
}

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
  write_checkpoint(path, *model, &opt, &sched, tiny_meta("mlp", 3));
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
  ck.load_optimizer(other, opt2);
  restore_scheduler(m.scheduler, sched2);
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
  preempted.partial_train_count = 5;
  Scheduler cosine(SchedulerKind::Cosine, 1e-3, 5);
  cosine.step(1e-3, 0.5);
  write_checkpoint(path, *model, &opt, &cosine, preempted);
  CheckpointReader p(path);
  CHECK(p.meta().step_in_epoch == 2);
  CHECK(p.meta().partial_train_count == 5);
  CHECK(p.meta().scheduler.type == "cosine");
  CHECK(p.meta().scheduler.last_epoch == 1);
  CHECK(p.meta().scheduler.cosine.base_lr == cosine.cosine.base_lr);

  // A model-only file: the optimizer cannot resume from it, with the file named.
  const std::string weights = dir.file("weights.h5");
  write_checkpoint(weights, *model, nullptr, nullptr, tiny_meta("mlp", 3));
  CheckpointReader w(weights);
  CHECK_FALSE(w.meta().optimizer.present);
  CHECK_THROWS_WITH(w.load_optimizer(other, opt2), Catch::Contains(weights) && Catch::Contains("no /optimizer"));
  Optimizer sgd(*be, other.params(), other.grads(), [] {
    OptimizerConfig c;
    c.type = OptimizerKind::Sgd;
    return c;
  }());
  CHECK_THROWS_WITH(ck.load_optimizer(other, sgd), Catch::Contains("--optimizer adam"));
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
  write_checkpoint(path, *model, &opt, nullptr, meta);
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
    write_checkpoint(path, *model, &opt, nullptr, meta);
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

TEST_CASE("metrics CSV keeps earlier epochs on resume", "[train]") {
  TempDir dir;
  const std::string p = dir.file("metrics.csv");
  {
    MetricsCsv csv(p, false, 1);
    for (int e = 1; e <= 3; ++e) {
      EpochMetrics m;
      m.epoch = e;
      m.val_acc = 0.5;
      csv.write(m);
    }
  }
  MetricsCsv resumed(p, true, 3);  // epoch 3 is re-run after a preemption
  EpochMetrics m;
  m.epoch = 3;
  resumed.write(m);
  std::ifstream in(p);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0] == MetricsCsv::header());
  CHECK(lines[1].rfind("1,", 0) == 0);
  CHECK(lines[2].rfind("2,", 0) == 0);
  CHECK(lines[3].rfind("3,", 0) == 0);
}

TEST_CASE("path checks run before MPI and name the flag", "[train]") {
  TempDir dir;
  TrainOptions o;
  o.data = dir.file("nope");
  CHECK_THROWS_WITH(check_train_paths(o, true), Catch::Contains("--data"));
  o.data = dir.path.string();
  o.init = dir.file("missing.h5");
  CHECK_THROWS_WITH(check_train_paths(o, true), Catch::Contains("--init"));
  o.init.clear();
  o.resume = ResumeMode::File;
  o.resume_file = dir.file("missing.h5");
  CHECK_THROWS_WITH(check_train_paths(o, true), Catch::Contains("--resume"));
  o.resume = ResumeMode::Auto;
  std::ofstream(dir.file("plainfile")) << "x";
  o.output_dir = dir.file("plainfile") + "/sub";
  CHECK_THROWS_WITH(check_train_paths(o, true), Catch::Contains("--output-dir"));
  o.output_dir = dir.file("out");
  CHECK_NOTHROW(check_train_paths(o, true));
  CHECK(fs::is_directory(dir.file("out")));
}
