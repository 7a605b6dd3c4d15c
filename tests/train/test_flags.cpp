// The flags users bring from timm and PyTorch's examples: aliases and what "did you
// mean" says about them, --amp against --precision, split folder names, and --config
// files (format, precedence over the command line, errors naming file and line).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "resnet_ddp/app/commands.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/shell_quote.h"
#include "resnet_ddp/train/cli.h"
#include "resnet_ddp/train/recipes.h"
#include "parse_cli.h"

namespace fs = std::filesystem;
using namespace rd;
using namespace rd::train;

namespace {

ParsedCommand parse_args(std::vector<std::string> args) { return parse_cli(std::move(args)); }

TrainOptions parse_train(std::vector<std::string> args) { return parse_args(std::move(args)).train; }

// The UsageError's message; "" (and a failed check) when parsing succeeded or threw
// anything else.
std::string usage_error(std::vector<std::string> args) {
  try {
    parse_args(std::move(args));
  } catch (const UsageError& e) {
    return e.what();
  }
  FAIL_CHECK("no UsageError");
  return "";
}

struct FlagFile {
  fs::path path;
  explicit FlagFile(const std::string& text, const std::string& ext = ".conf") {
    path = fs::temp_directory_path() /
           ("rd_flags_test_" + std::to_string(getpid()) + "_" + std::to_string(std::random_device{}()) + ext);
    std::ofstream(path, std::ios::binary) << text;
  }
  ~FlagFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
  std::string str() const { return path.string(); }
};

}  // namespace

TEST_CASE("timm and PyTorch spellings set the flags they stand for", "[train][flags]") {
  const TrainOptions t = parse_train({"--data", "d", "-b", "32", "-j", "4", "--model", "resnet50", "--output", "out",
                                "--opt", "sgd", "--sched", "cosine", "--wd", "0.05", "--smoothing", "0.2",
                                "--log-interval", "7"});
  CHECK(t.batch_size == 32);
  CHECK(t.workers == 4);
  CHECK(t.arch == Arch::ResNet50);
  CHECK(t.output_dir == "out");
  CHECK(t.optimizer == OptimizerKind::Sgd);
  CHECK(t.scheduler == SchedulerKind::Cosine);
  CHECK(t.weight_decay == 0.05);
  CHECK(t.label_smoothing == 0.2);
  CHECK(t.log_every == 7);
  // Resume asks was_given() by the flag's own name.
  for (const char* f : {"--batch-size", "--workers", "--arch", "--output-dir", "--optimizer", "--scheduler"})
    CHECK(t.was_given(f));
  CHECK_FALSE(t.was_given("-b"));

  CHECK(parse_train({"--data", "d", "-a", "resnet18", "--print-freq", "3"}).arch == Arch::ResNet18);
  CHECK(parse_train({"--data", "d", "--model=resnet18"}).arch == Arch::ResNet18);
  CHECK(parse_train({"--data", "d", "--print-freq", "3"}).log_every == 3);

  const PredictOptions p = parse_args({"predict", "--checkpoint", "c.h5", "-b", "5", "-j", "3", "img.png"}).predict;
  CHECK(p.batch_size == 5);
  CHECK(p.workers == 3);

  // A bad value is reported under the spelling that was typed.
  CHECK_THAT(usage_error({"--data", "d", "-b", "0"}), Catch::StartsWith("-b: expected an integer in [1,"));
  CHECK_THAT(usage_error({"--data", "d", "--model", "vit"}), Catch::StartsWith("--model: expected one of resnet18"));
}

TEST_CASE("help lists each alias next to its flag", "[train][flags]") {
  const std::string h = command_help(Command::Train);
  for (const char* s : {"  --batch-size, -b N ", "  --workers, -j N ", "  --arch, --model, -a resnet18|",
                        "  --output-dir, --output DIR ", "  --optimizer, --opt adam|sgd|adamw|rmsprop|lars|lamb\n",
                        "  --scheduler, --sched, --lr-scheduler plateau|", "  --weight-decay, --wd X ",
                        "  --log-every, --log-interval, --print-freq N", "  --amp ", "  --config FILE ",
                        "  --train-split NAME ", "  --val-split NAME "})
    CHECK_THAT(h, Catch::Contains(s));
  CHECK_THAT(command_help(Command::Predict), Catch::Contains("  --batch-size, -b N ") && Catch::Contains("  --val-split NAME "));
}

