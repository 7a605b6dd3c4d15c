// LR schedulers (train/scheduler.h) against PyTorch 1.13's numbers, their checkpoint
// round trip through last.h5, and the schedule flags' errors. Every schedule and
// warmup over 100 epochs against torch itself: check_sched_vs_torch.py.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/train/cli.h"
#include "resnet_ddp/train/optimizer.h"
#include "resnet_ddp/train/scheduler.h"
#include "train/parse_cli.h"
#include "train/train_test_util.h"

using namespace rd;
using namespace rd::train;
using rd::test::TempDir;

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

TEST_CASE("StepLR after a linear warmup matches torch 1.13", "[train]") {
  // SequentialLR([LinearLR(start_factor=0.01, total_iters=3), StepLR(step_size=2,
  // gamma=0.1)], milestones=[3]) on SGD(lr=0.1): the LR at construction, then after each
  // step (torch 1.13.1).
  const std::vector<double> torch_lr = {0.001, 0.034, 0.067, 0.1, 0.1, 0.010000000000000002, 0.010000000000000002,
                                        0.0010000000000000002};
  SchedulerConfig c;
  c.kind = SchedulerKind::Step;
  c.base_lr = 0.1;
  c.epochs = 10;
  c.step_size = 2;
  c.warmup_epochs = 3;
  c.warmup_method = WarmupMethod::Linear;
  Scheduler s(c);
  double lr = s.initial_lr();
  CHECK(lr == Approx(torch_lr[0]).epsilon(1e-12));
  for (size_t i = 1; i < torch_lr.size(); ++i) {
    lr = s.step(lr, 0.0);
    INFO("step " << i);
    CHECK(lr == Approx(torch_lr[i]).epsilon(1e-12));
  }
}

namespace {

SchedulerConfig warm_cosine() {
  SchedulerConfig c;
  c.kind = SchedulerKind::Cosine;
  c.base_lr = 0.5;
  c.epochs = 30;
  c.eta_min = 1e-4;
  c.warmup_epochs = 5;
  c.warmup_method = WarmupMethod::Linear;
  c.warmup_decay = 0.01;
  return c;
}

}  // namespace

TEST_CASE("a schedule resumed from last.h5 continues the same LR sequence", "[train]") {
  for (const SchedulerKind kind : {SchedulerKind::Cosine, SchedulerKind::Step, SchedulerKind::MultiStep,
                                   SchedulerKind::Exponential}) {
    SchedulerConfig c = warm_cosine();
    c.kind = kind;
    c.step_size = 4;
    c.gamma = 0.7;
    c.milestones = {8, 12, 20};
    INFO("scheduler " << name_of(scheduler_names(), kind));
    // The uninterrupted run.
    Scheduler whole(c);
    std::vector<double> expected = {whole.initial_lr()};
    for (int e = 0; e < 30; ++e) expected.push_back(whole.step(expected.back(), 0.0));
    for (const int stop : {3, 5, 11}) {  // inside the warmup, at its end, in the main schedule
      TempDir dir;
      auto be = make_cpu_backend({});
      auto model = rd::test::trained_tiny(*be, HeadKind::Mlp, 3, 11);
      OptimizerConfig oc;
      oc.type = OptimizerKind::Sgd;
      oc.lr = c.base_lr;
      Optimizer opt(*be, model->params(), model->grads(), oc);
      Scheduler first(c);
      opt.set_lr(first.initial_lr());
      for (int e = 0; e < stop; ++e) opt.set_lr(first.step(opt.lr(), 0.0));
      const std::string path = dir.file("last.h5");
      const io::OptimizerState os = opt.export_state();
      const io::SchedulerState ss = first.export_state();
      io::write_checkpoint(path, *model, &os, &ss, rd::test::tiny_meta("mlp", 3));
      io::CheckpointReader ck(path);
      CHECK(ck.meta().scheduler.type == name_of(scheduler_names(), kind));
      Scheduler resumed(c);
      resumed.import_state(ck.meta().scheduler);
      CHECK(resumed.last_epoch() == stop);
      double lr = ck.meta().optimizer.lr;
      CHECK(lr == expected[static_cast<size_t>(stop)]);
      for (int e = stop; e < 30; ++e) {
        lr = resumed.step(lr, 0.0);
        INFO("stopped after " << stop << ", epoch " << e + 1);
        CHECK(lr == expected[static_cast<size_t>(e + 1)]);  // bit for bit
      }
    }
  }
}

