// The training program: the run from set-up to the final evaluation, and the epoch
// loop around TrainStep with exact global metrics. Set-up, checkpoints and reporting
// live beside it (trainer.h lists where).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "resnet_ddp/train/commands.h"
#include "resnet_ddp/dist/launcher.h"
#include "train/lr_scaling.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace rd::train {

namespace {

// A step is accum_steps micro-batches (fewer at the end of the epoch).
int micro_batches_in_step(int64_t step, int64_t micro_total, int accum_steps) {
  const int64_t remaining = micro_total - step * accum_steps;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(accum_steps, remaining)));
}

// A divergence the per-step check (update) cannot see: the last update of the epoch left
// non-finite weights, which only validation meets, or the epoch's loss sum overflowed.
// Both values are reduced over the ranks, so every rank stops here together. Under fp16
// the loss scaler skips such steps instead.
void stop_if_diverged(const EpochResult& r, bool loss_scaling, bool speaker) {
  if (loss_scaling || (std::isfinite(r.train_loss) && std::isfinite(r.val_loss))) return;
  if (speaker)
    std::fprintf(stderr,
                 "resnet_ddp: error: the %s loss became NaN or Inf in epoch %lld (train loss %s, val loss %s): the "
                 "weights diverged; stopping without saving. Try a lower --lr, --precision fp32, or check the "
                 "data.\n",
                 std::isfinite(r.train_loss) ? "validation" : "training", static_cast<long long>(r.epoch + 1),
                 py_float(r.train_loss).c_str(), py_float(r.val_loss).c_str());
  throw CollectiveExit{1};
}

}  // namespace

int Trainer::run() {
  // Before the resume plan, which compares this run's lr with the checkpoint's.
  const LrChoice lr = o_.eval_only ? LrChoice{} : choose_lr(o_, env_.world);
  apply_lr_choice(o_, lr);
  setup_device();
  lock_output();
  resolve_resume();
  run_ = setup_parts(lr);
  check_output_space();
  load_start_state();
  if (o_.eval_only) {
    evaluate_only();
    return 0;
  }
  report_start();
  const bool nothing_to_train = state_.epoch >= o_.epochs;
  if (nothing_to_train)
    notice("the checkpoint already completed " + std::to_string(state_.epoch) + " epoch(s) of --epochs " +
           std::to_string(o_.epochs) + "; nothing to train");
  train_epochs();
  // "Best model ... has been saved" would claim this run produced it.
  if (!nothing_to_train) evaluate_best();
  return 0;
}

void Trainer::evaluate_only() {
  double loss = 0, acc = 0, acc5 = 0;
  validate(loss, acc, &acc5);
  say("");
  const size_t unreadable = run_.val_set->unreadable_files();
  say("Evaluated " + (plan_.checkpoint.empty() ? o_.init : plan_.checkpoint) + " on " +
      std::to_string(run_.val_set->size()) + " validation images" +
      (unreadable ? " (" + std::to_string(unreadable) + " unreadable file(s) skipped, not scored)" : ""));
  say("Val loss: " + py_float(loss) + ", Val accuracy: " + py_float(acc));
  say(torchvision_accuracy_line("", acc, acc5));
  if (run_.ema) {  // --model-ema: the checkpoint's average too, as the reference's --test-only evaluates it
    EpochResult r;
    run_.ema->evaluate_average(*run_.model, [&] { validate(r.ema_val_loss, r.ema_val_acc, &r.ema_val_acc5); });
    say(ema_accuracy_line(r.ema_val_acc, r.ema_val_acc5, r.ema_val_loss));
  }
}