TEST_CASE("did you mean names the flag an alias stands for", "[train][flags]") {
  CHECK_THAT(usage_error({"--data", "d", "--batchsize", "3"}), Catch::Contains("(did you mean --batch-size?)"));
  // A shortened name: its flag, not the nearer-by-edits --arch.
  CHECK_THAT(usage_error({"--data", "d", "--batch", "3"}), Catch::Contains("(did you mean --batch-size?)"));
  CHECK_THAT(usage_error({"--data", "d", "--schedul", "x"}), Catch::Contains("(did you mean --scheduler?)"));
  CHECK_THAT(usage_error({"--data", "d", "--opts", "sgd"}),
             Catch::Contains("(did you mean --optimizer, also spelled --opt?)"));
  CHECK_THAT(usage_error({"--data", "d", "--models", "x"}), Catch::Contains("(did you mean --arch, also spelled --model?)"));
  CHECK_THAT(usage_error({"--data", "d", "--outputs", "x"}),
             Catch::Contains("(did you mean --output-dir, also spelled --output?)"));
  // A one-letter flag is as near to -b as to -j: no guess at all.
  const std::string c = usage_error({"--data", "d", "-c", "cfg.yaml"});
  CHECK_THAT(c, Catch::StartsWith("unknown flag '-c' for 'train'"));
  CHECK_THAT(c, !Catch::Contains("did you mean"));
  // An ambiguous prefix (--val-batch-size, --val-split) falls back to edit distance.
  CHECK_THAT(usage_error({"--data", "d", "--val", "x"}), Catch::StartsWith("unknown flag '--val'"));
}

TEST_CASE("a flag given twice in any spelling keeps the last value", "[train][flags]") {
  CHECK(parse_train({"--data", "d", "-b", "8", "--batch-size", "4"}).batch_size == 4);
  CHECK(parse_train({"--data", "d", "--batch-size", "4", "-b", "8"}).batch_size == 8);
  CHECK(parse_train({"--data", "d", "--model", "resnet18", "--arch", "resnet50"}).arch == Arch::ResNet50);
  CHECK(parse_train({"--data", "d", "--output-dir", "a", "--output", "b"}).output_dir == "b");
}

TEST_CASE("of --amp and --precision the later one wins", "[train][flags]") {
  // The precision --amp stands for is chosen with the device (trainer; e2e flags_layouts).
  TrainOptions t = parse_train({"--data", "d", "--amp"});
  CHECK(t.amp);
  CHECK(t.precision == Precision::FP32);
  t = parse_train({"--data", "d", "--amp", "--precision", "fp32"});
  CHECK_FALSE(t.amp);
  CHECK(t.precision == Precision::FP32);
  t = parse_train({"--data", "d", "--precision", "bf16", "--amp"});
  CHECK(t.amp);
  CHECK_FALSE(parse_train({"--data", "d"}).amp);
  CHECK_THAT(usage_error({"--data", "d", "--amp=fp16"}), Catch::StartsWith("--amp: takes no value"));
}

TEST_CASE("split folder names: ImageNet's train/ val/ and bad names", "[train][flags]") {
  TrainOptions t = parse_train({"--data", "d", "--train-split", "train", "--val-split", "val"});
  CHECK(t.train_split == "train");
  CHECK(t.val_split == "val");
  t = parse_train({"--data", "d"});
  CHECK(t.train_split == "Train");
  CHECK(t.val_split == "Validation");
  CHECK_THAT(usage_error({"--data", "d", "--train-split", ""}), Catch::StartsWith("--train-split: expected the name"));
  CHECK_THAT(usage_error({"--data", "d", "--val-split", "a/b"}), Catch::StartsWith("--val-split: expected the name"));
  CHECK_THAT(usage_error({"--data", "d", "--val-split", ".."}), Catch::StartsWith("--val-split: expected the name"));
  CHECK_THAT(usage_error({"--data", "d", "--train-split", "x", "--val-split", "x"}),
             Catch::Contains("--val-split x: the same folder as --train-split"));
  CHECK_THAT(usage_error({"predict", "--checkpoint", "c.h5", "--val-split", "/abs", "d"}),
             Catch::StartsWith("--val-split: expected the name"));
  const PredictOptions p =
      parse_args({"predict", "--checkpoint", "c.h5", "--train-split", "train", "--val-split", "val", "d"}).predict;
  CHECK(p.train_split == "train");
  CHECK(p.val_split == "val");
}

