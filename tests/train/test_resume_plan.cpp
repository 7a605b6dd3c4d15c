// plan_resume: every decision of a resume (flags the checkpoint fixes, flags that
// changed, the learning rate, the scheduler, the position in an interrupted epoch) as a
// function of flags and metadata, and the plan's trip between ranks as bytes. No MPI,
// no files: milliseconds.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>

#include "resnet_ddp/errors.h"
#include "train/parse_cli.h"
#include "train/resume_plan.h"

using namespace rd;
using namespace rd::train;

namespace {

TrainOptions train_flags(std::vector<std::string> args) { return parse_cli(std::move(args)).train; }

// The metadata of a run started with `args` on `world` ranks, stopped in epoch 3.
io::CheckpointMeta checkpoint_of(const std::vector<std::string>& args, int64_t world = 1) {
  const TrainOptions o = train_flags(args);
  io::CheckpointMeta m;
  std::vector<std::string> words = args;
  words.insert(words.begin(), "resnet_ddp");
  m.args = join_command_line(words);
  m.arch = name_of(arch_names(), o.arch);
  m.head = head_name(o.head);
  m.image_size = o.image_size;
  m.val_resize_size = o.val_resize_size;
  m.val_crop_size = o.val_crop_size;
  m.normalize = name_of(normalize_names(), o.normalize);
  m.world_size = world;
  m.batch_size = o.batch_size;
  m.accum_steps = o.accum_steps;
  m.epoch = 2;
  m.global_step = 40;
  m.best_val_acc = 0.5;
  m.optimizer.present = true;
  m.optimizer.config.type = o.optimizer;
  m.optimizer.config.lr = o.lr;
  m.optimizer.step = 40;
  m.optimizer.lr = o.lr / 10;  // the scheduler lowered it
  m.scheduler.present = true;
  m.scheduler.type = name_of(scheduler_names(), o.scheduler);
  m.scheduler.last_epoch = 2;
  m.scheduler.cosine.t_max = o.epochs;
  m.scheduler.cosine.base_lr = o.lr;
  m.class_names = {"cat", "dog"};
  return m;
}

bool has_line(const std::vector<std::string>& lines, const std::string& part) {
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(part) != std::string::npos; });
}

}  // namespace

TEST_CASE("plan_resume: an unchanged command continues the checkpoint's state", "[resume_plan]") {
  const std::vector<std::string> args = {"--data", "d", "--lr", "0.01", "--epochs", "10"};
  const io::CheckpointMeta m = checkpoint_of(args);
  const ResumePlan p = plan_resume(train_flags(args), "out/last.h5", m, {false, 1});
  CHECK(p.resumed);
  CHECK(p.changes.empty());
  CHECK(p.differences.empty());
  CHECK_FALSE(p.honour_lr);
  CHECK(p.state.epoch == 2);
  CHECK(p.state.global_step == 40);
  CHECK(p.state.best_val_acc == 0.5);
  CHECK(p.state.has_optimizer_state);
  CHECK(p.state.optimizer_steps == 40);
  CHECK(p.state.lr == Approx(0.001));  // the checkpoint's current LR, not --lr
  CHECK(p.state.has_scheduler_state);
  CHECK(p.state.scheduler_last_epoch == 2);
  REQUIRE(p.start_lines.size() == 1);
  CHECK(p.start_lines[0] == "Resuming from out/last.h5 at epoch 3");
}

TEST_CASE("plan_resume: a changed --lr restarts the learning rate from it", "[resume_plan]") {
  const io::CheckpointMeta m = checkpoint_of({"--data", "d", "--lr", "0.01", "--sched", "cosine"});
  const ResumePlan p = plan_resume(train_flags({"--data", "d", "--lr", "0.05", "--sched", "cosine"}), "c.h5", m,
                                   {false, 1});
  CHECK(p.honour_lr);
  CHECK(p.state.lr == 0.05);
  CHECK(p.state.cosine.base_lr == 0.05);
  REQUIRE(p.changes.size() == 1);
  CHECK(p.changes[0] == "Resume: --lr 0.05 instead of the checkpoint's 0.01 (the learning rate restarts from it)");
  CHECK(has_line(p.differences, "--lr 0.05 (that run: 0.01)"));
  CHECK(has_line(p.start_lines, "the learning rate restarts from it"));
}

