// The training program: device and communicator set-up, datasets and loaders,
// resume / --init, the epoch loop with exact global metrics, checkpoints,
// preemption and the final evaluation of the best checkpoint.
#include <omp.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string_view>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/data/loader.h"
#include "resnet_ddp/data/sampler.h"
#include "resnet_ddp/data/transforms.h"
#include "resnet_ddp/dist/comm.h"
#include "resnet_ddp/dist/ddp.h"
#include "resnet_ddp/dist/launcher.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/train/checkpoint.h"
#include "resnet_ddp/train/commands.h"
#include "resnet_ddp/train/optimizer.h"
#include "resnet_ddp/train/output_lock.h"
#include "resnet_ddp/train/report.h"
#include "resnet_ddp/train/tensorboard.h"
#include "resnet_ddp/train/train_step.h"
#include "train/dataset_warnings.h"
#include "train/resume_plan.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace rd::train {

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Thrown on every rank once the ranks agreed to stop with this exit status (the
// message was already printed by the rank that owns it).
struct CollectiveExit {
  int code;
};

// The run's live state: rank 0 decides where it starts (fresh, resumed, --init) and
// broadcasts it as raw bytes; the epoch loop then advances it (steps, best accuracy)
// and checkpoints record it.
struct RunState {
  int64_t resumed = 0;         // 1 when continuing from a checkpoint
  int64_t epoch = 0;           // completed epochs
  int64_t step_in_epoch = 0;   // steps already done in the next epoch
  int64_t global_step = 0;
  int64_t optimizer_steps = 0;
  int64_t num_batches_tracked = 0;
  int64_t world_size = 0;      // of the run that wrote the checkpoint
  int64_t batch_size = 0;      // its per-rank batch and accumulation
  int64_t accum_steps = 0;
  int64_t partial_correct = 0;
  int64_t partial_count = 0;
  int64_t scheduler_last_epoch = 0;
  int64_t has_optimizer_state = 0;
  int64_t has_scheduler_state = 0;
  double best_val_acc = -1.0;
  double best_val_loss = 0.0;
  double lr = 0.0;
  double partial_loss_sum = 0.0;
  PlateauState plateau;
  CosineState cosine;
};

struct StepTimes {
  double data = 0, forward = 0, backward = 0, comm = 0, optimizer = 0;
};

// One optimizer step's training sums over all ranks (for the per-step TensorBoard
// scalars). Counts travel as doubles: exact far beyond any batch.
struct StepSums {
  double loss = 0, correct = 0, seen = 0;
};

// One epoch's training on this rank (rank 0's sums also hold the resumed part of an
// interrupted epoch).
struct EpochStats {
  double loss_sum = 0;
  int64_t correct = 0, seen = 0;
  StepTimes times;
  int64_t steps = 0;     // optimizer steps this run took
  double seconds = 0;    // training time, validation excluded
  bool preempted = false;  // the checkpoint is written; the caller exits 0
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

  void setup_device();
  int resolve_threads();
  void lock_output();
  void resolve_resume();
  void setup_data();
  void setup_model();
  void check_output_space();
  void load_start_state();
  void broadcast_start_state(bool rank0_loaded);
  void train_epochs();
  EpochStats train_one_epoch(int64_t epoch);
  void validate(double& val_loss, double& val_acc);
  void sync_buffers();
  void save(const std::string& path, int64_t epoch, int64_t step_in_epoch, double val_loss, double val_acc,
            double partial_loss = 0, int64_t partial_correct = 0, int64_t partial_count = 0);
  void evaluate_best();
  // Per-step agreement: any rank preempted / any rank saw a non-finite loss. `sums`,
  // when given, is summed over the ranks in the same all-reduce (no extra latency).
  void step_flags(bool nonfinite, bool& preempt, bool& any_nonfinite, StepSums* sums = nullptr);
  // Rank 0: the step's scalars (global loss and accuracy, rank 0's timings).
  void log_step(const StepSums& sums, const StepTimes& times, double seconds);
  std::string epoch_tag(int64_t e) const {
    return "(Epoch " + std::to_string(e + 1) + "/" + std::to_string(o_.epochs) + ")";
  }
  CheckpointMeta base_meta() const;

  // A copy: on resume the model-defining flags the user left out come from the checkpoint.
  TrainOptions o_;
  dist::ProcessEnv env_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<dist::Comm> ctrl_;  // host communicator: flags, metrics, metadata
  std::unique_ptr<dist::Comm> grad_;  // gradients and model state (device memory)
  std::unique_ptr<data::Dataset> train_set_, val_set_;
  std::optional<data::TransformPipeline> train_tf_, val_tf_;
  std::unique_ptr<data::Loader> train_loader_, val_loader_;
  std::unique_ptr<data::DistributedSampler> sampler_;
  std::unique_ptr<ResNet> model_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<dist::GradientBucketer> bucketer_;
  std::unique_ptr<dist::SyncBatchNormReducer> sync_bn_;
  std::unique_ptr<TrainStep> step_;
  int64_t skipped_reported_ = 0;  // fp16 updates skipped and already reported
  std::vector<std::string> class_names_;
  std::vector<std::string> checkpoint_classes_;
  std::vector<std::string> args_history_;  // rank 0: the checkpoint's command lines, then this run's  // --eval-only: the evaluated checkpoint's
  const float* norm_mean_ = nullptr;
  const float* norm_std_ = nullptr;
  RunState run_;
  std::string resume_path_;
  std::unique_ptr<MetricsCsv> metrics_;
  std::unique_ptr<Progress> progress_;
  std::unique_ptr<TensorBoardWriter> tb_;  // rank 0 with --tensorboard on; null after it failed to open
  std::string last_path_, best_path_;
  OutputLock lock_;  // rank 0, for the whole run
  std::vector<std::string> resume_changes_;  // rank 0: one line per honoured flag change
  bool honour_lr_ = false;                   // --lr differs from the checkpoint's: restart from it
  bool epochs_changed_ = false;
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

void Trainer::setup_device() {
  ctrl_ = dist::make_mpi_comm(MPI_COMM_WORLD);
  Device device = o_.device;
  if (device == Device::Auto) {
    // One choice for all ranks: CUDA only where every rank has a GPU (mixed devices
    // would start NCCL on some ranks and MPI on others). A GPU job that lands on the
    // CPU is hours slower, so it is said loudly, once, with each node's reason.
    int64_t no_gpu = cuda_backend_available() ? 0 : 1;
    ctrl_->allreduce(&no_gpu, 1, dist::ReduceOp::Sum);
    device = no_gpu == 0 ? Device::Cuda : Device::Cpu;
    if (no_gpu > 0) {
      const std::string reason = cuda_backend_available() ? std::string() : cuda_unavailable_reason();
      std::vector<char> mine(512, 0), all(512 * static_cast<size_t>(env_.world), 0);
      std::snprintf(mine.data(), mine.size(), "%s", reason.empty() ? "" : (env_.node + ": " + reason).c_str());
      ctrl_->allgather(mine.data(), all.data(), mine.size());
      if (rank0()) {
        std::string first;
        for (int r = 0; r < env_.world && first.empty(); ++r) first = all.data() + 512 * static_cast<size_t>(r);
        std::fprintf(stderr,
                     "resnet_ddp: WARNING: --device auto: training on the CPU backend, not a GPU (%lld of %d ranks "
                     "have no usable GPU; %s). Pass --device cuda to make this an error.\n",
                     static_cast<long long>(no_gpu), env_.world, first.c_str());
        std::fflush(stderr);
      }
    }
  }
  int cuda_index = 0;  // this rank's CUDA device (cuda_device_for_rank)
  const int threads = resolve_threads();
  if (o_.amp) o_.precision = amp_precision(device == Device::Cuda);
  const std::string amp_note =
      o_.amp ? "--amp (--precision " + name_of(precision_names(), o_.precision) + " on " + name_of(device_names(), device) + "): " : "";
  agree([&] {
    if (o_.precision == Precision::FP16 && device == Device::Cpu)
      throw UsageError("--precision: fp16 needs a GPU (--device cuda)");
    if (device == Device::Cuda && !cuda_backend_available())
      throw UsageError("--device cuda on node " + env_.node + ": " + cuda_unavailable_reason());
    if (o_.deterministic && device != Device::Cpu)
      throw UsageError("--deterministic: only supported on the CPU backend");
    BackendOptions bo;
    bo.threads = threads;
    bo.precision = o_.precision;
    bo.conv_algo = o_.conv_algo;
    if (device == Device::Cuda) {
      const int visible = cuda_device_count();
      cuda_index = cuda_device_for_rank(env_.local_rank, env_.local_world, visible);
      if (cuda_index < 0)
        throw UsageError("--device cuda: " + std::to_string(env_.local_world) + " ranks on node " + env_.node +
                         " but " + std::to_string(visible) + " GPUs visible (one GPU per rank: start at most " +
                         std::to_string(visible) + " ranks per node, or bind one GPU per task)");
      bo.device_index = cuda_index;
    }
    if (device == Device::Cpu) bo.layout = default_cpu_layout(bo.precision);
    if (o_.deterministic) omp_set_dynamic(0);
    try {
      backend_ = device == Device::Cuda ? make_cuda_backend(bo) : make_cpu_backend(bo);
    } catch (const UsageError& e) {
      if (o_.amp) throw UsageError(amp_note + e.what());
      throw;
    } catch (const Error& e) {
      if (o_.amp) throw UsageError(amp_note + e.what());
      // A precision the backend does not implement is a usage problem (exit 2).
      if (o_.precision != Precision::FP32)
        throw UsageError("--precision " + name_of(precision_names(), o_.precision) + ": " + e.what());
      throw;
    }
  });
#ifdef RESNET_DDP_HAVE_CUDA
  if (backend_->device() == DeviceKind::CUDA) {
    agree([&] { grad_ = dist::make_nccl_comm(MPI_COMM_WORLD, cuda_index); });
  }
#endif
  if (!grad_) grad_ = dist::make_mpi_comm(MPI_COMM_WORLD);
  dist::print_startup_lines(env_, backend_->name());
  // Open MPI's mpirun answers Ctrl-C or a SIGTERM with SIGTERM to the ranks after
  // odls_base_sigkill_timeout seconds and SIGKILL as many seconds later: at its default
  // of 1 s no rank finishes a step and saves. The job scripts raise it; say so here.
  if (env_.world > 1 && std::getenv("OMPI_COMM_WORLD_SIZE")) {
    const char* set = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
    const int grace = set && *set ? std::atoi(set) : 1;
    if (grace <= 1)
      notice("Ctrl-C or a SIGTERM to mpirun kills the ranks " + std::to_string(grace) +
             " s later, before they can save last.h5; export OMPI_MCA_odls_base_sigkill_timeout=10 (as the job "
             "scripts do) so that they checkpoint at the next step and stop");
  }
}

// Compute threads beyond the cores a rank may use (its CPU affinity) only contend: a
// --threads 999 made 1005 threads that did not finish a step in 10 minutes. Each rank
// clamps to its cores; the ranks that share one set of cores (no binding) must fit in it
// together, or every SyncBatchNorm waits for the slowest: one warning line for the job.
int Trainer::resolve_threads() {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  int threads = o_.threads > 0 ? o_.threads : dist::default_threads_per_rank(env_);
  const std::string source = o_.threads > 0                     ? "--threads " + std::to_string(o_.threads)
                             : omp && std::atoi(omp) >= 1 ? std::string("OMP_NUM_THREADS=") + omp
                                                                : std::string();
  const int asked = threads;
  if (threads > env_.cpus_available) threads = env_.cpus_available;
  const bool oversubscribed = static_cast<int64_t>(threads) * env_.mask_sharers > env_.cpus_available;
  // Per rank: asked, cores, sharers, oversubscribed (summed: each rank fills its slot).
  std::vector<int64_t> all(static_cast<size_t>(env_.world) * 4, 0);
  int64_t* mine = all.data() + static_cast<size_t>(env_.rank) * 4;
  mine[0] = asked;
  mine[1] = env_.cpus_available;
  mine[2] = env_.mask_sharers;
  mine[3] = oversubscribed ? 1 : 0;
  ctrl_->allreduce(all.data(), all.size(), dist::ReduceOp::Sum);
  if (!rank0()) return threads;
  int clamped = 0, over = 0, first_clamped = -1, first_over = -1;
  for (int r = 0; r < env_.world; ++r) {
    const int64_t* v = all.data() + static_cast<size_t>(r) * 4;
    if (v[0] > v[1] && clamped++ == 0) first_clamped = r;
    if (v[3] && over++ == 0) first_over = r;
  }
  if (clamped) {
    const int64_t* v = all.data() + static_cast<size_t>(first_clamped) * 4;
    std::fprintf(stderr,
                 "resnet_ddp: warning: %s: more threads than the %lld core(s) rank %d may use (its CPU affinity); "
                 "clamped to %lld%s\n",
                 source.empty() ? ("--threads " + std::to_string(v[0])).c_str() : source.c_str(),
                 static_cast<long long>(v[1]), first_clamped, static_cast<long long>(v[1]),
                 clamped > 1 ? (" (and on " + std::to_string(clamped - 1) + " more rank(s))").c_str() : "");
  }
  if (over) {
    const int64_t* v = all.data() + static_cast<size_t>(first_over) * 4;
    const long long t = std::min(v[0], v[1]);
    std::fprintf(stderr,
                 "resnet_ddp: warning: %lld rank(s) x %lld thread(s) share the %lld core(s) of rank %d's node: "
                 "oversubscribed, every rank will wait for the slowest (use --threads %lld, or fewer ranks per "
                 "node)\n",
                 static_cast<long long>(v[2]), t, static_cast<long long>(v[1]), first_over,
                 std::max<long long>(1, v[1] / std::max<int64_t>(1, v[2])));
  }
  std::fflush(stderr);
  return threads;
}

void Trainer::lock_output() {
  if (o_.eval_only) return;  // reads only
  std::string stale;
  std::string unguarded;
  agree([&] { lock_ = OutputLock::acquire(o_.output_dir, &stale, &unguarded); }, rank0());
  if (!unguarded.empty() && rank0()) std::fprintf(stderr, "resnet_ddp: warning: --output-dir: %s\n", unguarded.c_str());
  if (!stale.empty())
    notice("the previous run in " + o_.output_dir + " (" + stale +
           ") ended without releasing it (crashed or killed); this run holds it now");
}

// Decided on rank 0 before the model exists: which checkpoint a resume reads, the
// model-defining flags it fixes (arch, head, image size, normalisation; an explicit
// conflicting flag is refused, an absent one takes the checkpoint's value), and every
// other flag given that differs from the checkpoint's run (honoured, one line each).
void Trainer::resolve_resume() {
  std::string blob;
  agree(
      [&] {
        const std::string path = o_.resume_checkpoint();
        if (path.empty()) return;
        std::unique_ptr<CheckpointReader> reader;
        try {
          reader = std::make_unique<CheckpointReader>(path, o_.eval_only);
        } catch (const UsageError& e) {
          // Not HDF5, not a checkpoint, damaged: the way out of an unreadable last.h5.
          if (o_.eval_only) throw;
          throw UsageError(e.what() + std::string(kStartFresh));
        }
        const CheckpointReader& ck = *reader;
        const CheckpointMeta& m = ck.meta();
        // Evaluation takes the class names from the model: no Train folder needed.
        if (o_.eval_only) checkpoint_classes_ = m.class_names;
        ResumePlan plan = plan_resume(o_, path, m, [&] { return backend_->device() == DeviceKind::CUDA; });
        honour_lr_ = plan.honour_lr;
        epochs_changed_ = plan.epochs_changed;
        if (!plan.model_settings.empty()) say(plan.model_settings);
        resume_changes_ = std::move(plan.changes);
        if (!o_.eval_only) refuse_new_experiment(o_, path, m, plan.differences);
      },
      rank0());
  if (rank0()) {
    blob = name_of(arch_names(), o_.arch) + '\n' + head_name(o_.head) + '\n' + std::to_string(o_.image_size) + '\n' +
           name_of(normalize_names(), o_.normalize) + '\n' +
           (honour_lr_ ? "1" : "0") + (epochs_changed_ ? "1" : "0");
  }
  int64_t n = static_cast<int64_t>(blob.size());
  ctrl_->broadcast(&n, sizeof n, 0);
  blob.resize(static_cast<size_t>(n));
  ctrl_->broadcast(blob.data(), blob.size(), 0);
  std::vector<std::string> f;
  size_t at = 0;
  for (size_t nl; (nl = blob.find('\n', at)) != std::string::npos; at = nl + 1) f.push_back(blob.substr(at, nl - at));
  f.push_back(blob.substr(at));
  o_.arch = value_of(arch_names(), f.at(0), "--arch");
  o_.head = parse_head(f.at(1));
  o_.image_size = std::stoi(f.at(2));
  o_.normalize = value_of(normalize_names(), f.at(3), "--normalize");
  honour_lr_ = f.at(4)[0] == '1';
  epochs_changed_ = f.at(4)[1] == '1';
  if (o_.eval_only) {
    // NUL-separated: a class name may hold any other byte.
    std::string names;
    if (rank0())
      for (const auto& c : checkpoint_classes_) names += c + '\0';
    int64_t len = static_cast<int64_t>(names.size());
    ctrl_->broadcast(&len, sizeof len, 0);
    names.resize(static_cast<size_t>(len));
    ctrl_->broadcast(names.data(), names.size(), 0);
    checkpoint_classes_.clear();
    for (size_t at = 0, nul; (nul = names.find('\0', at)) != std::string::npos; at = nul + 1)
      checkpoint_classes_.push_back(names.substr(at, nul - at));
  }
}

void Trainer::setup_data() {
  data::ScanOptions scan;
  scan.strict = o_.strict_data;
  scan.jpeg_draft = o_.jpeg_draft ? o_.image_size : 0;
  scan.verify = o_.verify_data;
  scan.threads = std::max(1, std::min(dist::default_threads_per_rank(env_), env_.cpus_available));
  // Each rank decodes 1/world of the files; every rank then drops the same ones.
  scan.shard = env_.rank;
  scan.shards = env_.world;
  scan.combine = [this](std::vector<int64_t>& v) { ctrl_->allreduce(v.data(), v.size(), dist::ReduceOp::Sum); };
  if (rank0()) scan.log = [](const std::string& l) { std::fprintf(stderr, "%s\n", l.c_str()); };
  scan.folders.train = o_.train_split;
  scan.folders.validation = o_.val_split;
  if (o_.eval_only) {
    // Scoring reads only Validation, with the checkpoint's classes, and every image
    // decoded first: an unreadable one is an error (or, --skip-unreadable, a counted
    // skip), never a black stand-in that gets classified.
    scan.class_names = checkpoint_classes_;
    scan.require_every_class = false;
    scan.verify = data::ScanOptions::Verify::Full;
    scan.strict = !o_.skip_unreadable;
    if (!o_.strict_data) {
      scan.strict_flag = "--eval-only";
      scan.strict_hint = " (unreadable images are never scored; --skip-unreadable skips them)";
    }
  }
  agree([&] {
    if (!o_.eval_only) train_set_ = data::open_dataset(o_.data, data::Split::Train, scan);
    val_set_ = data::open_dataset(o_.data, data::Split::Validation, scan);
  });
  class_names_ = train_set_ ? train_set_->class_names() : val_set_->class_names();
  if (rank0())
    for (const auto& w : dataset_warnings(train_set_ ? *train_set_ : *val_set_, o_.image_size))
      std::fprintf(stderr, "resnet_ddp: warning: %s\n", w.c_str());
  data::TransformConfig tc;
  tc.image_size = o_.image_size;
  tc.augment = o_.augment;
  train_tf_.emplace(tc, true);
  data::TransformConfig vc = tc;
  vc.augment = data::TransformConfig::Augment::None;
  val_tf_.emplace(vc, false);
  if (o_.normalize == Normalize::ImageNet) {
    norm_mean_ = data::kImagenetMean;
    norm_std_ = data::kImagenetStd;
  }
  data::LoaderOptions lo;
  lo.batch_size = o_.batch_size;
  lo.workers = o_.workers;
  lo.seed = static_cast<uint64_t>(o_.seed);
  if (backend_->device() == DeviceKind::CPU) lo.nice = 10;
  if (rank0()) lo.log = [](const std::string& l) { std::fprintf(stderr, "%s\n", l.c_str()); };
  if (train_set_) {
    sampler_ = std::make_unique<data::DistributedSampler>(train_set_->size(), env_.world, env_.rank, true,
                                                          static_cast<uint64_t>(o_.seed), false);
    train_loader_ = std::make_unique<data::Loader>(*train_set_, *train_tf_, lo, std::vector<int64_t>{}, 0);
  }
  data::LoaderOptions vo = lo;
  vo.batch_size = o_.effective_val_batch();
  vo.workers = o_.workers;
  val_loader_ = std::make_unique<data::Loader>(*val_set_, *val_tf_, vo, std::vector<int64_t>{}, 0);
}

void Trainer::setup_model() {
  ResNetConfig mc;
  mc.arch = name_of(arch_names(), o_.arch);
  mc.head = o_.head;
  mc.num_classes = static_cast<int>(class_names_.size());
  mc.init_seed = static_cast<uint64_t>(o_.seed);
  agree([&] {
    model_ = std::make_unique<ResNet>(*backend_, mc);
    model_->init_parameters(static_cast<uint64_t>(o_.seed));
  });
  model_->train(true);
  if (o_.sync_bn && env_.world > 1) {
    sync_bn_ = std::make_unique<dist::SyncBatchNormReducer>(*grad_);
    model_->set_batchnorm_reducer(sync_bn_.get());
  }
  OptimizerConfig oc;
  oc.type = o_.optimizer;
  oc.lr = o_.lr;
  oc.weight_decay = o_.weight_decay;
  if (o_.optimizer == OptimizerKind::Sgd) {
    oc.momentum = o_.momentum;
    oc.nesterov = o_.nesterov;
  }
  opt_ = std::make_unique<Optimizer>(*backend_, model_->params(), model_->grads(), oc);
  sched_ = std::make_unique<Scheduler>(o_.scheduler, o_.lr, o_.epochs);
  dist::BucketOptions bo;
  bo.bucket_mb = o_.bucket_mb;
  bo.progress_thread = o_.progress_thread;
  bucketer_ = std::make_unique<dist::GradientBucketer>(*grad_, model_->grads(), bo);
  step_ = std::make_unique<TrainStep>(*model_, *opt_, bucketer_.get(), static_cast<float>(o_.label_smoothing),
                                      o_.precision == Precision::FP16, o_.loss_scale);
  // Fault injection for the fp16 skip path (tests/gpu_emu/train_emu.sh).
  if (const char* at = std::getenv("RD_INJECT_OVERFLOW_STEP"); at && *at) {
    const char* r = std::getenv("RD_INJECT_OVERFLOW_RANK");
    if (env_.rank == (r && *r ? std::atoi(r) : 0)) step_->inject_overflow_at(std::atoll(at));
  }
}

void Trainer::check_output_space() {
  if (o_.eval_only) return;
  agree(
      [&] {
        const double per_copy = static_cast<double>(model_->params().bytes()) * (1.0 + opt_->state_count()) +
                                static_cast<double>(model_->buffers().bytes());
        const double needed = per_copy * 1.05 + 1e6;  // the temp file sits next to the old one
        struct statvfs st {};
        if (::statvfs(o_.output_dir.c_str(), &st) != 0) return;  // probed writable before MPI
        const double free_bytes = static_cast<double>(st.f_bavail) * static_cast<double>(st.f_frsize);
        if (free_bytes < needed) {
          char buf[256];
          std::snprintf(buf, sizeof buf, "only %.1f MB free in '%s', a checkpoint needs about %.1f MB",
                        free_bytes / 1e6, o_.output_dir.c_str(), needed / 1e6);
          throw UsageError(std::string("--output-dir: ") + buf);
        }
      },
      rank0());
}

CheckpointMeta Trainer::base_meta() const {
  CheckpointMeta m;
  m.arch = name_of(arch_names(), o_.arch);
  m.head = head_name(o_.head);
  m.num_classes = static_cast<int64_t>(class_names_.size());
  m.image_size = o_.image_size;
  m.world_size = env_.world;
  m.batch_size = o_.batch_size;
  m.accum_steps = o_.accum_steps;
  m.seed = o_.seed;
  m.args = o_.command_line;
  m.args_history = args_history_;
  m.created_by = std::string("resnet_ddp ") + RESNET_DDP_VERSION;
  m.normalize = name_of(normalize_names(), o_.normalize);
  m.class_names = class_names_;
  return m;
}

void Trainer::load_start_state() {
  last_path_ = (fs::path(o_.output_dir) / "last.h5").string();
  best_path_ = (fs::path(o_.output_dir) / "best_model.h5").string();
  run_.lr = o_.lr;
  bool loaded = false;
  agree(
      [&] {
        const std::string path = o_.resume_checkpoint();
        if (!path.empty()) {
         try {
          // Streamed into the arenas: no host copy of the weights and optimizer state.
          CheckpointReader ck(path, false);
          check_compatible(ck.meta(), *model_, class_names_, path);
          ck.load_model(*model_, false);
          const CheckpointMeta& m = ck.meta();
          run_.resumed = 1;
          run_.epoch = m.epoch;
          run_.step_in_epoch = m.step_in_epoch;
          run_.global_step = m.global_step;
          run_.num_batches_tracked = model_->num_batches_tracked();
          run_.world_size = m.world_size;
          run_.batch_size = m.batch_size;
          run_.accum_steps = m.accum_steps;
          run_.best_val_acc = m.best_val_acc;
          run_.best_val_loss = m.best_val_loss;
          run_.partial_loss_sum = m.partial_train_loss_sum;
          run_.partial_correct = m.partial_train_correct;
          run_.partial_count = m.partial_train_count;
          if (!o_.eval_only) {
            ck.load_optimizer(*model_, *opt_);
            run_.has_optimizer_state = 1;
            run_.optimizer_steps = opt_->steps();
            run_.lr = honour_lr_ ? o_.lr : opt_->lr();
            const SchedulerMeta& sc = m.scheduler;
            if (sc.present && sc.type == sched_->type()) {
              restore_scheduler(sc, *sched_);
              run_.has_scheduler_state = 1;
              run_.scheduler_last_epoch = sched_->last_epoch();
              run_.plateau = sched_->plateau;
              run_.cosine = sched_->cosine;
              if (honour_lr_) run_.cosine.base_lr = o_.lr;
              if (epochs_changed_) run_.cosine.t_max = std::max(o_.epochs, 1);
            } else if (sc.present) {
              notice("checkpoint used --scheduler " + sc.type + "; starting a fresh " + sched_->type() +
                     " schedule");
            }
          }
          resume_path_ = path;
          loaded = true;
          args_history_ = m.args_history.empty() && !m.args.empty() ? std::vector<std::string>{m.args}
                                                                     : m.args_history;
          if (!o_.init.empty()) notice("resuming from " + path + "; --init " + o_.init + " is ignored");
        } catch (const UsageError& e) {
          // A checkpoint that does not fit this run (classes, tensors, optimizer state).
          const std::string what = e.what();
          if (what.find(kStartFresh) != std::string::npos) throw;
          throw UsageError(what + kStartFresh);
         }
        } else if (!o_.init.empty()) {
          CheckpointReader ck(o_.init, true);
          const std::string arch = name_of(arch_names(), o_.arch);
          if (!ck.meta().arch.empty() && ck.meta().arch != arch)
            throw UsageError("--init: '" + o_.init + "' holds " + ck.meta().arch + " weights, this run uses --arch " +
                             arch);
          auto skipped = ck.load_model(*model_, true);
          run_.num_batches_tracked = model_->num_batches_tracked();
          loaded = true;
          if (!skipped.empty())
            notice("--init: the head in " + o_.init + " does not fit " + std::to_string(class_names_.size()) +
                   " classes / --head " + head_name(o_.head) + "; it keeps its fresh initialisation");
          say("Initialised weights from " + o_.init);
        } else if (o_.eval_only) {
          throw UsageError("--eval-only: no checkpoint found (" + last_path_ + " does not exist)");
        }
      },
      rank0());
  broadcast_start_state(loaded);
  args_history_.push_back(o_.command_line);
}

void Trainer::broadcast_start_state(bool rank0_loaded) {
  ctrl_->broadcast(&run_, sizeof run_, 0);
  int64_t loaded = rank0_loaded ? 1 : 0;
  ctrl_->broadcast(&loaded, sizeof loaded, 0);
  // Rank 0's weights everywhere (a fresh init too: one source of truth).
  dist::broadcast_model(*grad_, model_->params(), model_->buffers());
  model_->set_num_batches_tracked(run_.num_batches_tracked);
  if (run_.has_optimizer_state) {
    for (size_t k = 0; k < opt_->state_count(); ++k)
      grad_->broadcast(opt_->state(k), model_->params().bytes(), 0);
    opt_->set_steps(run_.optimizer_steps);
    opt_->set_lr(run_.lr);
  }
  if (run_.has_scheduler_state) {
    sched_->set_last_epoch(run_.scheduler_last_epoch);
    sched_->plateau = run_.plateau;
    sched_->cosine = run_.cosine;
  }
  if (run_.resumed) {
    // A mid-epoch position: the checkpoint's ranks consumed the first
    // step x world x batch x accum samples of the epoch's permutation (each rank takes
    // every world-th one). Any other shape continues at the last step boundary it has
    // inside that prefix, the sampler sharding the rest over this run's ranks; the few
    // samples past that boundary are trained again.
    const int64_t old_world = run_.world_size > 0 ? run_.world_size : env_.world;
    const int64_t old_batch = run_.batch_size > 0 ? run_.batch_size : o_.batch_size;
    const int64_t old_accum = run_.accum_steps > 0 ? run_.accum_steps : o_.accum_steps;
    const int64_t old_global = old_world * old_batch * old_accum;
    const int64_t new_global = static_cast<int64_t>(env_.world) * o_.batch_size * o_.accum_steps;
    const int64_t old_step = run_.step_in_epoch;
    int64_t replayed = 0;
    if (old_step > 0 && old_global != new_global) {
      const int64_t consumed = old_step * old_global;
      run_.step_in_epoch = consumed / new_global;
      replayed = consumed - run_.step_in_epoch * new_global;
      if (run_.step_in_epoch == 0) {
        run_.partial_loss_sum = 0;
        run_.partial_correct = run_.partial_count = 0;
      }
    }
    std::string where = run_.step_in_epoch > 0
                            ? "epoch " + std::to_string(run_.epoch + 1) + " step " + std::to_string(run_.step_in_epoch)
                            : "epoch " + std::to_string(run_.epoch + 1);
    if (!o_.eval_only) say("Resuming from " + resume_path_ + " at " + where);
    for (const auto& line : resume_changes_) say(line);
    if (run_.world_size != env_.world && run_.world_size > 0)
      notice("checkpoint was trained on " + std::to_string(run_.world_size) + " ranks, this run has " +
             std::to_string(env_.world) + ": global batch " + std::to_string(run_.world_size * run_.batch_size) +
             " -> " + std::to_string(env_.world * o_.batch_size) + " (--batch-size is per rank), sampler re-sharded");
    if (old_step > 0 && old_global != new_global && !o_.eval_only)
      notice("epoch " + std::to_string(run_.epoch + 1) + " was stopped after " + std::to_string(old_step) +
             " steps of " + std::to_string(old_global) + " samples; at " + std::to_string(new_global) +
             " samples per step it continues after step " + std::to_string(run_.step_in_epoch) +
             (replayed > 0 ? " and trains " + std::to_string(replayed) + " of its samples again" : std::string()));
  }
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

void Trainer::log_step(const StepSums& s, const StepTimes& t, double seconds) {
  const double n = s.seen > 0 ? s.seen : 1.0;
  tb_->scalars(run_.global_step, {{"step/loss", s.loss / n},
                                  {"step/accuracy", s.correct / n},
                                  {"step/lr", opt_->lr()},
                                  {"step/images_per_s", seconds > 0 ? s.seen / seconds : 0.0},
                                  {"step/time_ms", 1e3 * (t.data + t.forward + t.backward + t.comm + t.optimizer)},
                                  {"step/data_ms", 1e3 * t.data},
                                  {"step/forward_ms", 1e3 * t.forward},
                                  {"step/backward_ms", 1e3 * t.backward},
                                  {"step/comm_ms", 1e3 * t.comm},
                                  {"step/optimizer_ms", 1e3 * t.optimizer}});
}

void Trainer::save(const std::string& path, int64_t epoch, int64_t step_in_epoch, double val_loss, double val_acc,
                   double partial_loss, int64_t partial_correct, int64_t partial_count) {
  // best_model.h5 is for using the model: the weights only (Adam's state would triple
  // it); training resumes from last.h5, which keeps the optimizer and scheduler state.
  const bool weights_only = path == best_path_;
  agree(
      [&] {
        CheckpointMeta m = base_meta();
        m.epoch = epoch;
        m.step_in_epoch = step_in_epoch;
        m.global_step = run_.global_step;
        m.best_val_acc = run_.best_val_acc;
        m.best_val_loss = run_.best_val_loss;
        m.val_acc = val_acc;
        m.val_loss = val_loss;
        m.partial_train_loss_sum = partial_loss;
        m.partial_train_correct = partial_correct;
        m.partial_train_count = partial_count;
        write_checkpoint(path, *model_, weights_only ? nullptr : opt_.get(), weights_only ? nullptr : sched_.get(),
                         m);  // straight from the arenas
      },
      rank0());
}

EpochStats Trainer::train_one_epoch(int64_t epoch) {
  EpochStats st;
  const auto t_start = Clock::now();
  sampler_->set_epoch(epoch);
  std::vector<int64_t> indices = sampler_->indices();
  const int64_t per_step = static_cast<int64_t>(o_.batch_size) * o_.accum_steps;
  const int64_t micro_total = (static_cast<int64_t>(indices.size()) + o_.batch_size - 1) / o_.batch_size;
  int64_t steps_total = (micro_total + o_.accum_steps - 1) / o_.accum_steps;
  if (o_.max_steps > 0) steps_total = std::min(steps_total, o_.max_steps);
  int64_t step = 0;
  if (epoch == run_.epoch && run_.step_in_epoch > 0) {
    // Continue an interrupted epoch: the same permutation, minus what was consumed.
    step = std::min(run_.step_in_epoch, steps_total);
    const size_t skip = std::min(indices.size(), static_cast<size_t>(step * per_step));
    indices.erase(indices.begin(), indices.begin() + static_cast<long>(skip));
    if (rank0()) {
      st.loss_sum += run_.partial_loss_sum;
      st.correct += run_.partial_correct;
      st.seen += run_.partial_count;
    }
  }
  train_loader_->restart(std::move(indices), epoch);
  model_->train(true);
  if (progress_) progress_->start_epoch(epoch + 1, o_.epochs, steps_total);

  StepTimes& times = st.times;
  std::vector<int32_t> preds;
  data::Batch batch;
  double local_loss = 0;  // this rank's running sums for the progress display
  int64_t local_correct = 0, local_seen = 0;
  bool loader_done = false;
  while (step < steps_total && !loader_done) {
    bool nonfinite = false;
    int micro = 0;
    const auto t_step = Clock::now();
    const StepTimes times_before = times;
    StepSums step_sums;
    // A step is accum_steps micro-batches (fewer at the end of the epoch).
    const int64_t remaining_micro = micro_total - step * o_.accum_steps;
    const int group = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(o_.accum_steps, remaining_micro)));
    for (; micro < group; ++micro) {
      auto t0 = Clock::now();
      if (!train_loader_->next(batch)) {
        loader_done = true;
        break;
      }
      Tensor& input = model_->input_buffer(batch.n, batch.h, batch.w);
      backend_->images_u8_to_activation(batch.images, input, norm_mean_, norm_std_);
      if (micro == 0) sync_buffers();
      // No host wait here (review new-9): the upload runs on the copy stream while
      // the host queues the forward behind it; the backend orders the buffers'
      // reuse with events, and the loss read in forward waits for all of it.
      auto t1 = Clock::now();
      times.data += std::chrono::duration<double>(t1 - t0).count();

      preds.resize(static_cast<size_t>(batch.n));
      const double l = step_->forward(input, batch.labels.data(), micro, group, preds.data());
      if (!std::isfinite(l)) nonfinite = true;
      int64_t c = 0;
      for (int i = 0; i < batch.n; ++i) c += preds[static_cast<size_t>(i)] == batch.labels[static_cast<size_t>(i)];
      st.loss_sum += l;
      st.correct += c;
      st.seen += batch.n;
      local_loss += l;
      local_correct += c;
      local_seen += batch.n;
      step_sums.loss += l;
      step_sums.correct += static_cast<double>(c);
      step_sums.seen += batch.n;
      times.forward += seconds_since(t1);

      const TrainStep::Seconds s = step_->backward_and_reduce();
      times.backward += s.backward;
      times.comm += s.comm;
    }
    if (micro < group) {
      // The loader ran dry inside a group: every rank has the same batch count,
      // so all ranks get here together. Finish the partial group's communication.
      if (micro == 0) break;
      step_->reduce_partial_group();
    }
    bool preempt = false, any_nonfinite = false;
    step_flags(nonfinite, preempt, any_nonfinite, &step_sums);
    auto t5 = Clock::now();
    if (any_nonfinite && !step_->scaler().enabled()) {
      // Under fp16 the loss scaler skips the step instead (AMP's GradScaler).
      if (rank0())
        std::fprintf(stderr,
                     "resnet_ddp: error: the training loss became NaN or Inf at epoch %lld step %lld (global step "
                     "%lld); stopping without saving. Try a lower --lr, --precision fp32, or check the data.\n",
                     static_cast<long long>(epoch + 1), static_cast<long long>(step + 1),
                     static_cast<long long>(run_.global_step + 1));
      throw CollectiveExit{1};
    }
    step_->update(any_nonfinite);
    backend_->synchronize();
    times.optimizer += seconds_since(t5);
    ++step;
    ++run_.global_step;
    ++st.steps;
    if (tb_) {
      const StepTimes d{times.data - times_before.data, times.forward - times_before.forward,
                        times.backward - times_before.backward, times.comm - times_before.comm,
                        times.optimizer - times_before.optimizer};
      log_step(step_sums, d, seconds_since(t_step));
    }
    if (progress_) {
      const double elapsed = seconds_since(t_start);
      progress_->step(step, local_seen ? local_loss / static_cast<double>(local_seen) : 0.0,
                      local_seen ? static_cast<double>(local_correct) / static_cast<double>(local_seen) : 0.0,
                      elapsed > 0 ? static_cast<double>(local_seen) * env_.world / elapsed : 0.0);
    }
    const bool periodic = o_.checkpoint_every > 0 && run_.global_step % o_.checkpoint_every == 0 &&
                          step < steps_total && !loader_done;
    if (preempt || periodic) {
      // The periodic save is the preemption checkpoint without stopping: a crash
      // loses at most N steps.
      if (preempt && progress_) progress_->end_epoch();
      if (preempt) st.seconds += seconds_since(t_start);
      double sums[1] = {st.loss_sum};
      int64_t counts[2] = {st.correct, st.seen};
      ctrl_->allreduce(sums, 1, dist::ReduceOp::Sum);
      ctrl_->allreduce(counts, 2, dist::ReduceOp::Sum);
      save(last_path_, epoch, step, -1.0, -1.0, sums[0], counts[0], counts[1]);
      // The scalars up to the checkpoint on disk too (a resume continues after it).
      if (tb_) tb_->flush();
    }
    if (preempt) {
      say("Preempted at epoch " + std::to_string(epoch + 1) + " step " + std::to_string(step) +
          "; checkpoint saved to " + fs::absolute(last_path_).string());
      st.preempted = true;
      return st;
    }
  }
  if (progress_) progress_->end_epoch();
  st.seconds += seconds_since(t_start);
  return st;
}

void Trainer::sync_buffers() {
  // DDP's broadcast_buffers: without SyncBatchNorm each rank's running statistics
  // drift apart; rank 0's are the model (they are what the checkpoint holds).
  if (env_.world > 1 && !sync_bn_) grad_->broadcast(model_->buffers().data(), model_->buffers().bytes(), 0);
}

void Trainer::validate(double& val_loss, double& val_acc) {
  sync_buffers();
  model_->train(false);
  val_loader_->restart(data::shard_exact(val_set_->size(), env_.world, env_.rank), 0);
  std::vector<int32_t> preds;
  data::Batch batch;
  double loss = 0;
  int64_t counts[2] = {0, 0};
  while (val_loader_->next(batch)) {
    Tensor& input = model_->input_buffer(batch.n, batch.h, batch.w);
    backend_->images_u8_to_activation(batch.images, input, norm_mean_, norm_std_);
    const Tensor& logits = model_->forward(input);
    preds.resize(static_cast<size_t>(batch.n));
    loss += backend_->softmax_xent(logits, batch.labels.data(), static_cast<float>(o_.label_smoothing), 1.f, nullptr,
                                   preds.data());
    for (int i = 0; i < batch.n; ++i) counts[0] += preds[static_cast<size_t>(i)] == batch.labels[static_cast<size_t>(i)];
    counts[1] += batch.n;
  }
  // Global and exact: every validation sample counted once across ranks.
  ctrl_->allreduce(&loss, 1, dist::ReduceOp::Sum);
  ctrl_->allreduce(counts, 2, dist::ReduceOp::Sum);
  val_loss = counts[1] ? loss / static_cast<double>(counts[1]) : 0.0;
  val_acc = counts[1] ? static_cast<double>(counts[0]) / static_cast<double>(counts[1]) : 0.0;
  model_->train(true);
}

void Trainer::evaluate_best() {
  int64_t have_best = 0;
  if (rank0()) {
    std::error_code ec;
    have_best = fs::exists(best_path_, ec) ? 1 : 0;
  }
  ctrl_->broadcast(&have_best, sizeof have_best, 0);
  if (!have_best) return;
  // Training is over: its loader threads and batches and the optimizer state go
  // before the evaluation, which needs only the model and the validation loader.
  train_loader_.reset();
  opt_.reset();
  // Weights only, straight into the arenas: a host copy of the file (weights and
  // Adam state, 3x the parameters) made this the peak of the whole run.
  agree(
      [&] {
        CheckpointReader ck(best_path_, false);
        check_compatible(ck.meta(), *model_, class_names_, best_path_);
        ck.load_model(*model_, false);
      },
      rank0());
  int64_t nbt = model_->num_batches_tracked();
  ctrl_->broadcast(&nbt, sizeof nbt, 0);
  dist::broadcast_model(*grad_, model_->params(), model_->buffers());
  model_->set_num_batches_tracked(nbt);
  double loss = 0, acc = 0;
  validate(loss, acc);
  say("Best model (val loss: " + py_float(loss) + ", val accuracy: " + py_float(acc) + ") has been saved to " +
      fs::absolute(best_path_).string());
}

void Trainer::train_epochs() {
  agree(
      [&] { metrics_ = std::make_unique<MetricsCsv>(o_.metrics_path(), run_.resumed != 0, run_.epoch + 1); },
      rank0());
  if (rank0()) progress_ = std::make_unique<Progress>(o_.progress, o_.log_every);
  // A new event file per run; its steps continue the checkpoint's global step.
  if (rank0() && o_.tensorboard && run_.epoch < o_.epochs)
    tb_ = TensorBoardWriter::create(o_.output_dir, run_.global_step + 1);
  say("");
  for (int64_t epoch = run_.epoch; epoch < o_.epochs; ++epoch) {
    const auto t0 = Clock::now();
    const double lr_used = opt_->lr();
    const EpochStats st = train_one_epoch(epoch);
    if (st.preempted) throw CollectiveExit{0};
    const StepTimes& times = st.times;
    const double train_seconds = st.seconds;
    const int64_t steps_done = st.steps;
    run_.step_in_epoch = 0;
    double sums[1] = {st.loss_sum};
    int64_t counts[2] = {st.correct, st.seen};
    ctrl_->allreduce(sums, 1, dist::ReduceOp::Sum);
    ctrl_->allreduce(counts, 2, dist::ReduceOp::Sum);
    const double train_loss = counts[1] ? sums[0] / static_cast<double>(counts[1]) : 0.0;
    const double train_acc = counts[1] ? static_cast<double>(counts[0]) / static_cast<double>(counts[1]) : 0.0;
    double val_loss = 0, val_acc = 0;
    validate(val_loss, val_acc);
    const double epoch_seconds = seconds_since(t0);

    const bool improved = val_acc > run_.best_val_acc;
    if (improved) {
      run_.best_val_acc = val_acc;
      run_.best_val_loss = val_loss;
    }
    opt_->set_lr(sched_->step(opt_->lr(), val_loss));

    const std::string tag = epoch_tag(epoch);
    say(tag + " Time: " + std::to_string(static_cast<long long>(epoch_seconds)) + "s");
    say(tag + " Average train loss: " + py_float(train_loss) + ", Average train accuracy: " + py_float(train_acc));
    say(tag + " Val loss: " + py_float(val_loss) + ", Val accuracy: " + py_float(val_acc));
    say(tag + " Current best val acc: " + py_float(run_.best_val_acc));
    // Images this epoch actually trained on (all ranks), over the training time.
    const double images = static_cast<double>(counts[1]) - (epoch == run_.epoch ? static_cast<double>(run_.partial_count) : 0.0);
    const double ips = train_seconds > 0 ? images / train_seconds : 0.0;
    const double steps = std::max<int64_t>(steps_done, 1);
    char buf[512];
    std::snprintf(buf, sizeof buf, "%s Throughput: %.1f img/s total, %.1f img/s per rank (%d ranks)", tag.c_str(), ips,
                  ips / env_.world, env_.world);
    say(buf);
    std::snprintf(buf, sizeof buf,
                  "%s Step time: %.1f ms = data wait %.1f + forward %.1f + backward %.1f + exposed comm %.1f + "
                  "optimizer %.1f ms",
                  tag.c_str(), 1e3 * (times.data + times.forward + times.backward + times.comm + times.optimizer) / steps,
                  1e3 * times.data / steps, 1e3 * times.forward / steps, 1e3 * times.backward / steps,
                  1e3 * times.comm / steps, 1e3 * times.optimizer / steps);
    say(buf);
    if (step_->scaler().enabled()) {
      // Every rank skips the same updates (the all-reduce spreads a non-finite value).
      const int64_t skipped = step_->skipped_steps() - skipped_reported_;
      skipped_reported_ = step_->skipped_steps();
      if (skipped > 0)
        say(tag + " fp16: " + std::to_string(skipped) + (skipped == 1 ? " step" : " steps") +
            " skipped for non-finite gradients (loss scale now " + py_float(step_->scaler().scale()) + ")");
    }
    say("");
    say("");

    if (improved) save(best_path_, epoch + 1, 0, val_loss, val_acc);
    save(last_path_, epoch + 1, 0, val_loss, val_acc);
    {
      EpochMetrics m;
      m.epoch = epoch + 1;
      m.time_s = epoch_seconds;
      m.train_loss = train_loss;
      m.train_acc = train_acc;
      m.val_loss = val_loss;
      m.val_acc = val_acc;
      m.best_val_acc = run_.best_val_acc;
      m.lr = lr_used;
      m.images_per_s = ips;
      m.images_per_s_per_rank = ips / env_.world;
      m.data_ms = 1e3 * times.data / steps;
      m.forward_ms = 1e3 * times.forward / steps;
      m.backward_ms = 1e3 * times.backward / steps;
      m.comm_ms = 1e3 * times.comm / steps;
      m.optimizer_ms = 1e3 * times.optimizer / steps;
      m.world_size = env_.world;
      m.global_step = run_.global_step;
      if (metrics_) {
        try {
          metrics_->write(m);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "resnet_ddp: warning: %s\n", e.what());
        }
      }
      if (tb_) {
        // The metrics.csv columns under epoch/, at the epoch's last global step (less the
        // two that are not measurements).
        std::vector<std::pair<std::string, double>> scalars;
        for (const auto& c : m.columns())
          if (std::string_view(c.name) != "world_size" && std::string_view(c.name) != "global_step")
            scalars.emplace_back(std::string("epoch/") + c.name, c.value);
        tb_->scalars(m.global_step, scalars);
        tb_->flush();
      }
    }
    run_.partial_count = 0;
    // DDP keeps replicas identical; a cheap hash per epoch proves it (a mismatch
    // means a broken all-reduce or a rank that took a different path).
    const dist::ChecksumReport sums_report = dist::compare_across_ranks(*ctrl_, *backend_, model_->params());
    if (!sums_report.identical) {
      if (rank0())
        std::fprintf(stderr, "resnet_ddp: error: model replicas diverged after epoch %lld: %s\n",
                     static_cast<long long>(epoch + 1), sums_report.describe().c_str());
      throw CollectiveExit{1};
    }
    bool preempt = false, unused = false;
    step_flags(false, preempt, unused);
    if (preempt && epoch + 1 < o_.epochs) {
      say("Preempted at epoch " + std::to_string(epoch + 1) + " step " + std::to_string(steps_done) +
          "; checkpoint saved to " + fs::absolute(last_path_).string());
      throw CollectiveExit{0};
    }
  }
}