TEST_CASE("a config file: both line formats, comments, quotes, and the command line wins", "[train][flags]") {
  FlagFile f(
      "# recipe for the cluster\n"
      "\n"
      "--arch resnet18\n"
      "--lr=0.01\n"
      "epochs = 7\n"
      "batch_size = 32      # per rank\n"
      "   sched = cosine\n"
      "--optimizer sgd\n"
      "nesterov\n"
      "momentum = \"0.8\"\n"
      "output-dir = 'runs/a #1'\n"
      "j = 3\r\n"
      "--seed = 5\n"
      "amp = true\n");
  for (const bool config_first : {true, false}) {
    INFO("--config " << (config_first ? "before" : "after") << " the other flags");
    std::vector<std::string> args{"--data", "d", "--epochs", "3", "--model", "resnet50"};
    args.insert(config_first ? args.begin() : args.end(), {"--config", f.str()});
    const TrainOptions t = parse_train(args);
    CHECK(t.arch == Arch::ResNet50);  // command line
    CHECK(t.epochs == 3);         // command line
    CHECK(t.lr == 0.01);
    CHECK(t.batch_size == 32);
    CHECK(t.scheduler == SchedulerKind::Cosine);
    CHECK(t.optimizer == OptimizerKind::Sgd);
    CHECK(t.nesterov);
    CHECK(t.momentum == 0.8);
    CHECK(t.output_dir == "runs/a #1");
    CHECK(t.workers == 3);
    CHECK(t.seed == 5);
    CHECK(t.amp);
    // The file's flags count as given (resume honours them as typed ones).
    CHECK(t.was_given("--lr"));
    CHECK(t.was_given("--batch-size"));
    CHECK_FALSE(t.was_given("--threads"));
  }
}

TEST_CASE("a recorded command line has the config file's flags written out", "[train][flags]") {
  std::string line;
  {
    FlagFile f("lr = 0.5\nbatch-size = 6\nno-sync-bn\n");
    line = parse_train({"train", "--config", f.str(), "--data", "d", "--lr", "0.25"}).command_line;
  }  // the file is gone: resume reads the checkpoint's line, not the file
  CHECK_THAT(line, !Catch::Contains("--config"));
  const std::vector<std::string> words = split_command_line(line);
  REQUIRE(words.size() > 2);
  CHECK(words[1] == "train");
  const TrainOptions back = parse_train(std::vector<std::string>(words.begin() + 1, words.end()));
  CHECK(back.lr == 0.25);
  CHECK(back.batch_size == 6);
  CHECK_FALSE(back.sync_bn);
  CHECK(back.data == "d");
  // Without a file the line is the command line as typed.
  CHECK(parse_train({"--data", "d", "-b", "4"}).command_line == "resnet_ddp --data d -b 4");
}

TEST_CASE("a YAML config file (timm's args.yaml): keys with underscores, false switches, nulls", "[train][flags]") {
  FlagFile f(
      "# written by timm's train.py\n"
      "model: resnet18\n"
      "batch_size: 32\n"
      "lr: 1.0e-3\n"
      "epochs: 7\n"
      "opt: sgd\n"
      "momentum: 0.8\n"
      "nesterov: true\n"
      "sync_bn: false\n"
      "amp: false\n"
      "seed: null\n"
      "output: 'runs/a #1'\n"
      "workers: 3\n",
      ".yaml");
  const TrainOptions t = parse_train({"--data", "d", "--config", f.str(), "--epochs", "3"});
  CHECK(t.arch == Arch::ResNet18);
  CHECK(t.batch_size == 32);
  CHECK(t.lr == 1e-3);
  CHECK(t.epochs == 3);  // the command line wins
  CHECK(t.optimizer == OptimizerKind::Sgd);
  CHECK(t.momentum == 0.8);
  CHECK(t.nesterov);
  CHECK_FALSE(t.sync_bn);  // false turns a default-on switch off through --no-sync-bn
  CHECK_FALSE(t.amp);
  CHECK(t.seed == 0);  // null: the default
  CHECK(t.output_dir == "runs/a #1");
  CHECK(t.workers == 3);
  CHECK(t.was_given("--batch-size"));
  CHECK_FALSE(t.was_given("--seed"));
  // The recorded command line holds the file's flags.
  CHECK_THAT(t.command_line, Catch::Contains("--no-sync-bn") && Catch::Contains("--batch-size 32"));

  auto error_in = [](const std::string& text, const std::string& ext) {
    FlagFile g(text, ext);
    return std::make_pair(usage_error({"--data", "d", "--config", g.str()}), g.str());
  };
  {
    auto [msg, path] = error_in("model: resnet18\nmixup: 0.2\n", ".yml");
    CHECK_THAT(msg, Catch::StartsWith(path + ":2: unknown flag '--mixup'"));
  }
  {
    auto [msg, path] = error_in("mean: [0.485, 0.456, 0.406]\n", ".yaml");
    CHECK_THAT(msg, Catch::StartsWith(path + ":1: unknown flag '--mean'"));
  }
  {
    auto [msg, path] = error_in("lr: [1, 2]\n", ".yaml");
    CHECK_THAT(msg, Catch::StartsWith(path + ":1: --lr: expected one value, got a list"));
  }
  {
    auto [msg, path] = error_in("lr: 0.1\n  bad: [\n", ".yaml");
    CHECK_THAT(msg, Catch::StartsWith(path + ":") && Catch::Contains("not valid YAML"));
  }
  {
    auto [msg, path] = error_in("- lr\n- 0.1\n", ".yaml");
    CHECK_THAT(msg, Catch::StartsWith(path + ": expected a YAML mapping of flags"));
  }
  {
    auto [msg, path] = error_in("lr: abc\n", ".yaml");
    CHECK_THAT(msg, Catch::StartsWith(path + ":1: --lr: expected a number, got 'abc'"));
  }
  {
    // The same mapping in a file without the extension: the hint says what is missing.
    auto [msg, path] = error_in("model: resnet18\n", ".conf");
    CHECK_THAT(msg, Catch::Contains("a YAML file needs the extension .yaml or .yml"));
  }
}