TEST_CASE("plan_resume: --epochs changed stretches the cosine schedule", "[resume_plan]") {
  const io::CheckpointMeta m = checkpoint_of({"--data", "d", "--sched", "cosine", "--epochs", "5"});
  const ResumePlan p = plan_resume(train_flags({"--data", "d", "--sched", "cosine", "--epochs", "8"}), "c.h5", m,
                                   {false, 1});
  CHECK(p.epochs_changed);
  CHECK(p.state.cosine.t_max == 8);
  CHECK_FALSE(p.honour_lr);
}

TEST_CASE("plan_resume: the checkpoint fixes the model flags", "[resume_plan]") {
  const io::CheckpointMeta m = checkpoint_of({"--data", "d", "--arch", "resnet18", "--image-size", "64"});
  const ResumePlan p = plan_resume(train_flags({"--data", "d"}), "c.h5", m, {false, 1});
  CHECK(p.model.arch == Arch::ResNet18);
  CHECK(p.model.image_size == 64);
  CHECK(p.model_settings == "Model settings from c.h5: --arch resnet18 --image-size 64");
  TrainOptions o = train_flags({"--data", "d"});
  p.model.apply_to(o);
  CHECK(o.arch == Arch::ResNet18);
  CHECK(o.image_size == 64);
  // Given explicitly and different: refused, with the way out.
  try {
    plan_resume(train_flags({"--data", "d", "--arch", "resnet34"}), "c.h5", m, {false, 1});
    FAIL("no UsageError");
  } catch (const rd::UsageError& e) {
    CHECK_THAT(e.what(), Catch::Contains("it was trained with --arch resnet18") && Catch::Contains(kStartFresh));
  }
}

TEST_CASE("plan_resume: another scheduler starts fresh, with a notice", "[resume_plan]") {
  const io::CheckpointMeta m = checkpoint_of({"--data", "d", "--sched", "plateau"});
  const ResumePlan p = plan_resume(train_flags({"--data", "d", "--sched", "cosine"}), "c.h5", m, {false, 1});
  CHECK_FALSE(p.state.has_scheduler_state);
  CHECK(p.start_lines.at(0) == "Notice: checkpoint used --scheduler plateau; starting a fresh cosine schedule");
}

TEST_CASE("plan_resume: a mid-epoch position re-sharded for another global batch", "[resume_plan]") {
  io::CheckpointMeta m = checkpoint_of({"--data", "d", "-b", "4"}, 2);
  m.step_in_epoch = 3;  // 3 steps x 2 ranks x 4 = 24 samples consumed
  m.partial_count = 24;
  SECTION("same global batch: the same step") {
    const ResumePlan p = plan_resume(train_flags({"--data", "d", "-b", "8"}), "c.h5", m, {false, 1});
    CHECK(p.state.step_in_epoch == 3);
    CHECK(p.start_lines.at(0) == "Resuming from c.h5 at epoch 3 step 3");
  }
  SECTION("5 samples a step: step 4, 4 samples trained again") {
    const ResumePlan p = plan_resume(train_flags({"--data", "d", "-b", "5"}), "c.h5", m, {false, 1});
    CHECK(p.state.step_in_epoch == 4);
    CHECK(p.state.partial_count == 24);
    CHECK(has_line(p.start_lines, "checkpoint was trained on 2 ranks, this run has 1: global batch 8 -> 5"));
    CHECK(has_line(p.start_lines, "epoch 3 was stopped after 3 steps of 8 samples; at 5 samples per step it "
                                  "continues after step 4 and trains 4 of its samples again"));
  }
  SECTION("a step larger than what was consumed: the epoch's start, its sums dropped") {
    const ResumePlan p = plan_resume(train_flags({"--data", "d", "-b", "32"}), "c.h5", m, {false, 1});
    CHECK(p.state.step_in_epoch == 0);
    CHECK(p.state.partial_count == 0);
  }
}

TEST_CASE("plan_resume: --eval-only takes the weights and classes only", "[resume_plan]") {
  const io::CheckpointMeta m = checkpoint_of({"--data", "d", "--lr", "0.01"});
  const ResumePlan p = plan_resume(train_flags({"--data", "d", "--eval-only", "--lr", "0.5"}), "c.h5", m, {false, 1});
  CHECK(p.class_names == m.class_names);
  CHECK(p.changes.empty());
  CHECK_FALSE(p.state.has_optimizer_state);
  CHECK(p.start_lines.empty());
}