// The epoch loop: train, reduce the epoch's sums, validate, step the scheduler, report,
// save, and check that the replicas still agree.
void Trainer::train_epochs() {
  open_reports();
  say("");
  for (int64_t epoch = state_.epoch; epoch < o_.epochs; ++epoch) {
    const auto t0 = Clock::now();
    EpochResult r;
    r.epoch = epoch;
    r.lr_used = run_.opt->lr();
    const EpochStats st = train_one_epoch(epoch);
    if (st.preempted) throw CollectiveExit{0};
    state_.step_in_epoch = 0;
    double sums[1] = {st.loss_sum};
    int64_t counts[3] = {st.correct, st.seen, st.warmup_seen};
    ctrl_->allreduce(sums, 1, dist::ReduceOp::Sum);
    ctrl_->allreduce(counts, 3, dist::ReduceOp::Sum);
    r.warmup_images = static_cast<double>(counts[2]);
    stop_notice_at("epoch " + std::to_string(epoch + 1) + " (validation)",
                   "saving last.h5 after this epoch's validation");
    r.train_loss = counts[1] ? sums[0] / static_cast<double>(counts[1]) : 0.0;
    r.train_acc = counts[1] ? static_cast<double>(counts[0]) / static_cast<double>(counts[1]) : 0.0;
    validate(r.val_loss, r.val_acc, &r.val_acc5);
    stop_if_diverged(r, run_.step->scaler().enabled(), rank0());
    // The average as the reference's "Test: EMA" (printed with the epoch's summary);
    // best_model.h5 stays chosen by the model's own accuracy, as there.
    if (run_.ema)
      run_.ema->evaluate_average(*run_.model, [&] { validate(r.ema_val_loss, r.ema_val_acc, &r.ema_val_acc5); });
    r.seconds = seconds_since(t0);
    const bool improved = r.val_acc > state_.best_val_acc;
    if (improved) {
      state_.best_val_acc = r.val_acc;
      state_.best_val_loss = r.val_loss;
    }
    run_.opt->set_lr(run_.sched->step(run_.opt->lr(), r.val_loss));
    // Images this epoch actually trained on (all ranks).
    r.images = static_cast<double>(counts[1]) -
               (epoch == state_.epoch ? static_cast<double>(state_.partial_count) : 0.0);
    const EpochMetrics m = report_epoch(r, st);
    if (improved) save(best_path_, epoch + 1, 0, r.val_loss, r.val_acc);
    save(last_path_, epoch + 1, 0, r.val_loss, r.val_acc);
    record_epoch(m);
    state_.partial_count = 0;
    check_replicas(epoch);
    bool preempt = false, unused = false;
    step_flags(false, preempt, unused);
    if (preempt && epoch + 1 < o_.epochs) {
      say("Preempted at epoch " + std::to_string(epoch + 1) + " step " + std::to_string(st.steps) +
          "; checkpoint saved to " + fs::absolute(last_path_).string());
      throw CollectiveExit{0};
    }
  }
  stop_notice_at("", "");  // training is over: a stop now loses nothing
}

// The epoch's permutation for this rank, minus what an interrupted epoch already
// consumed (rank 0's sums take over that part's), and the loader started on it.
void Trainer::start_epoch(EpochRun& e) {
  e.started = Clock::now();
  run_.sampler->set_epoch(e.epoch);
  std::vector<int64_t> indices = run_.sampler->indices();
  const int64_t per_step = static_cast<int64_t>(o_.batch_size) * o_.accum_steps;
  e.micro_total = (static_cast<int64_t>(indices.size()) + o_.batch_size - 1) / o_.batch_size;
  e.steps_total = (e.micro_total + o_.accum_steps - 1) / o_.accum_steps;
  if (o_.max_steps > 0) e.steps_total = std::min(e.steps_total, o_.max_steps);
  if (e.epoch == state_.epoch && state_.step_in_epoch > 0) {
    e.first_step = std::min(state_.step_in_epoch, e.steps_total);
    const size_t skip = std::min(indices.size(), static_cast<size_t>(e.first_step * per_step));
    indices.erase(indices.begin(), indices.begin() + static_cast<long>(skip));
    if (rank0()) {
      e.stats.loss_sum += state_.partial_loss_sum;
      e.stats.correct += state_.partial_correct;
      e.stats.seen += state_.partial_count;
    }
  }
  run_.train_loader->restart(std::move(indices), e.epoch);
  run_.model->train(true);
  if (progress_) progress_->start_epoch(e.epoch + 1, o_.epochs, e.steps_total);
}