TEST_CASE("config file errors name the file and the line", "[train][flags]") {
  auto error_in = [](const std::string& text) {
    FlagFile f(text);
    return std::make_pair(usage_error({"--data", "d", "--config", f.str()}), f.str());
  };
  {
    auto [msg, path] = error_in("batch-size = 4\n\nbacth_size = 3\n");
    CHECK_THAT(msg, Catch::StartsWith(path + ":3: unknown flag '--bacth-size'"));
  }
  {
    auto [msg, path] = error_in("batchsize = 3\n");
    CHECK_THAT(msg, Catch::StartsWith(path + ":1: unknown flag '--batchsize'") &&
                        Catch::Contains("did you mean --batch-size?"));
  }
  {
    auto [msg, path] = error_in("# ok\n--lr abc\n");
    CHECK_THAT(msg, Catch::StartsWith(path + ":2: --lr: expected a number, got 'abc'"));
  }
  {
    auto [msg, path] = error_in("model = resnet99\n");
    CHECK_THAT(msg, Catch::StartsWith(path + ":1: --model: expected one of"));
  }
  {
    auto [msg, path] = error_in("nesterov = maybe\n");
    CHECK_THAT(msg, Catch::StartsWith(path + ":1: --nesterov: a switch: expected true or false") &&
                        Catch::Contains("got 'maybe'"));
  }
  {
    auto [msg, path] = error_in("epochs\n");
    CHECK_THAT(msg, Catch::StartsWith(path + ":1: --epochs: missing value"));
  }
  {
    auto [msg, path] = error_in("= 3\n");
    CHECK_THAT(msg, Catch::StartsWith(path + ":1: expected '--flag value' or 'flag = value'"));
  }
  {
    auto [msg, path] = error_in("batch size = 3\n");
    CHECK_THAT(msg, Catch::StartsWith(path + ":1: expected '--flag value' or 'flag = value'"));
  }
  {
    auto [msg, path] = error_in("lr = 0.1\nconfig = other.conf\n");
    CHECK_THAT(msg, Catch::StartsWith(path + ":2: --config: a config file cannot read another one"));
  }
  {
    auto [msg, path] = error_in("--help\n");
    CHECK_THAT(msg, Catch::StartsWith(path + ":1: --help: not valid in a config file"));
  }
  {
    std::string text = "lr = 0.1\nepochs = 2";
    text += '\0';
    auto [msg, path] = error_in(text + "\n");
    CHECK_THAT(msg, Catch::StartsWith(path + ":2: not a text file"));
  }
  {
    auto [msg, path] = error_in(std::string(2 << 20, '#'));
    CHECK_THAT(msg, Catch::StartsWith("--config " + path + ": larger than 1 MiB"));
  }
  const std::string missing = (fs::temp_directory_path() / "rd_no_such_flags.conf").string();
  CHECK_THAT(usage_error({"--data", "d", "--config", missing}),
             Catch::StartsWith("--config " + missing + ": cannot open (No such file"));
  CHECK_THAT(usage_error({"--data", "d", "--config", fs::temp_directory_path().string()}),
             Catch::Contains(": is a directory"));
  CHECK_THAT(usage_error({"--data", "d", "--config", "/dev/zero"}),
             Catch::StartsWith("--config /dev/zero: not a regular file"));
  CHECK_THAT(usage_error({"--data", "d", "--config"}), Catch::StartsWith("--config: missing value"));
  CHECK_THAT(usage_error({"--data", "d", "--config", "a", "--config=b"}), Catch::StartsWith("--config: given twice"));
  // A bad flag on the command line is reported before the file is read.
  CHECK_THAT(usage_error({"--data", "d", "--config", missing, "--lrr", "1"}), Catch::StartsWith("unknown flag '--lrr'"));
}