int Trainer::run() {
  setup_device();
  lock_output();
  resolve_resume();
  setup_data();
  if (train_set_)
    say("Train set size: " + std::to_string(train_set_->size()) +
        ", Validation set size: " + std::to_string(val_set_->size()));
  else
    say("Validation set size: " + std::to_string(val_set_->size()));
  setup_model();
  check_output_space();
  load_start_state();
  if (o_.eval_only) {
    double loss = 0, acc = 0;
    validate(loss, acc);
    say("");
    const size_t unreadable = val_set_->unreadable_files();
    say("Evaluated " + resume_path_ + (resume_path_.empty() ? o_.init : "") + " on " +
        std::to_string(val_set_->size()) + " validation images" +
        (unreadable ? " (" + std::to_string(unreadable) + " unreadable file(s) skipped, not scored)" : ""));
    say("Val loss: " + py_float(loss) + ", Val accuracy: " + py_float(acc));
    return 0;
  }
  if (rank0()) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "Model: %s (%s head, %zu classes, %.2fM parameters), %d rank(s) x batch %d x accum %d = global "
                  "batch %d, %s lr %s, scheduler %s",
                  name_of(arch_names(), o_.arch).c_str(), head_name(o_.head), class_names_.size(), model_->num_parameters() / 1e6, env_.world,
                  o_.batch_size, o_.accum_steps, env_.world * o_.batch_size * o_.accum_steps, opt_->type_name().c_str(),
                  py_float(opt_->lr()).c_str(), sched_->type().c_str());
    say(buf);
  }
  const bool nothing_to_train = run_.epoch >= o_.epochs;
  if (nothing_to_train) notice("the checkpoint already completed " + std::to_string(run_.epoch) +
                                " epoch(s) of --epochs " + std::to_string(o_.epochs) + "; nothing to train");
  train_epochs();
  // "Best model ... has been saved" would claim this run produced it.
  if (!nothing_to_train) evaluate_best();
  return 0;
}

}  // namespace

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