namespace {

std::string usage_error(std::vector<std::string> args) {
  args.insert(args.begin(), {"--data", "/tmp/d"});
  try {
    parse_cli(std::move(args));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the torchvision schedule flags parse and refuse bad values by name", "[train]") {
  const TrainOptions t = parse_cli({"--data", "/tmp/d", "--lr-scheduler", "cosineannealinglr", "--epochs", "90",
                                    "--lr-warmup-epochs", "5", "--lr-warmup-method", "linear", "--lr-warmup-decay",
                                    "0.1", "--lr-min", "1e-5"})
                             .train;
  CHECK(t.scheduler == SchedulerKind::Cosine);
  const SchedulerConfig c = scheduler_config(t);
  CHECK(c.warmup_epochs == 5);
  CHECK(c.warmup_method == WarmupMethod::Linear);
  CHECK(c.warmup_decay == 0.1);
  CHECK(c.eta_min == 1e-5);
  CHECK(Scheduler(c).cosine.t_max == 85);  // T_max = epochs - warmup, as the reference
  const TrainOptions m =
      parse_cli({"--data", "/tmp/d", "--lr-scheduler", "multisteplr", "--lr-milestones", "30,60,80", "--lr-gamma",
                 "0.2"})
          .train;
  CHECK(m.lr_milestones == std::vector<int64_t>{30, 60, 80});
  CHECK(m.lr_gamma == 0.2);
  const TrainOptions d = parse_cli({"--data", "/tmp/d"}).train;  // the tutorial recipe is unchanged
  CHECK(d.scheduler == SchedulerKind::Plateau);
  CHECK(d.lr_warmup_epochs == 0);
  CHECK_FALSE(d.model_ema);
  CHECK(Scheduler(scheduler_config(d)).initial_lr() == d.lr);

  CHECK_THAT(usage_error({"--lr-warmup-epochs", "-1"}), Catch::Contains("--lr-warmup-epochs"));
  CHECK_THAT(usage_error({"--scheduler", "steplr", "--epochs", "5", "--lr-warmup-epochs", "5"}),
             Catch::Contains("--lr-warmup-epochs 5: must be less than --epochs (5)"));
  CHECK_THAT(usage_error({"--lr-warmup-epochs", "2"}),
             Catch::Contains("--lr-warmup-epochs: not with --scheduler plateau"));
  CHECK_THAT(usage_error({"--lr-scheduler", "multisteplr", "--lr-milestones", "30,20"}),
             Catch::Contains("--lr-milestones 30,20: milestones must be strictly increasing"));
  CHECK_THAT(usage_error({"--lr-scheduler", "multisteplr", "--lr-milestones", "30,30"}),
             Catch::Contains("strictly increasing"));
  CHECK_THAT(usage_error({"--lr-scheduler", "multisteplr", "--lr-milestones", "0,10"}),
             Catch::Contains("--lr-milestones 0,10: expected positive epoch numbers"));
  CHECK_THAT(usage_error({"--lr-scheduler", "multisteplr", "--lr-milestones", "10,x"}),
             Catch::Contains("--lr-milestones 10,x: expected positive"));
  CHECK_THAT(usage_error({"--lr-scheduler", "multisteplr"}), Catch::Contains("needs --lr-milestones"));
  CHECK_THAT(usage_error({"--lr-milestones", "10"}),
             Catch::Contains("--lr-milestones: only with --lr-scheduler multisteplr"));
  CHECK_THAT(usage_error({"--lr-scheduler", "lambdalr"}), Catch::Contains("--lr-scheduler: expected one of"));
  CHECK_THAT(usage_error({"--lr-warmup-decay", "0"}), Catch::Contains("--lr-warmup-decay"));
  CHECK_THAT(usage_error({"--lr-warmup-decay", "1.5"}), Catch::Contains("--lr-warmup-decay"));
  CHECK_THAT(usage_error({"--lr-warmup-method", "cosine"}), Catch::Contains("--lr-warmup-method"));
  CHECK_THAT(usage_error({"--lr-step-size", "0"}), Catch::Contains("--lr-step-size"));
  CHECK_THAT(usage_error({"--lr-gamma", "0"}), Catch::Contains("--lr-gamma"));
  CHECK_THAT(usage_error({"--model-ema-steps", "0"}), Catch::Contains("--model-ema-steps"));
  CHECK_THAT(usage_error({"--model-ema-decay", "1.5"}), Catch::Contains("--model-ema-decay"));
}