TEST_CASE("word-valued options arrive typed and read back as typed", "[train][flags]") {
  const TrainOptions t = parse_train({"--data", "d", "--device", "cpu", "--arch", "resnet_tiny", "--augment", "flip",
                                      "--normalize", "imagenet", "--progress", "lines", "--verify-data", "header",
                                      "--resume", "run/last.h5"});
  CHECK(t.device == Device::Cpu);
  CHECK(t.arch == Arch::ResNetTiny);
  CHECK(t.augment == Augment::Flip);
  CHECK(t.normalize == Normalize::ImageNet);
  CHECK(t.progress == ProgressMode::Lines);
  CHECK(t.verify_data == VerifyData::Header);
  CHECK(t.resume == ResumeMode::File);
  CHECK(t.resume_file == "run/last.h5");
  CHECK(t.resume_checkpoint() == "run/last.h5");
  // A recorded run is compared through these texts: each reads back as it was typed.
  for (const auto& [flag, value] : train_flag_values(t)) {
    if (flag == "--device") CHECK(value == "cpu");
    if (flag == "--arch") CHECK(value == "resnet_tiny");
    if (flag == "--resume") CHECK(value == "run/last.h5");
    if (flag == "--verify-data") CHECK(value == "header");
  }
  CHECK(parse_train({"--data", "d", "--resume", "none"}).resume_checkpoint().empty());
  // A checkpoint's text back to the enum, refused by name when this version lacks it.
  CHECK(value_of(arch_names(), "resnet50", "--arch") == Arch::ResNet50);
  CHECK_THROWS_WITH(value_of(normalize_names(), "cifar", "--normalize"),
                    "--normalize: expected one of none|imagenet, got 'cifar'");
}

TEST_CASE("a run's flags compare as the values their targets hold", "[train][flags]") {
  const auto settings = [](const std::vector<std::string>& args) {
    std::map<std::string, FlagSet::Value> by_flag;
    for (auto& v : train_flag_settings(parse_train(args))) by_flag[v.name] = v;
    return by_flag;
  };
  auto a = settings({"--data", "d", "--lr", "0.01", "--arch", "resnet50", "--optimizer", "sgd", "--nesterov",
                 "--scheduler", "multisteplr", "--lr-milestones", "3,6"});
  auto b = settings({"--data", "d", "--lr", "1e-2", "--arch", "resnet50", "--optimizer", "sgd", "--nesterov",
                 "--scheduler", "multisteplr", "--lr-milestones", "3,6"});
  for (const auto& [flag, v] : a) CHECK(v.typed == b.at(flag).typed);
  CHECK(a.at("--lr").typed == FlagSet::Typed{0.01});
  CHECK(a.at("--lr").text == "0.01");
  CHECK(std::holds_alternative<int64_t>(a.at("--arch").typed));  // an enumeration: its index
  CHECK(a.at("--arch").text == "resnet50");
  CHECK(a.at("--nesterov").typed == FlagSet::Typed{true});
  CHECK(a.at("--batch-size").typed == FlagSet::Typed{int64_t{16}});
  CHECK(a.at("--data").typed == FlagSet::Typed{std::string("d")});
  CHECK(a.at("--lr-milestones").typed == FlagSet::Typed{std::string("3,6")});  // a custom flag: its text
  auto c = settings({"--data", "d", "--lr", "0.02", "--arch", "resnet18", "--optimizer", "sgd"});
  CHECK_FALSE(a.at("--lr").typed == c.at("--lr").typed);
  CHECK_FALSE(a.at("--arch").typed == c.at("--arch").typed);
  CHECK_FALSE(a.at("--nesterov").typed == c.at("--nesterov").typed);
}

TEST_CASE("the subcommand table lists, helps and names every command", "[train][flags]") {
  const std::string top = top_level_help();
  for (Command c : {Command::Train, Command::Predict, Command::Info, Command::Export, Command::Synth, Command::Pack}) {
    const std::string name = command_name(c);
    INFO(name);
    CHECK_THAT(top, Catch::Contains("  " + name + " "));
    if (c == Command::Synth || c == Command::Pack) continue;  // their own --help
    const ParsedCommand pc = parse_args({name, "--help"});
    CHECK(pc.command == Command::Help);
    CHECK(pc.help_text == command_help(c));
    CHECK(parse_args({"help", name}).help_text == command_help(c));
  }
  CHECK(usage_error({"bogus"}) ==
        "unknown command 'bogus' (commands: train, predict, info, export, synth, pack; see resnet_ddp --help)");
  CHECK(usage_error({"help", "version"}) == "unknown command 'version'; see resnet_ddp --help");
  CHECK(parse_args({"--version"}).command == Command::Version);
}

