// The train command line without MPI: defaults, both flag spellings, errors that name
// the flag, --help, shell quoting and the recorded command line, launcher mismatch
// and the path checks that run before MPI starts.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "parse_cli.h"
#include "resnet_ddp/app/commands.h"
#include "resnet_ddp/dist/launcher.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/train/cli.h"
#include "train/train_test_util.h"

namespace fs = std::filesystem;
using namespace rd;
using namespace rd::train;
using rd::test::TempDir;

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

}  // namespace

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

TEST_CASE("resume reads a recorded train command line as the program's table does", "[train]") {
  // The trainer reads recorded lines without the subcommand table (it sits above it).
  for (const std::vector<std::string>& words :
       {std::vector<std::string>{"resnet_ddp", "--data", "/d", "--lr", "1e-2", "--no-sync-bn", "-b", "8"},
        std::vector<std::string>{"resnet_ddp", "train", "--data", "/d", "--recipe", "tutorial", "--epochs", "3"}}) {
    const TrainOptions table = parse(std::vector<std::string>(words.begin() + 1, words.end())).train;
    const TrainOptions recorded = parse_train_command_line(words);
    CHECK(train_flag_values(recorded) == train_flag_values(table));
    CHECK(recorded.given == table.given);
    CHECK(recorded.command_line == table.command_line);
  }
  // Not a training run: another command, an unknown word, help, or the train checks' errors.
  for (const std::vector<std::string>& words :
       {std::vector<std::string>{"resnet_ddp"}, std::vector<std::string>{"resnet_ddp", "predict", "--checkpoint", "c.h5"},
        std::vector<std::string>{"resnet_ddp", "bogus"}, std::vector<std::string>{"resnet_ddp", "--data", "/d", "--help"},
        std::vector<std::string>{"resnet_ddp", "train"}})
    CHECK_THROWS_AS(parse_train_command_line(words), rd::UsageError);
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

TEST_CASE("the launcher's world size: its count, 1 without a launcher, 0 when it does not say", "[train]") {
  const char* vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "SLURM_STEP_ID", "SLURM_STEPID",
                        "SLURM_NTASKS"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* v : vars) {
    if (const char* x = std::getenv(v)) saved.emplace_back(v, x);
    ::unsetenv(v);
  }
  CHECK(dist::launcher_world_size() == 1);
  ::setenv("SLURM_NTASKS", "4", 1);
  CHECK(dist::launcher_world_size() == 1);  // the batch script itself: its run is one process
  ::setenv("SLURM_STEP_ID", "0", 1);
  CHECK(dist::launcher_world_size() == 4);
  ::unsetenv("SLURM_NTASKS");
  CHECK(dist::launcher_world_size() == 0);  // a step that does not say
  ::unsetenv("SLURM_STEP_ID");
  ::setenv("PMIX_RANK", "0", 1);
  CHECK(dist::launcher_world_size() == 0);
  ::setenv("PMI_SIZE", "3", 1);
  CHECK(dist::launcher_world_size() == 3);
  ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  CHECK(dist::launcher_world_size() == 2);
  for (const char* v : vars) ::unsetenv(v);
  for (auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
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

TEST_CASE("data: torchvision preset flags, their defaults and their errors", "[train][data]") {
  // Defaults: the tutorial's pipeline (AutoAugment -> Resize((244, 244))) untouched.
  const TrainOptions d = parse({"--data", "x"}).train;
  const data::TransformConfig dc = transform_config(d);
  CHECK(dc.augment == data::TransformConfig::Augment::AutoAugment);
  CHECK(!dc.train_preset());
  CHECK(!dc.eval_preset());
  CHECK(dc.random_erase == 0.0);
  CHECK(eval_image_size(d) == 244);

  // The reference recipe's spellings (references/classification/train.py).
  const TrainOptions t = parse({"--data", "x", "--train-crop-size", "176", "--val-resize-size", "232",
                                "--val-crop-size", "224", "--auto-augment", "ta_wide", "--random-erase", "0.1",
                                "--interpolation", "bilinear", "--hflip-prob", "0.25"})
                             .train;
  const data::TransformConfig tc = transform_config(t);
  CHECK(tc.train_crop_size == 176);
  CHECK(tc.val_resize_size == 232);
  CHECK(tc.val_crop_size == 224);
  CHECK(tc.auto_augment == data::TransformConfig::Policy::TrivialAugmentWide);
  CHECK(tc.random_erase == 0.1);
  CHECK(tc.hflip_prob == 0.25);
  CHECK(eval_image_size(t) == 224);
  CHECK(parse({"--data", "x", "--train-crop-size", "32", "--auto-augment", "ra", "--ra-magnitude", "30"})
            .train.ra_magnitude == 30);
  // One evaluation size takes torchvision's default for the other.
  CHECK(parse({"--data", "x", "--val-crop-size", "200"}).train.val_resize_size == 256);
  CHECK(parse({"--data", "x", "--val-resize-size", "300"}).train.val_crop_size == 224);

  CHECK_THAT(usage_error({"--data", "x", "--auto-augment", "ra"}),
             Catch::Contains("--auto-augment") && Catch::Contains("--train-crop-size"));
  CHECK_THAT(usage_error({"--data", "x", "--train-crop-size", "64", "--auto-augment", "augmix"}),
             Catch::Contains("--auto-augment") && Catch::Contains("ta_wide"));
  CHECK_THAT(usage_error({"--data", "x", "--hflip-prob", "0.3"}),
             Catch::Contains("--hflip-prob") && Catch::Contains("--train-crop-size"));
  CHECK_THAT(usage_error({"--data", "x", "--train-crop-size", "64", "--augment", "flip"}),
             Catch::Contains("--augment flip") && Catch::Contains("--auto-augment"));
  CHECK(parse({"--data", "x", "--train-crop-size", "64", "--augment", "none"}).train.train_crop_size == 64);
  CHECK_THAT(usage_error({"--data", "x", "--train-crop-size", "64", "--ra-magnitude", "5"}),
             Catch::Contains("--ra-magnitude") && Catch::Contains("ra"));
  CHECK_THAT(usage_error({"--data", "x", "--train-crop-size", "64", "--auto-augment", "ra", "--ra-magnitude", "31"}),
             Catch::Contains("--ra-magnitude"));
  CHECK_THAT(usage_error({"--data", "x", "--interpolation", "bicubic"}),
             Catch::Contains("--interpolation bicubic") && Catch::Contains("only bilinear"));
  CHECK_THAT(usage_error({"--data", "x", "--train-crop-size", "4"}), Catch::Contains("--train-crop-size 4"));
  CHECK_THAT(usage_error({"--data", "x", "--val-crop-size", "28"}),
             Catch::Contains("--val-crop-size 28") && Catch::Contains("32..4096"));
  CHECK_THAT(usage_error({"--data", "x", "--val-crop-size", "5000"}), Catch::Contains("--val-crop-size"));
  CHECK_THAT(usage_error({"--data", "x", "--random-erase", "1.5"}), Catch::Contains("--random-erase"));
  CHECK_THAT(usage_error({"--data", "x", "--train-crop-size", "64", "--hflip-prob", "-0.1"}),
             Catch::Contains("--hflip-prob"));
}