// The steps of one epoch; stops early (preempted) once the ranks agreed on a preemption
// and last.h5 is written.
EpochStats Trainer::train_one_epoch(int64_t epoch) {
  EpochRun e;
  e.epoch = epoch;
  start_epoch(e);
  EpochStats& st = e.stats;
  agreed_at_ = Clock::now();
  steps_since_agree_ = 0;
  for (int64_t step = e.first_step; step < e.steps_total && !e.loader_done;) {
    announce_stop_point(epoch, step, e.steps_total);
    if (train_step(e, step) == 0) break;
    ++step;
    const bool periodic = o_.checkpoint_every > 0 && state_.global_step % o_.checkpoint_every == 0 &&
                          step < e.steps_total && !e.loader_done;
    const bool last = step >= e.steps_total || e.loader_done;
    // One rank agrees with itself: only a stop signal (or a save) needs the sums now.
    const bool agree = env_.world > 1 ? steps_since_agree_ >= agree_every_ || periodic || last
                                      : periodic || last || preemption_signal() != 0;
    bool preempt = false;
    if (agree) agree_on_steps(st, e.local, preempt);
    if (preempt) {
      if (progress_) progress_->end_epoch();
      st.seconds += seconds_since(e.started);
    }
    // The periodic save is the preemption checkpoint without stopping: a crash loses
    // at most N steps.
    if (preempt || periodic) save_mid_epoch(epoch, step, st);
    if (preempt) {
      say("Preempted at epoch " + std::to_string(epoch + 1) + " step " + std::to_string(step) +
          "; checkpoint saved to " + fs::absolute(last_path_).string());
      st.preempted = true;
      return st;
    }
  }
  // Every rank leaves the loop at the same step; what is still queued is read here.
  bool unused = false;
  if (!records_.empty()) agree_on_steps(st, e.local, unused);
  if (progress_) progress_->end_epoch();
  st.seconds += seconds_since(e.started);
  return st;
}

// One optimizer step, as llm.c's loop: per micro-batch get the batch, forward, backward
// (the buckets all-reduced during the group's last); then the update, the hooks and the
// bookkeeping. No host wait anywhere: the loss sums stay on the device (queue_step reads
// them a step late), and so do the timing marks of the step's split.
int Trainer::train_step(EpochRun& e, int64_t step) {
  const auto t_step = Clock::now();
  StepRecord r;
  r.epoch = e.epoch;
  r.step = step;
  r.bank = static_cast<int>(step % 2);
  const auto mark = [&](int micro, StepMark m) { backend_->timing_mark(timing_mark_index(r.bank, micro, m)); };
  const int group = micro_batches_in_step(step, e.micro_total, o_.accum_steps);
  double* sums = step_sums_slot(step);
  int micro = 0;
  for (; micro < group; ++micro) {
    const auto t_data = Clock::now();
    if (!run_.train_loader->next(e.batch)) break;
    // The upload runs on the copy stream while the host queues the forward behind it.
    Tensor& uploaded = upload_batch(*run_.model, e.batch, run_.norm);
    if (micro == 0) sync_buffers();
    r.times.data += seconds_since(t_data);
    mark(micro, kForward);
    const MixedBatch in = run_.mixer.mix(uploaded, e.batch.labels.data(), e.batch.n, e.epoch, step, micro);
    run_.step->forward_sums(*in.input, e.batch.labels.data(), in.accuracy_targets, sums, micro, group, in.targets);
    r.seen += e.batch.n;
    mark(micro, kLoss);
    r.host_comm.push_back(run_.step->backward_and_reduce(timing_mark_index(r.bank, micro, kBackward)).comm);
    mark(micro, kBuckets);
  }
  if (inject_step_delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(inject_step_delay_ms_));
  // The loader ran dry inside a group: every rank has the same batch count, so all
  // ranks get here together; the partial group's communication is finished.
  e.loader_done = micro < group;
  e.stats.times.data += r.times.data;
  if (micro == 0) return 0;
  if (e.loader_done) run_.step->reduce_partial_group();
  // A non-finite loss is caught when its sums are read (fp32: the run stops before
  // anything is saved); under fp16 the loss scaler skips the update.
  backend_->timing_mark(optimizer_mark_index(r.bank, 0));
  run_.step->update();
  backend_->timing_mark(optimizer_mark_index(r.bank, 1));
  ++state_.global_step;
  if (run_.ema) run_.ema->after_optimizer_step(*run_.model, e.epoch, step);
  ++e.stats.steps;
  ++steps_since_agree_;
  r.seconds = seconds_since(t_step);
  measured_step(r.seconds);
  queue_step(std::move(r), micro, sums, e);
  return micro;
}