TEST_CASE("recipe: its flags apply first, every flag given wins wherever it stands", "[train][flags][recipe]") {
  const TrainOptions t = parse_train({"--data", "d", "--recipe", "tutorial"});
  CHECK(t.recipe == "tutorial");
  CHECK(t.lr == 1e-4);
  CHECK(t.batch_size == 16);
  CHECK(t.epochs == 5);
  CHECK(t.label_smoothing == 0.1);
  for (const bool recipe_first : {true, false}) {
    INFO("--recipe " << (recipe_first ? "before" : "after") << " the other flags");
    std::vector<std::string> args = {"--data", "d", "--epochs", "2", "--lr", "0.5"};
    args.insert(recipe_first ? args.begin() : args.end(), {"--recipe", "tutorial"});
    const TrainOptions u = parse_train(args);
    CHECK(u.epochs == 2);
    CHECK(u.lr == 0.5);
    CHECK(u.batch_size == 16);
  }
  // A config file sits between the recipe and the command line.
  FlagFile f("epochs = 7\nlr = 0.125\n");
  const TrainOptions c = parse_train({"--recipe", "tutorial", "--config", f.str(), "--data", "d", "--lr", "0.25"});
  CHECK(c.epochs == 7);
  CHECK(c.lr == 0.25);
}

TEST_CASE("recipe: the recorded command line has its flags written out", "[train][flags][recipe]") {
  const std::string line = parse_train({"--data", "d", "--recipe", "tutorial", "--epochs", "3"}).command_line;
  CHECK_THAT(line, !Catch::Contains("--recipe"));
  const std::vector<std::string> words = split_command_line(line);
  const TrainOptions back = parse_train(std::vector<std::string>(words.begin() + 1, words.end()));
  CHECK(back.epochs == 3);
  CHECK(back.lr == 1e-4);
  CHECK(back.recipe.empty());
}

TEST_CASE("recipe: an unknown name lists the known ones, the last one given wins, not from a file",
          "[train][flags][recipe]") {
  CHECK_THAT(usage_error({"--data", "d", "--recipe", "resnet-a1"}),
             Catch::StartsWith("--recipe: unknown 'resnet-a1' (known: tutorial, torchvision-resnet-v1, "
                               "torchvision-resnet-v2)"));
  CHECK(parse_train({"--data", "d", "--recipe", "resnet-a1", "--recipe", "tutorial"}).recipe == "tutorial");
  FlagFile f("recipe = tutorial\n");
  CHECK_THAT(usage_error({"--data", "d", "--config", f.str()}),
             Catch::Contains("--recipe: give it on the command line"));
}

// Each table line must name a real flag with a valid value: parsing is the check.
TEST_CASE("every --recipe parses, and prints as the flags it sets", "[train][flags][recipe]") {
  for (const auto& r : training_recipes()) {
    INFO(r.name);
    const TrainOptions t = parse_train({"--data", "d", "--recipe", r.name});
    CHECK(t.recipe == r.name);
    const std::string line = recipe_flags_line(r.name);
    CHECK_THAT(line, Catch::StartsWith("--"));
    const std::vector<std::string> words = split_command_line("resnet_ddp --data d " + line);
    const TrainOptions back = parse_train(std::vector<std::string>(words.begin() + 1, words.end()));
    CHECK(back.lr == t.lr);
    CHECK(back.epochs == t.epochs);
    CHECK(back.batch_size == t.batch_size);
    CHECK(back.sync_bn == t.sync_bn);
  }
  const TrainOptions v1 = parse_train({"--data", "d", "--recipe", "torchvision-resnet-v1"});
  CHECK(v1.optimizer == OptimizerKind::Sgd);
  CHECK(v1.lr == 0.1);
  CHECK(v1.momentum == 0.9);
  CHECK(v1.weight_decay == 1e-4);
  CHECK(v1.epochs == 90);
  CHECK_FALSE(v1.sync_bn);
}