TEST_CASE("plan_fresh and TrainOptions::resume_checkpoint", "[resume_plan]") {
  const TrainOptions o = train_flags({"--data", "d", "--lr", "0.3", "--resume", "none"});
  const ResumePlan p = plan_fresh(o);
  CHECK_FALSE(p.resumed);
  CHECK(p.state.lr == 0.3);
  CHECK_FALSE(p.state.has_optimizer_state);
  CHECK(o.resume_checkpoint().empty());
  CHECK(train_flags({"--data", "d", "--resume", "x/c.h5"}).resume_checkpoint() == "x/c.h5");
  CHECK(train_flags({"--data", "d", "--output-dir", "/nonexistent/run"}).resume_checkpoint().empty());
}

TEST_CASE("plan_resume: the checkpoint fixes the evaluation transform (--val-resize-size/--val-crop-size)",
          "[resume_plan]") {
  const io::CheckpointMeta m =
      checkpoint_of({"--data", "d", "--train-crop-size", "48", "--val-resize-size", "56", "--val-crop-size", "48"});
  // --eval-only and a plain resume evaluate as trained, and the plan carries it to every rank.
  const ResumePlan p = plan_resume(train_flags({"--data", "d", "--eval-only"}), "c.h5", m, {false, 1});
  const ResumePlan q = ResumePlan::decode(p.encode());
  CHECK((q.model.val_resize_size == 56 && q.model.val_crop_size == 48));
  TrainOptions o = train_flags({"--data", "d"});
  q.model.apply_to(o);
  CHECK((o.val_resize_size == 56 && o.val_crop_size == 48));
  try {
    plan_resume(train_flags({"--data", "d", "--eval-only", "--val-crop-size", "40"}), "c.h5", m, {false, 1});
    FAIL("no UsageError");
  } catch (const rd::UsageError& e) {
    CHECK_THAT(e.what(), Catch::Contains("it was trained with --val-crop-size 48"));
  }
  // A checkpoint of the tutorial pipeline (or from before these fields) keeps Resize((S, S)).
  const ResumePlan t = plan_resume(train_flags({"--data", "d"}), "c.h5", checkpoint_of({"--data", "d"}), {false, 1});
  CHECK((t.model.val_resize_size == 0 && t.model.val_crop_size == 0));
}

TEST_CASE("ResumePlan crosses ranks as bytes, unchanged", "[resume_plan]") {
  io::CheckpointMeta m = checkpoint_of({"--data", "d", "--arch", "resnet18"}, 2);
  m.step_in_epoch = 5;
  m.class_names = {"a\nb", std::string("c\0d", 3), ""};
  const ResumePlan p = plan_resume(train_flags({"--data", "d", "--eval-only"}), "c.h5", m, {true, 3});
  const ResumePlan q = ResumePlan::decode(p.encode());
  CHECK(q.resumed == p.resumed);
  CHECK(q.checkpoint == p.checkpoint);
  CHECK(q.model.arch == Arch::ResNet18);
  CHECK(q.model.head == p.model.head);
  CHECK(q.model.image_size == p.model.image_size);
  CHECK(q.model.normalize == p.model.normalize);
  CHECK(q.class_names == m.class_names);
  CHECK(q.state.step_in_epoch == p.state.step_in_epoch);
  CHECK(q.state.lr == p.state.lr);
  CHECK(q.model_settings == p.model_settings);
  CHECK(q.start_lines == p.start_lines);
  CHECK(q.encode() == p.encode());
  CHECK_THROWS_AS(ResumePlan::decode(p.encode().substr(0, 10)), rd::Error);
}

