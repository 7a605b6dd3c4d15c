// The training program's one object, private to src/train. Its member functions live
// by subject: trainer.cpp (run and the epoch loop), trainer_setup.cpp (device, threads,
// output folder, data, model), trainer_checkpoint.cpp (resume, start state, saves: every
// checkpoint read and write of a run) and trainer_report.cpp (what each step and epoch
// print and record).
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/data/loader.h"
#include "resnet_ddp/data/sampler.h"
#include "resnet_ddp/data/transforms.h"
#include "resnet_ddp/dist/comm.h"
#include "resnet_ddp/dist/ddp.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/train/cli.h"
#include "resnet_ddp/train/optimizer.h"
#include "resnet_ddp/train/scheduler.h"
#include "resnet_ddp/train/model_ema.h"
#include "resnet_ddp/train/output_lock.h"
#include "resnet_ddp/train/report.h"
#include "resnet_ddp/train/tensorboard.h"
#include "resnet_ddp/train/mixing.h"
#include "resnet_ddp/train/train_step.h"
#include "train/evaluate.h"
#include "train/lr_scaling.h"
#include "train/resume_plan.h"
#include "train/train_state.h"

namespace rd::train {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Thrown on every rank once the ranks agreed to stop with this exit status (the
// message was already printed by the rank that owns it).
struct CollectiveExit {
  int code;
};

struct StepTimes {
  double data = 0, forward = 0, backward = 0, comm = 0, optimizer = 0;
  double total() const { return data + forward + backward + comm + optimizer; }
  StepTimes minus(const StepTimes& b) const {
    return {data - b.data, forward - b.forward, backward - b.backward, comm - b.comm, optimizer - b.optimizer};
  }
};

// Training sums (one step's over all ranks for the per-step TensorBoard scalars, or one
// rank's running sums). Counts travel as doubles: exact far beyond any batch.
struct StepSums {
  double loss = 0, correct = 0, seen = 0;
  void add(double l, int64_t c, int n) {
    loss += l;
    correct += static_cast<double>(c);
    seen += n;
  }
};

// One epoch's training on this rank (rank 0's sums also hold the resumed part of an
// interrupted epoch).
struct EpochStats {
  double loss_sum = 0;
  int64_t correct = 0, seen = 0;
  StepTimes times;
  int64_t steps = 0;       // optimizer steps this run took
  double seconds = 0;      // training time, validation excluded
  // The run's first step (cuDNN planning, first allocations) when it fell in this epoch:
  // its seconds and this rank's images, left out of the steady-state throughput.
  double warmup_seconds = 0;
  int64_t warmup_seen = 0;
  bool preempted = false;  // the checkpoint is written; the caller exits 0
};

// An epoch's global results, as the summary lines and metrics.csv report them.
struct EpochResult {
  int64_t epoch = 0;  // 0-based
  double lr_used = 0;
  double train_loss = 0, train_acc = 0, val_loss = 0, val_acc = 0;
  double val_acc5 = 0;  // top-5
  double images = 0;  // trained this epoch by all ranks (a resumed part excluded)
  double warmup_images = 0;  // of them, in the run's first step (all ranks)
  double ema_val_loss = -1, ema_val_acc = -1, ema_val_acc5 = -1;  // --model-ema: the average's validation
  double seconds = 0;  // the whole epoch, validation included
};

// What set-up builds for a run (Trainer::setup_parts), as one value: the data, the model
// and what trains it. Heap parts throughout: the loaders hold references to the sets and
// transforms, the step to the model and optimizer, so the value moves without breaking them.
struct RunParts {
  std::unique_ptr<data::Dataset> train_set, val_set;  // no train_set under --eval-only
  std::unique_ptr<data::TransformPipeline> train_tf, val_tf;
  std::unique_ptr<data::Loader> train_loader, val_loader;
  std::unique_ptr<data::EpochSampler> sampler;  // DistributedSampler, or RASampler (--ra-sampler)
  std::vector<std::string> class_names;
  Normalization norm;
  BatchMixer mixer;  // --mixup-alpha, --cutmix-alpha
  std::unique_ptr<ResNet> model;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<Scheduler> sched;
  std::unique_ptr<ModelEma> ema;                        // --model-ema
  std::unique_ptr<dist::GradientBucketer> bucketer;     // several ranks
  std::unique_ptr<dist::SyncBatchNormReducer> sync_bn;  // --sync-bn, several ranks
  std::unique_ptr<TrainStep> step;
};

class Trainer {
 public:
  Trainer(const TrainOptions& opts, const dist::ProcessEnv& env) : o_(opts), env_(env) {}
  int run();

 private:
  bool rank0() const { return env_.rank == 0; }
  void say(const std::string& line) const {
    if (!rank0()) return;
    write_out(stdout, line + "\n");
  }
  void notice(const std::string& line) const { say("Notice: " + line); }

  // Runs `fn` on the ranks where `participate` is true; if it throws anywhere,
  // every rank learns it and leaves with the same status. The failing rank prints
  // (rank 0's message wins when rank 0 failed too, so one message appears).
  template <class F>
  void agree(F&& fn, bool participate = true);

  // trainer_setup.cpp
  void setup_device();
  void make_backend(Device device, int threads, const std::string& amp_note, int& cuda_index);
  Device choose_device();
  int resolve_threads();
  void lock_output();
  // The run's parts; prints, between data and model, the recipe, `lr`'s lines and the set sizes.
  RunParts setup_parts(const LrChoice& lr);
  void setup_data(RunParts& p);
  void setup_model(RunParts& p);
  void check_output_space();

  // trainer_checkpoint.cpp
  void resolve_resume();
  void load_start_state();
  void load_checkpoint();
  void load_init();
  void broadcast_weights();
  void apply_start_state();
  void save(const std::string& path, int64_t epoch, int64_t step_in_epoch, double val_loss, double val_acc,
            double partial_loss = 0, int64_t partial_correct = 0, int64_t partial_count = 0);
  io::CheckpointMeta base_meta() const;
  void evaluate_best();

  // trainer.cpp
  void train_epochs();
  // One epoch's loop state on this rank.
  struct EpochRun {
    int64_t epoch = 0, micro_total = 0, steps_total = 0, first_step = 0;
    Clock::time_point started;
    data::Batch batch;  // kept across the epoch's steps: the loader refills it
    EpochStats stats;
    StepSums local;     // this rank's running sums for the progress display
    bool loader_done = false;
  };
  void start_epoch(EpochRun& e);
  EpochStats train_one_epoch(int64_t epoch);
  // One optimizer step (step 0-based in the epoch); returns the micro-batches the loader
  // had (0: none, the epoch is over).
  int train_step(EpochRun& e, int64_t step);
  // The step split's timing marks (Backend::timing_mark): two banks, steps alternate, so a
  // step's marks are read one step late. Per micro-batch: forward start, loss done,
  // backward done, buckets done; then the optimizer's start and end.
  enum StepMark { kForward = 0, kLoss = 1, kBackward = 2, kBuckets = 3 };
  int timing_mark_index(int bank, int micro, int mark) const { return bank * (4 * o_.accum_steps + 2) + 4 * micro + mark; }
  int optimizer_mark_index(int bank, int end) const { return bank * (4 * o_.accum_steps + 2) + 4 * o_.accum_steps + end; }


  // Each step's training sums stay on the device (Backend::softmax_xent_sums) and come
  // back through a queued copy one step late, so the step itself never waits for its
  // loss. The ranks agree on them (and on a stop signal and a non-finite loss) in one
  // all-reduce every agree_every_ steps; with one rank there is nothing to agree on.
  struct StepRecord {
    int64_t epoch = 0, step = 0, global_step = 0;  // step: 0-based; global_step: after its update
    double sums[3] = {0, 0, 0};                    // loss, correct, non-finite (this rank's)
    double seen = 0, lr = 0, seconds = 0, epoch_seconds = 0;
    StepTimes times;  // data: the host's; the rest from the marks once read
    int bank = 0, micro = 0;
    std::vector<double> host_comm;
    bool read = false;  // sums and marks arrived
  };
  static constexpr int kSumSlots = 2;
  std::shared_ptr<void> step_sums_device_;  // kSumSlots x 3 doubles
  std::deque<StepRecord> records_;          // steps not yet agreed on, oldest first
  int64_t agree_every_ = 1;                 // steps between agreements (several ranks)
  int64_t steps_since_agree_ = 0;
  Clock::time_point agreed_at_{};
  // The step's zeroed device sums.
  double* step_sums_slot(int64_t step);
  // The stop line's position and the step at which the ranks would stop.
  void announce_stop_point(int64_t epoch, int64_t step, int64_t steps_total);
  // Records a finished step (r.step 0-based) of `micro` micro-batches and queues its
  // device sums' read-back.
  void queue_step(StepRecord r, int micro, const double* device_sums, EpochRun& e);
  // The records whose sums arrived: into the epoch's and the progress display's sums
  // (one rank: also their scalars and the non-finite check).
  void take_read_steps(EpochStats& st, StepSums& local);
  // The device's part of a step's split from its marks (the data wait is the host's).
  void read_step_times(StepRecord& r);
  // Waits for every queued sum, then (several ranks) agrees on them in one all-reduce:
  // global step scalars, a non-finite loss (fp32: stops), a stop signal (`preempt`).
  void agree_on_steps(EpochStats& st, StepSums& local, bool& preempt);
  // fp32: a non-finite loss at record r (summed over the ranks) ends the run.
  void stop_on_nonfinite(const StepRecord& r, double nonfinite);
  // Seconds within which every rank must see a stop signal (a quarter of the kill grace).
  double stop_latency_budget_s() const;
  void save_mid_epoch(int64_t epoch, int64_t step, const EpochStats& st);
  // val_acc5 (when given): top-5 accuracy, exact counts summed over ranks like top-1.
  void validate(double& val_loss, double& val_acc, double* val_acc5 = nullptr);
  void sync_buffers();
  void check_replicas(int64_t epoch);
  // Per-step agreement: any rank preempted / any rank saw a non-finite loss. `sums`,
  // when given, is summed over the ranks in the same all-reduce (no extra latency).
  void step_flags(bool nonfinite, bool& preempt, bool& any_nonfinite, StepSums* sums = nullptr);
  void evaluate_only();

  // trainer_stop.cpp: what a stop signal prints at once (report.h set_stop_notice), and
  // the notice when a step is too long for Open MPI's kill grace.
  void stop_notice_at(const std::string& position, const std::string& action);
  void checkpoint_saved(const std::string& path, int64_t epochs_done, int64_t step_in_epoch);
  void measured_step(double seconds);
  std::string stop_position_;  // "epoch 3 step 8 of 16"
  std::string stop_action_;    // what the ranks do before stopping
  // What the stop line says of resuming: from which checkpoint, where (set at each save).
  std::string resume_text_ = "there is no checkpoint yet: the same command starts over";
  double step_seconds_ = 0;    // the run's second step (the first is warm-up); 0 until measured
  int64_t steps_this_run_ = 0;
  int inject_step_delay_ms_ = 0;  // RD_INJECT_STEP_DELAY_MS: a step this much longer (tests of long steps)

  // trainer_report.cpp
  void open_reports();
  void report_start();
  // Rank 0: the step's TensorBoard scalars (global loss and accuracy, rank 0's timings).
  void report_step_scalars(const StepRecord& r, const double* global_sums);
  // Rank 0: the progress display after step `step` (1-based), from this rank's running sums.
  void report_progress(int64_t step, const StepSums& local, double epoch_seconds);
  // The epoch's summary lines; returns its metrics.csv row.
  EpochMetrics report_epoch(const EpochResult& r, const EpochStats& st);
  // The row in metrics.csv and under TensorBoard's epoch/ (after the checkpoints).
  void record_epoch(const EpochMetrics& m);
  std::string epoch_tag(int64_t e) const {
    return "(Epoch " + std::to_string(e + 1) + "/" + std::to_string(o_.epochs) + ")";
  }

  // A copy: on resume the model-defining flags the user left out come from the checkpoint.
  TrainOptions o_;
  dist::ProcessEnv env_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<dist::Comm> ctrl_;  // host communicator: flags, metrics, metadata
  std::unique_ptr<dist::Comm> grad_;  // gradients and model state (device memory)
  RunParts run_;
  int64_t skipped_reported_ = 0;  // fp16 updates skipped and already reported
  int64_t graph_replays_reported_ = 0, graph_recordings_reported_ = 0;  // --cuda-graphs, likewise
  std::vector<std::string> args_history_;  // rank 0: the checkpoint's command lines, then this run's
  ResumePlan plan_;    // decided on rank 0, the same value on every rank
  TrainState state_;   // the run's live state: starts as plan_.state
  std::unique_ptr<MetricsCsv> metrics_;
  std::unique_ptr<Progress> progress_;
  std::unique_ptr<TensorBoardWriter> tb_;  // rank 0 with --tensorboard on; null after it failed to open
  std::string last_path_, best_path_;
  OutputLock lock_;  // rank 0, for the whole run
};

template <class F>
void Trainer::agree(F&& fn, bool participate) {
  int code = 0;
  std::string msg;
  if (participate) {
    try {
      fn();
    } catch (const UsageError& e) {
      code = 2;
      msg = e.what();
    } catch (const std::exception& e) {
      code = 1;
      msg = e.what();
    }
  }
  int64_t votes[3] = {code == 2, code == 1, rank0() && code != 0};
  ctrl_->allreduce(votes, 3, dist::ReduceOp::Sum);
  if (votes[0] + votes[1] == 0) return;
  if (code != 0 && (rank0() || votes[2] == 0)) {
    std::string prefix = rank0() ? "" : "rank " + std::to_string(env_.rank) + ": ";
    std::fprintf(stderr, "resnet_ddp: error: %s%s\n", prefix.c_str(), msg.c_str());
    std::fflush(stderr);
  }
  throw CollectiveExit{votes[0] > 0 ? 2 : 1};
}

}  // namespace rd::train