// Several ranks see a stop signal at their next agreement (agree_on_steps), so the stop
// line names that step (1-based; a periodic save agrees too).
void Trainer::announce_stop_point(int64_t epoch, int64_t step, int64_t steps_total) {
  int64_t stop_after = env_.world > 1 ? std::min(steps_total, step + agree_every_ - steps_since_agree_) : step + 1;
  if (o_.checkpoint_every > 0)
    stop_after = std::min(stop_after, step + o_.checkpoint_every - state_.global_step % o_.checkpoint_every);
  stop_notice_at("epoch " + std::to_string(epoch + 1) + " step " + std::to_string(step + 1) + " of " +
                     std::to_string(steps_total),
                 stop_after <= step + 1 ? std::string("saving last.h5 when this step ends")
                                        : "saving last.h5 when step " + std::to_string(stop_after) + " ends");
}

// The previous step's sums (queued a step ago, long done on the device) are taken, then
// this step's are queued behind its work.
void Trainer::queue_step(StepRecord r, int micro, const double* device_sums, EpochRun& e) {
  r.global_step = state_.global_step;
  r.lr = run_.opt->lr();
  r.epoch_seconds = seconds_since(e.started);
  r.micro = micro;
  if (steps_this_run_ == 1) {
    e.stats.warmup_seconds = r.seconds;
    e.stats.warmup_seen = static_cast<int64_t>(r.seen);
  }
  backend_->wait_queued_copies();
  take_read_steps(e.stats, e.local);
  records_.push_back(std::move(r));
  backend_->copy_to_host_queued(records_.back().sums, device_sums, 3 * sizeof(double));
}

double* Trainer::step_sums_slot(int64_t step) {
  if (!step_sums_device_) step_sums_device_ = backend_->allocate(kSumSlots * 3 * sizeof(double));
  double* slot = static_cast<double*>(step_sums_device_.get()) + (step % kSumSlots) * 3;
  // Queued behind the copy that read this slot two steps ago; zero bits are 0.0.
  backend_->fill(reinterpret_cast<float*>(slot), 0.f, 3 * sizeof(double) / sizeof(float));
  return slot;
}

void Trainer::take_read_steps(EpochStats& st, StepSums& local) {
  for (StepRecord& r : records_) {
    if (r.read) continue;
    r.read = true;
    read_step_times(r);
    st.times.forward += r.times.forward;
    st.times.backward += r.times.backward;
    st.times.comm += r.times.comm;
    st.times.optimizer += r.times.optimizer;
    st.loss_sum += r.sums[0];
    st.correct += static_cast<int64_t>(r.sums[1]);
    st.seen += static_cast<int64_t>(r.seen);
    local.loss += r.sums[0];
    local.correct += r.sums[1];
    local.seen += r.seen;
    report_progress(r.step + 1, local, r.epoch_seconds);
  }
  if (env_.world > 1) return;
  // One rank: its sums are the global ones.
  while (!records_.empty() && records_.front().read) {
    const StepRecord& r = records_.front();
    stop_on_nonfinite(r, r.sums[2]);
    const double g[3] = {r.sums[0], r.sums[1], r.seen};
    report_step_scalars(r, g);
    records_.pop_front();
  }
}

