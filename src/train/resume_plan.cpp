#include "train/resume_plan.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <type_traits>

#include "resnet_ddp/errors.h"
#include "resnet_ddp/shell_quote.h"
#include "resnet_ddp/train/optimizer.h"

namespace fs = std::filesystem;

namespace rd::train {

bool resume_ignores(const std::string& flag) {
  for (const char* f : {"--data", "--train-split", "--val-split", "--output-dir", "--resume", "--init", "--init-ema", "--metrics",
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

namespace {

// The evaluation transform a checkpoint was validated with (0 = the tutorial's
// Resize((S, S))) is fixed like --image-size: --eval-only scores it the same way.
template <class Fixed>
void plan_eval_transform(TrainOptions& o, const io::CheckpointMeta& m, Fixed& fixed) {
  const bool has = m.val_crop_size > 0;
  std::string resize = std::to_string(o.val_resize_size), crop = std::to_string(o.val_crop_size);
  fixed("--val-resize-size", resize, std::to_string(has ? m.val_resize_size : 0));
  fixed("--val-crop-size", crop, std::to_string(has ? m.val_crop_size : 0));
  o.val_resize_size = std::stoi(resize);
  o.val_crop_size = std::stoi(crop);
}

// The model flags the checkpoint fixes, applied to `o` (a copy of the command's), and
// the line saying which the command left to it.
void plan_model_flags(ResumePlan& plan, TrainOptions& o, const std::string& path, const io::CheckpointMeta& m) {
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
  plan_eval_transform(o, m, fixed);
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
  plan.model = ModelFlags::of(o);
}

// Every other flag that differs from the checkpoint's run: honoured (one line each),
// and, unless it only describes how the run executes, a difference that makes this
// command another experiment.
void plan_flag_changes(ResumePlan& plan, const TrainOptions& o, const std::string& path, const io::CheckpointMeta& m,
                       bool this_run_cuda) {
  const io::OptimizerState& os = m.optimizer;
  const std::string optimizer = name_of(optimizer_names(), o.optimizer);
  if (os.present && os.config.type != o.optimizer)
    throw UsageError("--optimizer " + optimizer + ": checkpoint '" + path +
                     "' does not match this run: it holds --optimizer " + name_of(optimizer_names(), os.config.type) +
                     " state; resuming cannot change it" + kStartFresh);
  // The previous run's flags, read back from the command line it recorded (a
  // checkpoint from another version may not parse: then only its metadata counts).
  TrainOptions recorded;
  bool recorded_parsed = false;
  try {
    const std::vector<std::string> words = split_command_line(m.args);
    if (words.size() > 1) {
      recorded = parse_train_command_line(words);
      recorded_parsed = true;
      // --amp ran as the device's reduced precision (setup_device); compare that,
      // taking this run's device where the old one was "auto".
      if (recorded.amp) {
        const bool cuda = recorded.device == Device::Cuda || (recorded.device == Device::Auto && this_run_cuda);
        recorded.precision = amp_precision(cuda);
      }
    }
  } catch (const std::exception&) {
    recorded_parsed = false;
  }
  // The metadata's batch shape and the optimizer's learning rate win over the command line.
  if (m.batch_size > 0) recorded.batch_size = static_cast<int>(m.batch_size);
  if (m.accum_steps > 0) recorded.accum_steps = static_cast<int>(m.accum_steps);
  if (os.present) recorded.lr = os.config.lr;
  const auto from_metadata = [&](const std::string& flag) {
    return (flag == "--batch-size" && m.batch_size > 0) || (flag == "--accum-steps" && m.accum_steps > 0) ||
           (flag == "--lr" && os.present);
  };
  const std::vector<FlagSet::Value> theirs = train_flag_settings(recorded);
  // The recorded value of `flag`, or nullptr when that run says nothing about it (its
  // command line did not parse, or left the flag empty).
  auto old_value = [&](const std::string& flag) -> const FlagSet::Value* {
    if (!recorded_parsed && !from_metadata(flag)) return nullptr;
    for (const auto& v : theirs)
      if (v.name == flag) return v.text.empty() ? nullptr : &v;
    return nullptr;
  };
  for (const FlagSet::Value& mine : train_flag_settings(o)) {
    const std::string& flag = mine.name;
    const std::string& value = mine.text;
    const FlagSet::Value* old = old_value(flag);
    if (flag == "--data" && old &&
        fs::path(old->text).lexically_normal() != fs::path(value).lexically_normal())
      plan.differences.push_back(flag + " " + value + " (that run: " + old->text + ")");
    if (resume_ignores(flag) || flag == "--amp") continue;  // --amp is compared as its --precision
    if (!old || old->typed == mine.typed) continue;
    const std::string& was = old->text;
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
}

// The checkpoint's weight EMA under --model-ema: continued by a run, evaluated by
// --eval-only (which refuses a checkpoint without one; a run starts it from the weights).
void plan_ema(ResumePlan& plan, const TrainOptions& o, const io::CheckpointMeta& m) {
  if (!o.model_ema) return;
  if (m.ema.present) {
    TrainState& s = plan.state;
    s.has_ema_state = true;
    s.ema_n_averaged = m.ema.n_averaged;
    s.ema_num_batches_tracked = m.ema.num_batches_tracked;
  } else if (o.eval_only) {
    throw UsageError("--model-ema --eval-only: " + plan.checkpoint +
                     " holds no weight EMA (its run did not use --model-ema); leave out --model-ema to evaluate its "
                     "weights");
  } else {
    plan.start_lines.push_back("Notice: checkpoint has no weight EMA; --model-ema starts from its weights");
  }
}

// Where training continues: the checkpoint's position, optimizer and scheduler, with
// the learning rate and cosine length the changed flags ask for.
void plan_state(ResumePlan& plan, const TrainOptions& o, const io::CheckpointMeta& m) {
  TrainState& s = plan.state;
  static_cast<io::RunPosition&>(s) = m;
  s.lr = o.lr;
  if (o.eval_only) {  // evaluation uses the weights only, and the EMA's under --model-ema (as --test-only)
    plan_ema(plan, o, m);
    return;
  }
  // The one place that decides the learning rate a resumed run continues with.
  s.has_optimizer_state = true;
  s.optimizer_steps = m.optimizer.step;
  s.lr = plan.honour_lr ? o.lr : m.optimizer.lr;
  const io::SchedulerState& sc = m.scheduler;
  const std::string scheduler = name_of(scheduler_names(), o.scheduler);
  if (sc.present && sc.type == scheduler) {
    s.has_scheduler_state = true;
    s.scheduler_last_epoch = sc.last_epoch;
    s.plateau = sc.plateau;
    s.cosine = sc.cosine;
    if (plan.honour_lr) s.cosine.base_lr = o.lr;
    if (plan.epochs_changed) s.cosine.t_max = std::max<int64_t>(o.epochs - o.lr_warmup_epochs, 1);
  } else if (sc.present) {
    plan.start_lines.push_back("Notice: checkpoint used --scheduler " + sc.type + "; starting a fresh " + scheduler +
                               " schedule");
  }
  plan_ema(plan, o, m);
}

// A mid-epoch position: the checkpoint's ranks consumed the first
// step x world x batch x accum samples of the epoch's permutation (each rank takes
// every world-th one). Any other shape continues at the last step boundary it has
// inside that prefix, the sampler sharding the rest over this run's ranks; the few
// samples past that boundary are trained again.
void plan_position(ResumePlan& plan, const TrainOptions& o, const io::CheckpointMeta& m, int world) {
  TrainState& s = plan.state;
  const int64_t old_world = m.world_size > 0 ? m.world_size : world;
  const int64_t old_batch = m.batch_size > 0 ? m.batch_size : o.batch_size;
  const int64_t old_accum = m.accum_steps > 0 ? m.accum_steps : o.accum_steps;
  const int64_t old_global = old_world * old_batch * old_accum;
  const int64_t new_global = static_cast<int64_t>(world) * o.batch_size * o.accum_steps;
  const int64_t old_step = s.step_in_epoch;
  int64_t replayed = 0;
  const bool reshaped = old_step > 0 && old_global != new_global;
  if (reshaped) {
    const int64_t consumed = old_step * old_global;
    s.step_in_epoch = consumed / new_global;
    replayed = consumed - s.step_in_epoch * new_global;
    if (s.step_in_epoch == 0) {
      s.partial_loss_sum = 0;
      s.partial_correct = s.partial_count = 0;
    }
  }
  const std::string next = "epoch " + std::to_string(s.epoch + 1);
  const std::string where = s.step_in_epoch > 0 ? next + " step " + std::to_string(s.step_in_epoch) : next;
  if (!o.eval_only) plan.start_lines.push_back("Resuming from " + plan.checkpoint + " at " + where);
  plan.start_lines.insert(plan.start_lines.end(), plan.changes.begin(), plan.changes.end());
  if (m.world_size != world && m.world_size > 0)
    plan.start_lines.push_back("Notice: checkpoint was trained on " + std::to_string(m.world_size) +
                               " ranks, this run has " + std::to_string(world) + ": global batch " +
                               std::to_string(m.world_size * m.batch_size) + " -> " +
                               std::to_string(world * o.batch_size) +
                               " (--batch-size is per rank), sampler re-sharded");
  if (reshaped && !o.eval_only)
    plan.start_lines.push_back(
        "Notice: " + next + " was stopped after " + std::to_string(old_step) + " steps of " +
        std::to_string(old_global) + " samples; at " + std::to_string(new_global) +
        " samples per step it continues after step " + std::to_string(s.step_in_epoch) +
        (replayed > 0 ? " and trains " + std::to_string(replayed) + " of its samples again" : std::string()));
}

// The plan crosses ranks as bytes: fixed-size fields as they are, strings and lists
// length-prefixed (a class name may hold any byte).
class Writer {
 public:
  template <class T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& v) {
    pod(static_cast<uint64_t>(v.size()));
    out += v;
  }
  void list(const std::vector<std::string>& v) {
    pod(static_cast<uint64_t>(v.size()));
    for (const auto& x : v) str(x);
  }
  std::string out;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  template <class T>
  void pod(T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    std::memcpy(&v, take(sizeof v), sizeof v);
  }
  void str(std::string& v) {
    uint64_t n = 0;
    pod(n);
    v.assign(take(n), n);
  }
  void list(std::vector<std::string>& v) {
    uint64_t n = 0;
    pod(n);
    v.resize(n);
    for (auto& x : v) str(x);
  }

 private:
  const char* take(uint64_t n) {
    if (n > in_.size() - at_) throw Error("resume plan: truncated");
    const char* p = in_.data() + at_;
    at_ += n;
    return p;
  }
  const std::string& in_;
  size_t at_ = 0;
};

// One list of the fields, for both directions.
template <class IO, class Plan>
void transfer(IO& io, Plan& p) {
  io.pod(p.resumed);
  io.str(p.checkpoint);
  io.pod(p.model.arch);
  io.pod(p.model.head);
  io.pod(p.model.image_size);
  io.pod(p.model.normalize);
  io.pod(p.model.val_resize_size);
  io.pod(p.model.val_crop_size);
  io.list(p.class_names);
  io.pod(p.state);
  io.pod(p.honour_lr);
  io.pod(p.epochs_changed);
  io.str(p.model_settings);
  io.list(p.changes);
  io.list(p.differences);
  io.list(p.start_lines);
}

}  // namespace

ModelFlags ModelFlags::of(const TrainOptions& o) {
  return {o.arch, o.head, o.image_size, o.normalize, o.val_resize_size, o.val_crop_size};
}

void ModelFlags::apply_to(TrainOptions& o) const {
  o.arch = arch;
  o.head = head;
  o.image_size = image_size;
  o.normalize = normalize;
  o.val_resize_size = val_resize_size;
  o.val_crop_size = val_crop_size;
}

ResumePlan plan_resume(const TrainOptions& opts, const std::string& path, const io::CheckpointMeta& m,
                       const ThisRun& run) {
  ResumePlan plan;
  plan.resumed = true;
  plan.checkpoint = path;
  TrainOptions o = opts;
  plan_model_flags(plan, o, path, m);
  if (o.eval_only) plan.class_names = m.class_names;
  if (!o.eval_only) plan_flag_changes(plan, o, path, m, run.cuda);
  plan_state(plan, o, m);
  if (!o.init.empty())
    plan.start_lines.push_back("Notice: resuming from " + path + "; --init " + o.init + " is ignored");
  plan_position(plan, o, m, run.world);
  return plan;
}

ResumePlan plan_fresh(const TrainOptions& o) {
  ResumePlan plan;
  plan.model = ModelFlags::of(o);
  plan.state.lr = o.lr;
  return plan;
}

void check_init(const TrainOptions& o, const io::CheckpointMeta& m) {
  const std::string arch = name_of(arch_names(), o.arch);
  if (!m.arch.empty() && m.arch != arch)
    throw UsageError("--init: '" + o.init + "' holds " + m.arch + " weights, this run uses --arch " + arch);
}

io::CheckpointReader::Weights init_weights(const TrainOptions& o) {
  return o.init_ema ? io::CheckpointReader::Weights::Ema : io::CheckpointReader::Weights::Model;
}

std::string init_warning(const TrainOptions& o, const io::CheckpointMeta& m) {
  // A .pth holds no preprocessing; torchvision's and timm's ResNets all expect ImageNet's
  // mean/std, and without it fine-tuning starts from features of the wrong input scale.
  if (m.container != "pytorch" || o.normalize == Normalize::ImageNet) return "";
  return "--init " + o.init + " is PyTorch weights (torchvision's expect ImageNet normalisation) but this run "
         "uses --normalize " + name_of(normalize_names(), o.normalize) +
         "; add --normalize imagenet unless these weights were trained without it";
}

std::string ResumePlan::encode() const {
  Writer w;
  transfer(w, *this);
  return w.out;
}

ResumePlan ResumePlan::decode(const std::string& bytes) {
  ResumePlan p;
  Reader r(bytes);
  transfer(r, p);
  return p;
}

namespace {

std::string env_text(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Slurm's spelling changed (SLURM_STEPID is the older one).
std::string slurm_step_id() {
  const std::string step = env_text("SLURM_STEP_ID");
  return step.empty() ? env_text("SLURM_STEPID") : step;
}

// SLURM_RESTART_COUNT is set only once a job has been requeued; unset or unreadable = 0.
int64_t slurm_restart_count() {
  const std::string v = env_text("SLURM_RESTART_COUNT");
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  return !v.empty() && end && *end == '\0' && n > 0 ? n : 0;
}

}  // namespace

void record_slurm_job(io::CheckpointMeta& m) {
  m.slurm_job_id = env_text("SLURM_JOB_ID");
  m.slurm_step_id = m.slurm_job_id.empty() ? "" : slurm_step_id();
  m.slurm_restart_count = m.slurm_job_id.empty() ? 0 : slurm_restart_count();
}

bool requeue_of_writer(const io::CheckpointMeta& m) {
  const std::string job = env_text("SLURM_JOB_ID");
  return !job.empty() && job == m.slurm_job_id && slurm_step_id() == m.slurm_step_id &&
         slurm_restart_count() > m.slurm_restart_count;
}

void refuse_new_experiment(const TrainOptions& o, const std::string& path, const io::CheckpointMeta& m,
                           const std::vector<std::string>& differences) {
  if (differences.empty() || o.resume != ResumeMode::Auto || o.was_given("--resume")) return;
  if (requeue_of_writer(m)) return;
  std::string msg = "--output-dir " + o.output_dir + " holds another run (" + path + ", " +
                    std::to_string(m.epoch) + " epoch(s) done) whose settings differ from this command's:";
  for (const auto& d : differences) msg += "\n  " + d;
  msg += "\nTo continue that run with these settings add --resume auto; to start a new experiment use another "
         "--output-dir (or --resume none to start over in this one)";
  // Inside a job, say why this run is not taken for a requeue of the checkpoint's job.
  if (const std::string job = env_text("SLURM_JOB_ID"); !job.empty()) {
    std::string writer = "none recorded";
    if (!m.slurm_job_id.empty())
      writer = "job " + m.slurm_job_id + (m.slurm_step_id.empty() ? "" : " step " + m.slurm_step_id) + ", restart " +
               std::to_string(m.slurm_restart_count);
    msg += "\n(Slurm job " + job + ": only a requeue of the job that wrote the checkpoint (" + writer +
           ") continues it unasked)";
  }
  throw UsageError(msg);
}

}  // namespace rd::train