TEST_CASE("every switch has a --no- form that wins over a recipe", "[train][flags][recipe]") {
  const std::vector<std::string> v2{"--data", "d", "--recipe", "torchvision-resnet-v2"};
  {
    const TrainOptions on = parse_train(v2);
    REQUIRE(on.model_ema);
    REQUIRE(on.ra_sampler);
  }
  for (const bool before : {true, false}) {
    INFO("--no- flags " << (before ? "before" : "after") << " --recipe");
    std::vector<std::string> args = v2;
    args.insert(before ? args.begin() : args.end(), {"--no-model-ema", "--no-ra-sampler"});
    const TrainOptions t = parse_train(args);
    CHECK_FALSE(t.model_ema);
    CHECK_FALSE(t.ra_sampler);
    CHECK(t.mixup_alpha == 0.2);  // the rest of the recipe stays
    // Given as the switch itself: a resume compares --model-ema off against the checkpoint's.
    CHECK(t.was_given("--model-ema"));
    // The recorded command line reads back as the same run.
    const std::vector<std::string> words = split_command_line(t.command_line);
    REQUIRE(words.size() > 1);
    const TrainOptions back = parse_train(std::vector<std::string>(words.begin() + 1, words.end()));
    CHECK_FALSE(back.model_ema);
    CHECK_FALSE(back.ra_sampler);
  }
  // The later of a switch and its --no- form wins, as for any flag.
  CHECK(parse_train({"--data", "d", "--no-nesterov", "--nesterov", "--optimizer", "sgd", "--momentum", "0.9"}).nesterov);
  CHECK_FALSE(parse_train({"--data", "d", "--nesterov", "--no-nesterov"}).nesterov);
  // The existing negation keeps its meaning; it has no --no- form of its own.
  CHECK_FALSE(parse_train({"--data", "d", "--no-sync-bn"}).sync_bn);
  CHECK_THAT(usage_error({"--data", "d", "--no-no-sync-bn"}), Catch::StartsWith("unknown flag '--no-no-sync-bn'"));
  CHECK_THAT(usage_error({"--data", "d", "--no-model-ema=1"}), Catch::StartsWith("--no-model-ema: takes no value"));
  CHECK_THAT(usage_error({"--data", "d", "--no-lr"}), Catch::Contains("--lr takes a value: it has no --no- form"));
  // --help says so once.
  const std::string help = command_help(Command::Train);
  const size_t at = help.find("--no-SWITCH");
  CHECK(at != std::string::npos);
  CHECK(help.find("--no-SWITCH", at + 1) == std::string::npos);
}

TEST_CASE("a config file turns a recipe's switch off: false in YAML and .conf", "[train][flags][recipe]") {
  for (const auto& [text, ext] : std::vector<std::pair<std::string, std::string>>{
           {"model_ema: false\nra_sampler: no\n", ".yaml"},
           {"model-ema = false\nno-ra-sampler\n", ".conf"},
           {"--no-model-ema\nra_sampler = off\n", ".conf"}}) {
    INFO(ext << " file:\n" << text);
    FlagFile f(text, ext);
    const TrainOptions t = parse_train({"--data", "d", "--recipe", "torchvision-resnet-v2", "--config", f.str()});
    CHECK_FALSE(t.model_ema);
    CHECK_FALSE(t.ra_sampler);
    CHECK(t.was_given("--model-ema"));
    CHECK_THAT(t.command_line, Catch::Contains("--no-model-ema") && Catch::Contains("--no-ra-sampler"));
    // The command line still wins over the file.
    FlagFile g(text, ext);
    CHECK(parse_train({"--data", "d", "--config", g.str(), "--model-ema"}).model_ema);
  }
  {
    FlagFile f("sync_bn: true\nno_sync_bn: true\n", ".yaml");
    CHECK_FALSE(parse_train({"--data", "d", "--config", f.str()}).sync_bn);
  }
  {
    FlagFile f("no-sync-bn = false\n");  // the negation set false: SyncBatchNorm on
    CHECK(parse_train({"--data", "d", "--no-sync-bn", "--config", f.str()}).sync_bn == false);  // command line wins
    CHECK(parse_train({"--data", "d", "--config", f.str()}).sync_bn);
  }
  {
    FlagFile f("model_ema: 2\n", ".yaml");
    CHECK_THAT(usage_error({"--data", "d", "--config", f.str()}),
               Catch::StartsWith(f.str() + ":1: --model-ema: a switch: expected true or false"));
  }
}

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("timm's lr: null is its lr_base scaled to the global batch, as --lr-base", "[train][flags][timm]") {
  std::string text = read_text(RD_TIMM_ARGS_FIXTURE);
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"lr: 0.002", "lr: null"}, {"lr_base_size: 256", "lr_base_size: 512\nlr_base_scale: linear"},
           {"warmup_epochs: 1", "warmup_epochs: 0"}}) {
    const size_t at = text.find(from + "\n");
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
  }
  FlagFile file(text, ".yaml");
  const TrainOptions t = parse_args({"--data", "d", "--config", file.str()}).train;
  CHECK(t.lr_base == 0.1);
  CHECK(t.lr_base_size == 512);
  CHECK(t.lr_base_scale == "linear");
  // With a warmup, timm's absolute warmup_lr needs the lr itself.
  const size_t at = text.find("warmup_epochs: 0\n");
  REQUIRE(at != std::string::npos);
  text.replace(at, 16, "warmup_epochs: 1");
  FlagFile warm(text, ".yaml");
  CHECK_THAT(usage_error({"--data", "d", "--config", warm.str()}),
             Catch::Contains("warmup_lr: 0.0002: with lr: null the lr is derived from the global batch"));
}