TEST_CASE("plan_resume: the torchvision schedules and --model-ema continue from the checkpoint", "[resume_plan]") {
  const std::vector<std::string> args = {"--data", "d", "--lr", "0.1", "--epochs", "20", "--lr-scheduler", "steplr",
                                         "--lr-warmup-epochs", "3", "--lr-warmup-method", "linear", "--model-ema"};
  io::CheckpointMeta m = checkpoint_of(args);
  CHECK(m.scheduler.type == "steplr");
  m.ema.present = true;
  m.ema.n_averaged = 9;
  m.ema.num_batches_tracked = 35;
  const ResumePlan p = plan_resume(train_flags(args), "out/last.h5", m, {false, 1});
  CHECK(p.state.has_scheduler_state);
  CHECK(p.state.scheduler_last_epoch == 2);
  CHECK(p.state.has_ema_state);
  CHECK(p.state.ema_n_averaged == 9);
  CHECK(p.state.ema_num_batches_tracked == 35);
  // A cosine resumed with more epochs: T_max = epochs - warmup epochs, as the reference.
  const std::vector<std::string> cos = {"--data", "d", "--epochs", "20", "--lr-scheduler", "cosineannealinglr",
                                        "--lr-warmup-epochs", "4"};
  std::vector<std::string> longer = cos;
  longer[3] = "30";
  const ResumePlan c = plan_resume(train_flags(longer), "out/last.h5", checkpoint_of(cos), {false, 1});
  CHECK(c.state.cosine.t_max == 26);
  // A checkpoint without the average: --model-ema starts from its weights, and says so.
  m.ema = io::EmaState{};
  const ResumePlan q = plan_resume(train_flags(args), "out/last.h5", m, {false, 1});
  CHECK_FALSE(q.state.has_ema_state);
  CHECK(has_line(q.start_lines, "checkpoint has no weight EMA"));
}

namespace {

// Sets the Slurm variables of one case (nullptr: unset) and restores them afterwards.
class SlurmEnv {
 public:
  SlurmEnv(const char* job, const char* step, const char* restarts) {
    set("SLURM_JOB_ID", job);
    set("SLURM_STEP_ID", step);
    set("SLURM_RESTART_COUNT", restarts);
    ::unsetenv("SLURM_STEPID");
  }
  ~SlurmEnv() {
    for (const char* v : {"SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT"}) ::unsetenv(v);
  }

 private:
  static void set(const char* name, const char* value) {
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
};

}  // namespace

TEST_CASE("refuse_new_experiment: inside Slurm only a requeue of the checkpoint's job continues unasked",
          "[resume_plan]") {
  const std::vector<std::string> was = {"--data", "d", "--lr", "0.0001", "--epochs", "3"};
  const TrainOptions now = train_flags({"--data", "d", "--lr", "0.01", "--epochs", "3"});
  const std::vector<std::string> diff = {"--lr 0.01 (that run: 0.0001)"};
  io::CheckpointMeta m = checkpoint_of(was);
  auto refused = [&] {
    try {
      refuse_new_experiment(now, "out/last.h5", m, diff);
    } catch (const UsageError& e) {
      CHECK(std::string(e.what()).find("--lr 0.01 (that run: 0.0001)") != std::string::npos);
      return true;
    }
    return false;
  };
  {
    SlurmEnv env("999", nullptr, nullptr);  // the review's case: a checkpoint from no job
    CHECK(refused());
    record_slurm_job(m);  // written by job 999, before any requeue
    CHECK(m.slurm_job_id == "999");
    CHECK(m.slurm_restart_count == 0);
    CHECK(refused());  // the job script's next experiment
  }
  {
    SlurmEnv env("999", nullptr, "1");  // the job requeued
    CHECK_FALSE(refused());
  }
  {
    SlurmEnv env("1000", nullptr, "1");  // another job's requeue
    CHECK(refused());
  }
  {
    SlurmEnv env("999", "0", "2");
    record_slurm_job(m);  // step 0 of the job's second restart
    CHECK(m.slurm_step_id == "0");
    CHECK(m.slurm_restart_count == 2);
  }
  {
    SlurmEnv env("999", "1", "3");  // a later restart, but another step: another experiment
    CHECK(refused());
  }
  {
    SlurmEnv env("999", "0", "3");
    CHECK_FALSE(refused());
  }
  {
    SlurmEnv env(nullptr, nullptr, nullptr);  // outside Slurm, as before
    CHECK(refused());
    record_slurm_job(m);
    CHECK(m.slurm_job_id.empty());
  }
  const TrainOptions asked = train_flags({"--data", "d", "--lr", "0.01", "--epochs", "3", "--resume", "auto"});
  CHECK_NOTHROW(refuse_new_experiment(asked, "out/last.h5", m, diff));
}