void Trainer::agree_on_steps(EpochStats& st, StepSums& local, bool& preempt) {
  backend_->wait_queued_copies();
  take_read_steps(st, local);
  preempt = preemption_signal() != 0;
  if (env_.world > 1) {
    // One all-reduce: the stop flag, this stretch's seconds, then per step loss, correct,
    // images and non-finite flag.
    const size_t n = records_.size();
    std::vector<double> v(2 + 4 * n);
    v[0] = preempt ? 1.0 : 0.0;
    v[1] = seconds_since(agreed_at_);
    for (size_t i = 0; i < n; ++i) {
      const StepRecord& r = records_[i];
      v[2 + 4 * i] = r.sums[0];
      v[3 + 4 * i] = r.sums[1];
      v[4 + 4 * i] = r.seen;
      v[5 + 4 * i] = r.sums[2];
    }
    ctrl_->allreduce(v.data(), v.size(), dist::ReduceOp::Sum);
    preempt = v[0] > 0;
    for (size_t i = 0; i < n; ++i) {
      stop_on_nonfinite(records_[i], v[5 + 4 * i]);
      report_step_scalars(records_[i], &v[2 + 4 * i]);
    }
    // The next stretch: as many steps as fit the stop latency budget at the ranks' mean
    // step time, at most --log-every; identical on every rank (the reduced values).
    if (steps_since_agree_ > 0) {
      const double step_s = v[1] / env_.world / static_cast<double>(steps_since_agree_);
      const int64_t cap = o_.log_every > 0 ? o_.log_every : 1000;
      const double fit = step_s > 0 ? stop_latency_budget_s() / step_s : static_cast<double>(cap);
      agree_every_ = std::clamp<int64_t>(static_cast<int64_t>(std::min(fit, static_cast<double>(cap))), 1, cap);
    }
    records_.clear();
  }
  steps_since_agree_ = 0;
  agreed_at_ = Clock::now();
}

void Trainer::stop_on_nonfinite(const StepRecord& r, double nonfinite) {
  // Under fp16 the loss scaler skips such a step instead (AMP's GradScaler): its
  // gradients are not finite either.
  if (nonfinite == 0 || run_.step->scaler().enabled()) return;
  if (rank0())
    std::fprintf(stderr,
                 "resnet_ddp: error: the training loss became NaN or Inf at epoch %lld step %lld (global step "
                 "%lld); stopping without saving. Try a lower --lr, --precision fp32, or check the data.\n",
                 static_cast<long long>(r.epoch + 1), static_cast<long long>(r.step + 1),
                 static_cast<long long>(r.global_step));
  throw CollectiveExit{1};
}

void Trainer::read_step_times(StepRecord& r) {
  StepTimes& t = r.times;
  for (int m = 0; m < r.micro; ++m) {
    const auto at = [&](int mark) { return timing_mark_index(r.bank, m, mark); };
    t.forward += backend_->timing_seconds(at(kForward), at(kLoss));
    t.backward += backend_->timing_seconds(at(kLoss), at(kBackward));
    // Exposed communication: the host's wait for the buckets, or the device's, whichever
    // is longer (NCCL orders the compute stream after the last bucket).
    t.comm += std::max(r.host_comm[static_cast<size_t>(m)], backend_->timing_seconds(at(kBackward), at(kBuckets)));
  }
  t.optimizer = backend_->timing_seconds(optimizer_mark_index(r.bank, 0), optimizer_mark_index(r.bank, 1));
}

// last.h5 inside an epoch, with the epoch's training sums so far (global).
void Trainer::save_mid_epoch(int64_t epoch, int64_t step, const EpochStats& st) {
  double sums[1] = {st.loss_sum};
  int64_t counts[2] = {st.correct, st.seen};
  ctrl_->allreduce(sums, 1, dist::ReduceOp::Sum);
  ctrl_->allreduce(counts, 2, dist::ReduceOp::Sum);
  save(last_path_, epoch, step, -1.0, -1.0, sums[0], counts[0], counts[1]);
  // The scalars up to the checkpoint on disk too (a resume continues after it).
  if (tb_) tb_->flush();
}

