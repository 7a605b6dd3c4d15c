// What a training run prints and records: the start line, each step's TensorBoard
// scalars and progress, each epoch's summary lines, metrics.csv row and epoch/ scalars.
// All of it on rank 0.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "train/trainer.h"

namespace rd::train {

void Trainer::open_reports() {
  agree([&] { metrics_ = std::make_unique<MetricsCsv>(o_.metrics_path(), plan_.resumed, state_.epoch + 1); },
        rank0());
  if (rank0()) progress_ = std::make_unique<Progress>(o_.progress, o_.log_every);
  // A new event file per run; its steps continue the checkpoint's global step.
  if (rank0() && o_.tensorboard && state_.epoch < o_.epochs)
    tb_ = TensorBoardWriter::create(o_.output_dir, state_.global_step + 1);
}

void Trainer::report_start() {
  if (!rank0()) return;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "Model: %s (%s head, %zu classes, %.2fM parameters), %d rank(s) x batch %d x accum %d = global "
                "batch %d, %s lr %s, scheduler %s",
                name_of(arch_names(), o_.arch).c_str(), head_name(o_.head), run_.class_names.size(), run_.model->num_parameters() / 1e6, env_.world,
                o_.batch_size, o_.accum_steps, env_.world * o_.batch_size * o_.accum_steps, run_.opt->type_name().c_str(),
                py_float(run_.opt->lr()).c_str(), run_.sched->type().c_str());
  say(buf);
}

void Trainer::report_step_scalars(const StepRecord& r, const double* g) {
  if (!tb_) return;
  const StepTimes& t = r.times;
  const double n = g[2] > 0 ? g[2] : 1.0;
  tb_->scalars(r.global_step, {{"step/loss", g[0] / n},
                               {"step/accuracy", g[1] / n},
                               {"step/lr", r.lr},
                               {"step/images_per_s", r.seconds > 0 ? g[2] / r.seconds : 0.0},
                               {"step/time_ms", 1e3 * t.total()},
                               {"step/data_ms", 1e3 * t.data},
                               {"step/forward_ms", 1e3 * t.forward},
                               {"step/backward_ms", 1e3 * t.backward},
                               {"step/comm_ms", 1e3 * t.comm},
                               {"step/optimizer_ms", 1e3 * t.optimizer}});
}

void Trainer::report_progress(int64_t step, const StepSums& local, double epoch_seconds) {
  if (progress_) {
    progress_->step(step, local.seen ? local.loss / local.seen : 0.0, local.seen ? local.correct / local.seen : 0.0,
                    epoch_seconds > 0 ? local.seen * env_.world / epoch_seconds : 0.0);
  }
}

EpochMetrics Trainer::report_epoch(const EpochResult& r, const EpochStats& st) {
  const StepTimes& t = st.times;
  const double steps = static_cast<double>(std::max<int64_t>(st.steps, 1));
  double ips = st.seconds > 0 ? r.images / st.seconds : 0.0;
  // The steady state: the run's first step (planning, first allocations) is reported
  // on its own line and left out, unless it was the epoch's only step.
  const double steady_s = st.seconds - st.warmup_seconds, steady_images = r.images - r.warmup_images;
  const bool steady = st.warmup_seconds > 0 && steady_s > 0 && steady_images > 0;
  if (steady) ips = steady_images / steady_s;
  EpochMetrics m;
  m.epoch = r.epoch + 1;
  m.time_s = r.seconds;
  m.train_loss = r.train_loss;
  m.train_acc = r.train_acc;
  m.val_loss = r.val_loss;
  m.val_acc = r.val_acc;
  m.val_acc5 = r.val_acc5;
  if (r.ema_val_acc >= 0) {
    m.ema_val_loss = r.ema_val_loss;
    m.ema_val_acc = r.ema_val_acc;
    m.ema_val_acc5 = r.ema_val_acc5;
  }
  m.best_val_acc = state_.best_val_acc;
  m.lr = r.lr_used;
  m.images_per_s = ips;
  m.images_per_s_per_rank = ips / env_.world;
  m.data_ms = 1e3 * t.data / steps;
  m.forward_ms = 1e3 * t.forward / steps;
  m.backward_ms = 1e3 * t.backward / steps;
  m.comm_ms = 1e3 * t.comm / steps;
  m.optimizer_ms = 1e3 * t.optimizer / steps;
  m.world_size = env_.world;
  m.global_step = state_.global_step;
  const std::string tag = epoch_tag(r.epoch);
  for (const auto& line : epoch_summary(tag, m, 1e3 * t.total() / steps)) say(line);
  if (st.warmup_seconds > 0) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s Warm-up: first step %.3f s (planning, first allocations)%s", tag.c_str(),
                  st.warmup_seconds,
                  steady ? ", left out of the throughput" : "");
    say(buf);
  }
  if (run_.step->scaler().enabled()) {
    // Every rank skips the same updates (the all-reduce spreads a non-finite value).
    const int64_t skipped = run_.step->skipped_steps() - skipped_reported_;
    skipped_reported_ = run_.step->skipped_steps();
    if (skipped > 0)
      say(tag + " fp16: " + std::to_string(skipped) + (skipped == 1 ? " step" : " steps") +
          " skipped for non-finite gradients (loss scale now " + py_float(run_.step->scaler().scale()) + ")");
  }
  const int64_t replays = run_.step->graph_replays() - graph_replays_reported_;
  const int64_t recordings = run_.step->graph_recordings() - graph_recordings_reported_;
  graph_replays_reported_ = run_.step->graph_replays();
  graph_recordings_reported_ = run_.step->graph_recordings();
  if (replays > 0)  // replays include the launch that follows each recording
    say(tag + " CUDA graphs: " + std::to_string(replays) + " forward/backward/optimizer passes replayed, " +
        std::to_string(recordings) + " recorded");
  say("");
  say("");
  return m;
}

void Trainer::record_epoch(const EpochMetrics& m) {
  if (metrics_) {
    try {
      metrics_->write(m);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "resnet_ddp: warning: %s\n", e.what());
    }
  }
  if (tb_) {
    // The metrics.csv columns under epoch/, at the epoch's last global step (less the
    // two that are not measurements, and the EMA's when there is no EMA: nan).
    std::vector<std::pair<std::string, double>> scalars;
    for (const auto& c : m.columns())
      if (std::string_view(c.name) != "world_size" && std::string_view(c.name) != "global_step" &&
          !std::isnan(c.value))
        scalars.emplace_back(std::string("epoch/") + c.name, c.value);
    tb_->scalars(m.global_step, scalars);
    tb_->flush();
  }
}

}  // namespace rd::train