TEST_CASE("timm's args.yaml: mapped keys translated, the rest ignored or refused at once", "[train][flags][timm]") {
  const std::string fixture = RD_TIMM_ARGS_FIXTURE;
  const ParsedCommand pc = parse_args({"--data", "d", "--config", fixture});
  const TrainOptions& t = pc.train;
  CHECK(t.arch == Arch::ResNet50);
  CHECK(t.head == HeadKind::Fc);
  CHECK(t.batch_size == 4);
  CHECK(t.epochs == 4);  // 3 after a 1-epoch prefix warmup: timm's num_epochs
  CHECK(t.lr == 0.002);
  CHECK(t.optimizer == OptimizerKind::AdamW);
  CHECK(t.weight_decay == 0.05);
  CHECK(t.norm_weight_decay == 0.0);  // timm decays no bias or norm weight
  CHECK(t.bias_weight_decay == 0.0);
  CHECK(t.label_smoothing == 0.1);
  CHECK(t.scheduler == SchedulerKind::Cosine);
  CHECK(t.lr_min == 1e-5);
  CHECK(t.lr_warmup_epochs == 1);
  CHECK(t.lr_warmup_decay == Approx(0.1));  // warmup_lr / lr
  CHECK(t.clip_grad_norm == 1.0);
  CHECK(t.ra_sampler);
  CHECK(t.ra_reps == 2);
  CHECK_FALSE(t.sync_bn);
  CHECK_FALSE(t.model_ema);
  CHECK(t.seed == 7);
  CHECK(t.workers == 2);
  CHECK(t.output_dir == "runs");
  CHECK(t.train_split == "train");
  CHECK(t.val_split == "validation");
  CHECK(t.train_crop_size == 32);
  CHECK(t.val_crop_size == 32);
  CHECK(t.val_resize_size == 36);  // floor(32 / crop_pct 0.875)
  CHECK(t.hflip_prob == 0.5);
  CHECK(t.normalize == Normalize::ImageNet);
  CHECK(t.auto_augment == AutoAugmentPolicy::RandAugment);
  CHECK(t.ra_magnitude == 9);
  CHECK(t.random_erase == 0.25);
  CHECK(t.mixup_alpha == 0.2);
  CHECK(t.cutmix_alpha == 1.0);
  CHECK(t.data == "d");  // the command line wins over `data:`
  REQUIRE(pc.warnings.size() == 1);
  CHECK(pc.warnings[0] == fixture + ": ignored, as they do not change training here: amp_dtype, channels_last, "
                                   "checkpoint_hist, device, experiment, log_wandb, num_classes, pin_mem");

  // timm's defaults that differ here, all in one error; a key the command line sets is no error.
  std::string text = read_text(fixture);
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"aa: rand-m9-n2", "aa: null"},  // ColorJitter 0.4 then applies
           {"interpolation: bilinear", "interpolation: ''"},
           {"train_interpolation: bilinear", "train_interpolation: random"},
           {"lr: 0.002", "lr: null"},
           {"lr_base: 0.1", "lr_base: null"},  // else lr: null is timm's --lr-base
           {"warmup_prefix: true", "warmup_prefix: false"},
           {"drop_path: null", "drop_path: 0.05"},
           {"model_ema: false", "model_ema: true"},
           {"remode: const", "remode: pixel"},
           {"sched: cosine", "sched: tanh"},
           {"opt: adamw", "opt: madgrad"},
           {"gp: null", "gp: max"},
           {"bn_eps: null", "bn_eps: 1.0e-05\nfuture_key: 3\nother_key: null"}}) {
    const size_t at = text.find(from + "\n");
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
  }
  FlagFile bad(text, ".yaml");
  const std::string msg = usage_error({"--data", "d", "--config", bad.str()});
  for (const std::string key :
       {"aa: null", "color_jitter: 0.4: timm applies ColorJitter", "interpolation: '': ", "train_interpolation: random",
        "lr: null: timm derives it", "warmup_epochs: 1: without warmup_prefix: true", "drop_path: 0.05",
        "model_ema: true", "remode: pixel", "sched: tanh", "opt: madgrad", "gp: max", "bn_eps: 1.0e-05",
        "unknown flag '--future-key'"})
    if (key != "aa: null") CHECK_THAT(msg, Catch::Contains(key));
  CHECK_THAT(msg, Catch::StartsWith(bad.str() + ":") && Catch::Contains(": 13 problems, listed above"));
  CHECK_THAT(msg, !Catch::Contains("other_key"));  // unknown but null: a warning only
  // The command line's --lr makes lr: null moot.
  const std::string with_lr = usage_error({"--data", "d", "--config", bad.str(), "--lr", "0.1"});
  CHECK_THAT(with_lr, !Catch::Contains("lr: null") && Catch::Contains(": 12 problems"));
}
