#include "train/resume_plan.h"

#include <cstdlib>
#include <filesystem>

#include "resnet_ddp/errors.h"
#include "resnet_ddp/shell_quote.h"
#include "resnet_ddp/train/optimizer.h"

namespace fs = std::filesystem;

namespace rd::train {

bool resume_ignores(const std::string& flag) {
  for (const char* f : {"--data", "--train-split", "--val-split", "--output-dir", "--resume", "--init", "--metrics",
                        "--tensorboard", "--eval-only", "--skip-unreadable", "--check"})
    if (flag == f) return true;
  return false;
}

bool describes_execution(const std::string& flag) {
  for (const char* f : {"--workers", "--threads", "--log-every", "--progress", "--bucket-mb", "--progress-thread",
                        "--checkpoint-every", "--verify-data", "--val-batch-size", "--device"})
    if (flag == f) return true;
  return false;
}

ResumePlan plan_resume(TrainOptions& o, const std::string& path, const CheckpointMeta& m,
                       const std::function<bool()>& this_run_cuda) {
  ResumePlan plan;
  auto fixed = [&](const std::string& flag, std::string& value, const std::string& theirs) {
    if (theirs.empty() || value == theirs) return;
    if (o.was_given(flag))
      throw UsageError(flag + " " + value + ": checkpoint '" + path + "' does not match this run: it was trained with " +
                       flag + " " + theirs +
                       (o.eval_only ? std::string("; leave the flag out to evaluate it as trained")
                                     : "; resuming cannot change it" + std::string(kStartFresh)));
    value = theirs;
  };
  std::string image = std::to_string(o.image_size);
  std::string arch = name_of(arch_names(), o.arch);
  fixed("--arch", arch, m.arch);
  o.arch = value_of(arch_names(), arch, "--arch");
  std::string head = head_name(o.head);
  fixed("--head", head, m.head);
  o.head = parse_head(head);
  fixed("--image-size", image, m.image_size > 0 ? std::to_string(m.image_size) : "");
  o.image_size = std::stoi(image);
  std::string normalize = name_of(normalize_names(), o.normalize);
  fixed("--normalize", normalize, m.normalize);
  o.normalize = value_of(normalize_names(), normalize, "--normalize");
  // Say what the checkpoint decided that the command line did not.
  const TrainOptions defaults;
  std::string inherited;
  if (!o.was_given("--arch") && o.arch != defaults.arch) inherited += " --arch " + arch;
  if (!o.was_given("--head") && o.head != defaults.head) inherited += std::string(" --head ") + head_name(o.head);
  if (!o.was_given("--image-size") && o.image_size != defaults.image_size)
    inherited += " --image-size " + std::to_string(o.image_size);
  if (!o.was_given("--normalize") && o.normalize != defaults.normalize)
    inherited += " --normalize " + normalize;
  if (!inherited.empty()) plan.model_settings = "Model settings from " + path + ":" + inherited;
  if (o.eval_only) return plan;
  const OptimizerMeta& os = m.optimizer;
  const std::string optimizer = name_of(optimizer_names(), o.optimizer);
  if (os.present && os.config.type != o.optimizer)
    throw UsageError("--optimizer " + optimizer + ": checkpoint '" + path +
                     "' does not match this run: it holds --optimizer " + name_of(optimizer_names(), os.config.type) +
                     " state; resuming cannot change it" + kStartFresh);
  // The previous run's flags, read back from the command line it recorded (a
  // checkpoint from another version may not parse: then only its metadata counts).
  std::vector<std::pair<std::string, std::string>> theirs;
  try {
    std::vector<std::string> words = split_command_line(m.args);
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    if (argv.size() > 1) {
      ParsedCommand pc = parse_command_line(static_cast<int>(argv.size()), argv.data());
      // --amp ran as the device's reduced precision (setup_device); compare that,
      // taking this run's device where the old one was "auto".
      if (pc.train.amp) {
        const bool cuda = pc.train.device == Device::Cuda || (pc.train.device == Device::Auto && this_run_cuda());
        pc.train.precision = amp_precision(cuda);
      }
      if (pc.command == Command::Train) theirs = train_flag_values(pc.train);
    }
  } catch (const std::exception&) {
    theirs.clear();
  }
  auto old_value = [&](const std::string& flag) -> std::string {
    if (flag == "--batch-size" && m.batch_size > 0) return std::to_string(m.batch_size);
    if (flag == "--accum-steps" && m.accum_steps > 0) return std::to_string(m.accum_steps);
    if (flag == "--lr" && os.present) {
      TrainOptions t;
      t.lr = os.config.lr;
      for (auto& [f, v] : train_flag_values(t))
        if (f == "--lr") return v;
    }
    for (auto& [f, v] : theirs)
      if (f == flag) return v;
    return "";
  };
  const auto mine = train_flag_values(o);
  for (const auto& [flag, value] : mine) {
    if (flag == "--data") {
      const std::string was = old_value(flag);
      if (!was.empty() && fs::path(was).lexically_normal() != fs::path(value).lexically_normal())
        plan.differences.push_back(flag + " " + value + " (that run: " + was + ")");
    }
    if (resume_ignores(flag) || flag == "--amp") continue;  // --amp is compared as its --precision
    const std::string was = old_value(flag);
    if (was.empty() || was == value) continue;
    // Batch shape and length always count (they move the position in the epoch);
    // other defaults the user did not type keep the resumed run's state.
    const bool given = o.was_given(flag) || (flag == "--sync-bn" && o.was_given("--no-sync-bn"));
    if (!given && flag != "--batch-size" && flag != "--accum-steps" && flag != "--epochs") continue;
    if (flag == "--lr") plan.honour_lr = true;
    if (flag == "--epochs") plan.epochs_changed = true;
    plan.changes.push_back("Resume: " + flag + " " + value + (given ? "" : " (default)") +
                              " instead of the checkpoint's " + was +
                              (flag == "--lr" ? " (the learning rate restarts from it)" : ""));
    if (!describes_execution(flag))
      plan.differences.push_back(flag + " " + value + (given ? "" : " (default)") + " (that run: " + was + ")");
  }
  return plan;
}

void refuse_new_experiment(const TrainOptions& o, const std::string& path, const CheckpointMeta& m,
                           const std::vector<std::string>& differences) {
  if (differences.empty() || o.resume != ResumeMode::Auto || o.was_given("--resume")) return;
  if (const char* job = std::getenv("SLURM_JOB_ID"); job && *job) return;
  std::string msg = "--output-dir " + o.output_dir + " holds another run (" + path + ", " +
                    std::to_string(m.epoch) + " epoch(s) done) whose settings differ from this command's:";
  for (const auto& d : differences) msg += "\n  " + d;
  msg += "\nTo continue that run with these settings add --resume auto; to start a new experiment use another "
         "--output-dir (or --resume none to start over in this one)";
  throw UsageError(msg);
}

}  // namespace rd::train
