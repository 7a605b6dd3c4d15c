// The trainer's set-up before the first step: device and backend, compute threads, the
// output folder's lock and free space, datasets and loaders, model and optimizer.
#include <omp.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "resnet_ddp/backend/nccl_comm.h"
#include "resnet_ddp/train/recipes.h"
#include "train/dataset_warnings.h"
#include "train/trainer.h"

namespace rd::train {

namespace {
// Issue #27's optimizers: the reference recipes' hyperparameters (torchvision's train.py
// for rmsprop; timm's defaults for lars and lamb; torch.optim's for adamw) and the
// param-group decays.
void set_optim_config(OptimizerConfig& oc, const TrainOptions& o) {
  oc.norm_weight_decay = o.norm_weight_decay;
  oc.bias_weight_decay = o.bias_weight_decay;
  if (o.optimizer == OptimizerKind::RmsProp) oc.momentum = o.momentum, oc.eps = 0.0316, oc.alpha = 0.9;
  if (o.optimizer == OptimizerKind::Lars) oc.momentum = o.momentum, oc.nesterov = o.nesterov, oc.eps = 1e-8;
  if (o.optimizer == OptimizerKind::Lamb) oc.eps = 1e-6, oc.max_grad_norm = 1.0;
}

// Loader threads per rank. On the GPU the loader is the rank's CPU work: by default it
// takes the cores the rank may use (its affinity, split among ranks bound to the same
// cores) less the one the launching thread keeps. On the CPU the compute threads hold
// the cores, so --workers' default stands there. A GPU rank whose loader and launching
// thread need more cores than it may use time-slices them and the GPU waits for data:
// one warning for the job, naming both numbers and the fix (all ranks call this).
int loader_workers(const TrainOptions& o, const dist::ProcessEnv& env, dist::Comm& ctrl, bool cuda) {
  if (!cuda) return o.workers;
  const bool given = o.was_given("--workers");
  const int workers = given ? o.workers : data::loader_workers_for_cores(env.cpus_available, env.mask_sharers);
  // Per rank: threads needed, cores allowed (summed: each rank fills its slot).
  std::vector<int64_t> all(static_cast<size_t>(env.world) * 2, 0);
  all[static_cast<size_t>(env.rank) * 2] = workers + 1;
  all[static_cast<size_t>(env.rank) * 2 + 1] = env.cpus_per_rank;
  ctrl.allreduce(all.data(), all.size(), dist::ReduceOp::Sum);
  if (env.rank != 0) return workers;
  int short_ranks = 0, first = -1;
  for (int r = 0; r < env.world; ++r)
    if (all[static_cast<size_t>(r) * 2] > all[static_cast<size_t>(r) * 2 + 1] && short_ranks++ == 0) first = r;
  if (short_ranks) {
    const long long need = all[static_cast<size_t>(first) * 2], cores = all[static_cast<size_t>(first) * 2 + 1];
    const std::string what = given ? "--workers " + std::to_string(workers)
                                   : "the default of " + std::to_string(workers) + " loader thread(s)";
    std::fprintf(stderr,
                 "resnet_ddp: warning: %s + the launching thread need %lld cores, but rank %d may use %lld (its CPU "
                 "affinity)%s: they time-slice and the GPU waits for data; give each rank its own cores (mpirun "
                 "--map-by ppr:RANKS:socket:PE=CORES, or --bind-to none; srun --cpus-per-task=CORES)%s\n",
                 what.c_str(), need, first, cores,
                 short_ranks > 1 ? (" (and " + std::to_string(short_ranks - 1) + " more rank(s))").c_str() : "",
                 given && cores >= 2 ? (" or use --workers " + std::to_string(cores - 1)).c_str() : "");
    std::fflush(stderr);
  }
  return workers;
}
}  // namespace

namespace {
// The head of a reason for the one-line warning: up to its first ';' (or a ':' outside
// parentheses, before the advice), parentheses closed. The full text is --device cuda's error.
std::string reason_head(const std::string& reason) {
  int depth = 0;
  size_t end = reason.size();
  for (size_t i = 0; i < reason.size() && end == reason.size(); ++i) {
    const char c = reason[i];
    if (c == '(') ++depth;
    else if (c == ')') --depth;
    else if (c == ';' || (c == ':' && depth == 0)) end = i;
  }
  return reason.substr(0, end) + std::string(static_cast<size_t>(std::max(depth, 0)), ')');
}
}  // namespace

// One choice for all ranks: CUDA only where every rank has a GPU (mixed devices would
// start NCCL on some ranks and MPI on others). A GPU job that lands on the CPU is hours
// slower, so it is said once, in one line: the first such node and why, and how to
// settle it (--device cpu: no warning; --device cuda: an error with the full reason).
Device Trainer::choose_device() {
  if (o_.device != Device::Auto) return o_.device;
  int64_t no_gpu = cuda_backend_available() ? 0 : 1;
  ctrl_->allreduce(&no_gpu, 1, dist::ReduceOp::Sum);
  if (no_gpu == 0) return Device::Cuda;
  const std::string reason = cuda_backend_available() ? std::string() : reason_head(cuda_unavailable_reason());
  std::vector<char> mine(256, 0), all(256 * static_cast<size_t>(env_.world), 0);
  std::snprintf(mine.data(), mine.size(), "%s", reason.empty() ? "" : (env_.node + ": " + reason).c_str());
  ctrl_->allgather(mine.data(), all.data(), mine.size());
  if (rank0()) {
    std::string first;
    for (int r = 0; r < env_.world && first.empty(); ++r) first = all.data() + 256 * static_cast<size_t>(r);
    std::fprintf(stderr,
                 "resnet_ddp: WARNING: --device auto: training on the CPU backend, not a GPU (%lld of %d ranks; %s); "
                 "--device cpu silences this\n",
                 static_cast<long long>(no_gpu), env_.world, first.c_str());
    std::fflush(stderr);
  }
  return Device::Cpu;
}

// The backend this rank computes on; a setting it cannot honour is a usage error.
void Trainer::make_backend(Device device, int threads, const std::string& amp_note, int& cuda_index) {
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
  bo.collective_timeout_s = dist::collective_timeout_s();
  if (device == Device::Cuda) {
    const int visible = cuda_device_count();
    cuda_index = cuda_device_for_rank(env_.local_rank, env_.local_world, visible);
    if (cuda_index < 0)
      throw UsageError("--device cuda: " + std::to_string(env_.local_world) + " ranks on node " + env_.node +
                       " but " + std::to_string(visible) + " GPUs visible (one GPU per rank: start at most " +
                       std::to_string(visible) + " ranks per node, or bind one GPU per task)");
    bo.device_index = cuda_index;
  }
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
}

void Trainer::setup_device() {
  ctrl_ = dist::make_mpi_comm(MPI_COMM_WORLD);
  const Device device = choose_device();
  int cuda_index = 0;  // this rank's CUDA device (cuda_device_for_rank)
  const int threads = resolve_threads();
  if (o_.amp) o_.precision = amp_precision(device == Device::Cuda);
  const std::string amp_note =
      o_.amp ? "--amp (--precision " + name_of(precision_names(), o_.precision) + " on " + name_of(device_names(), device) + "): " : "";
  agree([&] { make_backend(device, threads, amp_note, cuda_index); });
#ifdef RESNET_DDP_HAVE_CUDA
  if (backend_->device() == DeviceKind::CUDA) {
    agree([&] { grad_ = make_nccl_comm(MPI_COMM_WORLD, *backend_); });
  }
#endif
  if (!grad_) grad_ = dist::make_mpi_comm(MPI_COMM_WORLD);
  dist::print_startup_lines(env_, backend_->name());
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

// Data first (its scan and warnings), then the lines that describe the run, then the
// model: the order a user reads them in.
RunParts Trainer::setup_parts(const LrChoice& lr) {
  RunParts p;
  setup_data(p);
  if (!o_.recipe.empty())
    say("Recipe " + o_.recipe + ": " + recipe_flags_line(o_.recipe) + " (flags given on the command line win)");
  if (!lr.line.empty()) say(lr.line);
  if (!lr.warning.empty() && rank0()) std::fprintf(stderr, "resnet_ddp: warning: %s\n", lr.warning.c_str());
  if (p.train_set)
    say("Train set size: " + std::to_string(p.train_set->size()) +
        ", Validation set size: " + std::to_string(p.val_set->size()));
  else
    say("Validation set size: " + std::to_string(p.val_set->size()));
  setup_model(p);
  return p;
}

void Trainer::setup_data(RunParts& p) {
  data::ScanOptions scan;
  scan.strict = o_.strict_data;
  scan.jpeg_draft = o_.jpeg_draft ? std::max({o_.image_size, o_.train_crop_size, o_.val_resize_size}) : 0;
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
    scan.class_names = plan_.class_names;
    scan.require_every_class = false;
    scan.verify = data::ScanOptions::Verify::Full;
    scan.strict = !o_.skip_unreadable;
    if (!o_.strict_data) {
      scan.strict_flag = "--eval-only";
      scan.strict_hint = " (unreadable images are never scored; --skip-unreadable skips them)";
    }
  }
  agree([&] {
    if (!o_.eval_only) p.train_set = data::open_dataset(o_.data, data::Split::Train, scan);
    p.val_set = data::open_dataset(o_.data, data::Split::Validation, scan);
  });
  p.class_names = p.train_set ? p.train_set->class_names() : p.val_set->class_names();
  if (rank0())
    for (const auto& w : dataset_warnings(p.train_set ? *p.train_set : *p.val_set, o_.image_size))
      std::fprintf(stderr, "resnet_ddp: warning: %s\n", w.c_str());
  const data::TransformConfig tc = transform_config(o_);  // the train/eval presets or the tutorial's
  p.train_tf = std::make_unique<data::TransformPipeline>(tc, true);
  p.val_tf = std::make_unique<data::TransformPipeline>(tc, false);
  p.norm = normalization(name_of(normalize_names(), o_.normalize));
  data::LoaderOptions lo;
  lo.batch_size = o_.batch_size;
  lo.workers = loader_workers(o_, env_, *ctrl_, backend_->device() == DeviceKind::CUDA);
  if (backend_->device() == DeviceKind::CUDA)
    say("Data loader: " + std::to_string(lo.workers) + " thread(s) per rank" +
        (o_.was_given("--workers") ? std::string(" (--workers)")
                                   : " (the rank's " + std::to_string(env_.cpus_per_rank) +
                                         " allowed core(s) less one for the launching thread)"));
  lo.seed = static_cast<uint64_t>(o_.seed);
  if (backend_->device() == DeviceKind::CPU) lo.nice = 10;
  if (backend_->device() == DeviceKind::CUDA) {
    // Workers decode into pinned slots the upload copies from directly; a slot is
    // refilled only once its copy is done (a host wait only when the GPU is behind).
    Backend* b = backend_.get();
    lo.allocator = [b](size_t bytes) { return b->allocate_upload_source(bytes); };
    lo.before_reuse = [b](const void* slot) { b->wait_upload_source(slot); };
  }
  if (rank0()) lo.log = [](const std::string& l) { std::fprintf(stderr, "%s\n", l.c_str()); };
  if (p.train_set) {
    agree([&] {  // RASampler refuses a training set too small for it (every rank alike)
      if (o_.ra_sampler)
        p.sampler = std::make_unique<data::RASampler>(p.train_set->size(), env_.world, env_.rank, o_.ra_reps, true,
                                                     static_cast<uint64_t>(o_.seed));
      else
        p.sampler = std::make_unique<data::DistributedSampler>(p.train_set->size(), env_.world, env_.rank, true,
                                                              static_cast<uint64_t>(o_.seed), false);
    });
    p.mixer = BatchMixer(*backend_, MixingOptions{o_.mixup_alpha, o_.cutmix_alpha}, static_cast<uint64_t>(o_.seed),
                         env_.rank);
    if (p.mixer.enabled()) say(p.mixer.description());
    p.train_loader = std::make_unique<data::Loader>(*p.train_set, *p.train_tf, lo, std::vector<int64_t>{}, 0);
  }
  data::LoaderOptions vo = lo;
  vo.batch_size = o_.effective_val_batch();
  p.val_loader = std::make_unique<data::Loader>(*p.val_set, *p.val_tf, vo, std::vector<int64_t>{}, 0);
}

void Trainer::setup_model(RunParts& p) {
  ResNetConfig mc;
  mc.arch = name_of(arch_names(), o_.arch);
  mc.head = o_.head;
  mc.num_classes = static_cast<int>(p.class_names.size());
  mc.init_seed = static_cast<uint64_t>(o_.seed);
  agree([&] {
    p.model = std::make_unique<ResNet>(*backend_, mc);
    p.model->init_parameters(static_cast<uint64_t>(o_.seed));
  });
  p.model->train(true);
  if (o_.sync_bn && env_.world > 1) {
    p.sync_bn = std::make_unique<dist::SyncBatchNormReducer>(*grad_);
    p.model->set_batchnorm_reducer(p.sync_bn.get());
  }
  OptimizerConfig oc;
  oc.type = o_.optimizer;
  oc.lr = o_.lr;
  oc.weight_decay = o_.weight_decay;
  if (o_.optimizer == OptimizerKind::Sgd) {
    oc.momentum = o_.momentum;
    oc.nesterov = o_.nesterov;
  }
  set_optim_config(oc, o_);
  p.opt = std::make_unique<Optimizer>(*backend_, p.model->params(), p.model->grads(), oc);
  p.opt->set_clip_grad_norm(o_.clip_grad_norm);
  p.sched = std::make_unique<Scheduler>(scheduler_config(o_));
  p.opt->set_lr(p.sched->initial_lr());  // a warmup starts below --lr (a resume's state replaces it)
  // Per-rank images per optimizer step stand for the reference's (per-GPU) batch size.
  const int64_t step_images = int64_t{o_.batch_size} * o_.accum_steps;
  if (o_.model_ema)
    p.ema = std::make_unique<ModelEma>(
        *p.model, ModelEma::adjusted_decay(env_.world, step_images, o_.model_ema_steps, o_.epochs, o_.model_ema_decay),
        o_.model_ema_steps, o_.lr_warmup_epochs);
  dist::BucketOptions bo;
  bo.bucket_mb = o_.bucket_mb;
  bo.progress_thread = o_.progress_thread;
  // One rank: its gradients are already the sum, so no reducer and no collective per step.
  if (env_.world > 1) p.bucketer = std::make_unique<dist::GradientBucketer>(*grad_, p.model->grads(), bo);
  p.step = std::make_unique<TrainStep>(*p.model, *p.opt, p.bucketer.get(), static_cast<float>(o_.label_smoothing),
                                      o_.precision == Precision::FP16, o_.loss_scale);
  p.step->use_graphs(o_.cuda_graphs && backend_->device() == DeviceKind::CUDA);
  // Fault injection for the fp16 skip path (tests/gpu_emu/train_emu.sh).
  if (const char* at = std::getenv("RD_INJECT_OVERFLOW_STEP"); at && *at) {
    const char* r = std::getenv("RD_INJECT_OVERFLOW_RANK");
    p.step->inject_overflow_at(std::atoll(at), env_.rank == (r && *r ? std::atoi(r) : 0));
  }
  // A step longer by this many milliseconds on every rank: the Ctrl-C tests need steps
  // longer than Open MPI's kill grace on any machine (tests/e2e/stop_mpirun_long_step.sh).
  if (const char* ms = std::getenv("RD_INJECT_STEP_DELAY_MS"); ms && *ms) inject_step_delay_ms_ = std::atoi(ms);
  // Every convolution shape of an epoch planned now, before any timer: the full and the
  // short last training batch (forward and backward), and validation's (forward).
  auto plan_batches = [&](size_t count, int64_t batch, int64_t size, bool training) {
    if (count >= static_cast<size_t>(batch)) p.model->plan_convolutions(batch, size, size, training);
    if (count % static_cast<size_t>(batch))
      p.model->plan_convolutions(static_cast<int64_t>(count % static_cast<size_t>(batch)), size, size, training);
  };
  agree([&] {
    if (p.train_set && !o_.eval_only)
      plan_batches(p.sampler->indices().size(), o_.batch_size, p.train_tf->output_size(), true);
    plan_batches(data::shard_exact(p.val_set->size(), env_.world, env_.rank).size(), o_.effective_val_batch(),
                 p.val_tf->output_size(), false);
  });
}

void Trainer::check_output_space() {
  if (o_.eval_only) return;
  agree(
      [&] {
        const double per_copy = static_cast<double>(run_.model->params().bytes()) * (1.0 + run_.opt->state_count()) +
                                static_cast<double>(run_.model->buffers().bytes());
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

}  // namespace rd::train