void Trainer::step_flags(bool nonfinite, bool& preempt, bool& any_nonfinite, StepSums* sums) {
  // Every rank sends all five (the call sites agree on `sums`): one small all-reduce.
  double v[5] = {preemption_signal() != 0 ? 1.0 : 0.0, nonfinite ? 1.0 : 0.0, 0, 0, 0};
  if (sums) {
    v[2] = sums->loss;
    v[3] = sums->correct;
    v[4] = sums->seen;
  }
  ctrl_->allreduce(v, 5, dist::ReduceOp::Sum);
  preempt = v[0] > 0;
  any_nonfinite = v[1] > 0;
  if (sums) *sums = {v[2], v[3], v[4]};
}

void Trainer::sync_buffers() {
  // DDP's broadcast_buffers: without SyncBatchNorm each rank's running statistics
  // drift apart; rank 0's are the model (they are what the checkpoint holds).
  if (env_.world > 1 && !run_.sync_bn) grad_->broadcast_stream_ordered(run_.model->buffers().data(), run_.model->buffers().bytes(), 0);
}

void Trainer::validate(double& val_loss, double& val_acc, double* val_acc5) {
  sync_buffers();
  run_.val_loader->restart(data::shard_exact(run_.val_set->size(), env_.world, env_.rank), 0);
  const ScoreSums s = score(*run_.model, *run_.val_loader, run_.norm, static_cast<float>(o_.label_smoothing));
  // Global and exact: every validation sample counted once across ranks.
  double loss = s.loss;
  int64_t counts[3] = {s.correct, s.count, s.correct_top5};
  ctrl_->allreduce(&loss, 1, dist::ReduceOp::Sum);
  ctrl_->allreduce(counts, 3, dist::ReduceOp::Sum);
  val_loss = counts[1] ? loss / static_cast<double>(counts[1]) : 0.0;
  val_acc = counts[1] ? static_cast<double>(counts[0]) / static_cast<double>(counts[1]) : 0.0;
  if (val_acc5) *val_acc5 = counts[1] ? static_cast<double>(counts[2]) / static_cast<double>(counts[1]) : 0.0;
  run_.model->train(true);
}

// DDP keeps replicas identical; a cheap hash per epoch proves it (a mismatch means a
// broken all-reduce or a rank that took a different path).
void Trainer::check_replicas(int64_t epoch) {
  const dist::ChecksumReport report = dist::compare_across_ranks(*ctrl_, *backend_, run_.model->params());
  if (report.identical) return;
  if (rank0())
    std::fprintf(stderr, "resnet_ddp: error: model replicas diverged after epoch %lld: %s\n",
                 static_cast<long long>(epoch + 1), report.describe().c_str());
  throw CollectiveExit{1};
}

int train_main(const TrainOptions& opts, int& argc, char**& argv) {
  install_preemption_handlers();
  dist::ProcessEnv env;
  try {
    env = dist::init_process(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet_ddp: error: cannot initialise MPI: %s\n", e.what());
    return 1;
  }
  if (const std::string why = dist::launcher_world_mismatch(env.world); !why.empty()) {
    // Every task is a world of its own here; the launcher's task 0 speaks for all.
    if (dist::launcher_rank() == 0) std::fprintf(stderr, "resnet_ddp: error: %s\n", why.c_str());
    std::fflush(stderr);
    try {
      dist::finalize_process();
    } catch (const std::exception&) {
    }
    return 2;
  }
  int code = 0;
  try {
    Trainer t(opts, env);
    code = t.run();
  } catch (const CollectiveExit& e) {
    code = e.code;
  } catch (const std::exception& e) {
    // An error only this rank saw: the others may be waiting in a collective, so
    // end the whole job rather than leave them hanging.
    std::fprintf(stderr, "resnet_ddp: error: rank %d: %s\n", env.rank, e.what());
    std::fflush(stderr);
    dist::abort_job(1);
  }
  if (code == 0 && env.rank == 0) {
    write_out(stdout, "\nCleaning up the distributed environment...\n");
  }
  try {
    dist::finalize_process();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet_ddp: error: rank %d: while shutting down MPI: %s\n", env.rank, e.what());
    return code ? code : 1;
  }
  if (code == 0 && env.rank == 0) {
    write_out(stdout, "Distributed environment has been properly closed\n");
  }
  return code;
}

}  // namespace rd::train
