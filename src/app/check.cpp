// `resnet_ddp train --check ...`: everything a training run would refuse, found in
// seconds on a login node: flags and config file (already parsed), paths, the output
// folder (created by nobody), the device and precision, the checkpoint a resume would
// read and whether this command may continue it, the dataset (headers only), and the
// launcher's environment. No MPI: a login node may not allow it.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/data/loader.h"
#include "resnet_ddp/data/sampler.h"
#include "resnet_ddp/dist/comm.h"
#include "resnet_ddp/dist/launcher.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/train/cli.h"
#include "resnet_ddp/app/commands.h"
#include "resnet_ddp/train/output_lock.h"
#include "resnet_ddp/train/recipes.h"
#include "train/dataset_warnings.h"
#include "train/lr_scaling.h"
#include "train/resume_plan.h"

namespace fs = std::filesystem;

namespace rd::train {

namespace {

bool is_archive(const std::string& path) {
  for (const char* ext : {".tar.gz", ".tgz", ".tar", ".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".tar.zst", ".tzst"}) {
    const std::string e(ext);
    if (path.size() > e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0) return true;
  }
  return false;
}

// The output folder as the run would use it, without creating it: an existing folder
// must be writable and free (no other run holds its lock); a missing one needs a
// writable nearest existing parent.
std::string check_output_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) throw UsageError("--output-dir: '" + dir + "' is not a directory");
    if (::access(dir.c_str(), W_OK | X_OK) != 0) throw UsageError("--output-dir: cannot write in '" + dir + "'");
    std::string stale;
    OutputLock lock = OutputLock::acquire(dir, &stale);  // throws naming the holder
    lock.release();
    return "'" + dir + "' writable, not in use" +
           (stale.empty() ? std::string() : " (its previous run ended without releasing it: " + stale + ")");
  }
  fs::path parent = fs::absolute(dir, ec).parent_path();
  while (!parent.empty() && !fs::exists(parent, ec) && parent != parent.parent_path()) parent = parent.parent_path();
  if (!fs::is_directory(parent, ec) || ::access(parent.c_str(), W_OK | X_OK) != 0)
    throw UsageError("--output-dir: cannot create '" + dir + "': '" + parent.string() + "' is not a writable directory");
  return "'" + dir + "' will be created (in " + parent.string() + ", writable)";
}

// Prints one "check: WHAT: DETAIL" line (rank 0 only; the other tasks print only errors).
struct Say {
  bool speaker;
  void operator()(const std::string& what, const std::string& detail) const {
    if (!speaker) return;
    std::printf("check: %-10s %s\n", (what + ":").c_str(), detail.c_str());
    std::fflush(stdout);
  }
};

// The device, precision and threads: the backend the run would build. Returns whether it
// computes on a GPU; `o.precision` becomes --amp's choice.
bool check_device(TrainOptions& o, const Say& say) {
  const bool cuda = o.device == Device::Cuda || (o.device == Device::Auto && cuda_backend_available());
  // A login node has no GPU: only a binary without the CUDA backend is a problem
  // here; the run itself stops at start if its nodes have no GPU.
  if (cuda && !cuda_backend_built()) throw UsageError("--device cuda: " + cuda_unavailable_reason());
  if (o.amp) o.precision = amp_precision(cuda);
  // Repeated from the parser for --device auto, which resolves to the CPU only here.
  if (o.precision == Precision::FP16 && !cuda) throw UsageError("--precision: fp16 needs a GPU (--device cuda)");
  if (cuda) {
    say("device", cuda_backend_available()
                      ? "cuda (" + std::to_string(cuda_device_count()) + " visible)"
                      : "cuda (backend built; no GPU visible on this node: the run checks its nodes' GPUs at start)");
    return true;
  }
  BackendOptions bo;
  bo.precision = o.precision;
  bo.conv_algo = o.conv_algo;
  const int cores = dist::affinity_cpus();
  bo.threads = o.threads > 0 ? std::min(o.threads, cores) : cores;
  if (o.threads > cores)
    std::fprintf(stderr,
                 "resnet_ddp: warning: --threads %d: more threads than the %d core(s) this process may use (its "
                 "CPU affinity); a run clamps to %d\n",
                 o.threads, cores, cores);
  try {
    say("device", make_cpu_backend(bo)->name());
  } catch (const Error& e) {
    throw UsageError("--precision " + name_of(precision_names(), o.precision) + ": " + e.what());
  }
  return false;
}

// The lr the run would start from on the launcher's ranks (--lr-base), or the warning
// for a recipe's lr at another global batch; before check_start, which compares the lr
// with a resumed checkpoint's.
void check_lr(TrainOptions& o, const Say& say) {
  if (o.eval_only || (o.lr_base == 0.0 && o.recipe.empty())) return;
  const int world = dist::launcher_world_size();
  if (world == 0) {
    say("lr", "the global batch depends on the ranks, which this launcher does not say: the run works it out");
    return;
  }
  const LrChoice c = choose_lr(o, world);
  apply_lr_choice(o, c);
  if (!c.line.empty()) say("lr", c.line);
  if (!c.warning.empty() && say.speaker) std::fprintf(stderr, "resnet_ddp: warning: %s\n", c.warning.c_str());
}

// The checkpoint a resume reads and whether this command may continue it, or the --init
// weights. Returns the checkpoint's class names (empty without a resume).
std::vector<std::string> check_start(TrainOptions& o, bool cuda, const Say& say) {
  const std::string resume_path = o.resume_checkpoint();
  if (!resume_path.empty()) {
    io::CheckpointReader ck(resume_path, true);
    const io::CheckpointMeta& m = ck.meta();
    ResumePlan plan = plan_resume(o, resume_path, m, {cuda, 1});
    plan.model.apply_to(o);
    if (!o.eval_only) refuse_new_experiment(o, resume_path, m, plan.differences);
    say("resume", (o.eval_only ? "evaluates " : "continues ") + resume_path + " (" + std::to_string(m.epoch) +
                      " epoch(s) done" + (o.eval_only ? ")" : " of --epochs " + std::to_string(o.epochs) + ")"));
    if (!plan.model_settings.empty()) say("resume", plan.model_settings);
    for (const auto& c : plan.changes) say("resume", c);
    return m.class_names;
  }
  if (!o.init.empty()) {
    io::CheckpointReader ck(o.init, true, init_weights(o));
    check_init(o, ck.meta());
    say("init", "weights from " + o.init + (o.init_ema ? " (its weight EMA, " + ck.weights_origin() + ")" : ""));
    if (const std::string w = init_warning(o, ck.meta()); !w.empty()) say("init", "warning: " + w);
  } else if (o.eval_only) {
    throw UsageError("--eval-only: no checkpoint found (" + (fs::path(o.output_dir) / "last.h5").string() +
                     " does not exist)");
  } else {
    say("resume", "none: a fresh start");
  }
  return {};
}

// --ra-sampler: the sampler the run would build, on the launcher's world, so a training
// set too small for it is refused here rather than at start.
void check_sampler(const TrainOptions& o, size_t train_images, const Say& say) {
  if (!o.ra_sampler) return;
  const int world = dist::launcher_world_size();
  if (world == 0) {
    say("sampler", "RASampler: this launcher does not say how many ranks it started; the run checks its size");
    return;
  }
  const data::RASampler ra(train_images, world, 0, o.ra_reps);  // refuses a set too small for it
  say("sampler", "RASampler x" + std::to_string(o.ra_reps) + ": " + std::to_string(ra.num_selected_samples()) +
                     " samples per rank and epoch on " + std::to_string(world) + " rank(s)");
}

// The dataset, headers only (a run decodes every image unless --verify-data header).
// `classes`: the resumed checkpoint's, which the data must have.
void check_data(const TrainOptions& o, const std::vector<std::string>& classes, const Say& say) {
  if (is_archive(o.data)) {
    say("data", o.data + " is an archive: the job scripts stage and unpack it; its images are checked then");
    return;
  }
  data::ScanOptions scan;
  scan.strict = o.strict_data;
  scan.verify = data::ScanOptions::Verify::Header;
  scan.folders.train = o.train_split;
  scan.folders.validation = o.val_split;
  if (say.speaker) scan.log = [](const std::string& l) { std::fprintf(stderr, "%s\n", l.c_str()); };
  if (o.eval_only) {
    scan.class_names = classes;
    scan.require_every_class = false;
  }
  std::unique_ptr<data::Dataset> train;
  if (!o.eval_only) train = data::open_dataset(o.data, data::Split::Train, scan);
  auto val = data::open_dataset(o.data, data::Split::Validation, scan);
  const auto& names = train ? train->class_names() : val->class_names();
  if (!classes.empty() && names != classes)
    throw UsageError("--data " + o.data + ": its classes differ from those of " + o.resume_checkpoint() + kStartFresh);
  if (say.speaker)
    for (const auto& w : dataset_warnings(train ? *train : *val, o.image_size))
      std::fprintf(stderr, "resnet_ddp: warning: %s\n", w.c_str());
  say("data", (train ? std::to_string(train->size()) + " training + " : std::string()) +
                  std::to_string(val->size()) + " validation images in " + std::to_string(names.size()) +
                  " classes (headers read)");
  if (train) check_sampler(o, train->size(), say);
}


// An integer from the first of `names` set in the environment; `fallback` if none is.
int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names)
    if (const char* v = std::getenv(n); v && *v) return std::atoi(v);
  return fallback;
}

// This task's CPU placement, printed by every task (not only rank 0: each has its own):
// the cores its affinity allows (what mpirun's binding or Slurm granted) and, on the GPU,
// the device it would take and whether its loader threads fit beside the launching one.
void check_placement(const TrainOptions& o, bool cuda) {
  std::string allowed = "?";
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("Cpus_allowed_list:", 0) == 0) {
      allowed = line.substr(line.find_first_not_of(" \t", 18));
      break;
    }
  const int cores = dist::affinity_cpus();
  std::string line = "rank " + std::to_string(dist::launcher_rank()) + ": " + std::to_string(cores) +
                     " allowed core(s) (" + allowed + ")";
  if (cuda) {
    const int local_rank = env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"}, 0);
    const int local_world =
        env_int({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"}, 1);
    const int visible = cuda_device_count();
    const int gpu = cuda_device_for_rank(local_rank, local_world, visible);
    line += gpu >= 0 ? ", GPU cuda:" + std::to_string(gpu) + " of " + std::to_string(visible) + " visible"
                     : ", GPU: none visible here (local rank " + std::to_string(local_rank) + ")";
    const int workers = o.was_given("--workers") ? o.workers : data::default_loader_workers(1);
    line += ", " + std::to_string(workers) + " loader thread(s)";
    if (workers + 1 > cores)
      std::fprintf(stderr,
                   "resnet_ddp: warning: rank %d: %d loader thread(s) + the launching thread need %d cores, but it may "
                   "use %d (its CPU affinity): give each rank its own cores (mpirun --map-by "
                   "ppr:RANKS:socket:PE=CORES, or --bind-to none; srun --cpus-per-task=CORES)\n",
                   dist::launcher_rank(), workers, workers + 1, cores);
  }
  std::printf("check: %-10s %s\n", "placement:", line.c_str());
  std::fflush(stdout);
}
}  // namespace

int check_main(const TrainOptions& opts) {
  // Every task of a launcher checks its own node (data and paths may be node-local);
  // rank 0 reports, the others only their errors.
  const int rank = dist::launcher_rank();
  const Say say{rank == 0};
  const std::string who = say.speaker ? "" : "rank " + std::to_string(rank) + ": ";
  try {
    TrainOptions o = opts;
    say("flags", std::to_string(o.given.size()) + " given, all valid" +
                     (o.was_given("--config") ? " (with the --config file's)" : std::string()));
    // The flags a preset stands for, as the run prints them at start.
    if (!o.recipe.empty())
      say("recipe", o.recipe + ": " + recipe_flags_line(o.recipe) + " (flags given on the command line win)");
    check_train_paths(o, false);
    if (!o.eval_only) say("output", check_output_dir(o.output_dir));
    const bool cuda = check_device(o, say);
    check_placement(o, cuda);
    check_lr(o, say);
    const std::vector<std::string> classes = check_start(o, cuda, say);
    check_data(o, classes, say);
    say("launcher", dist::describe_launcher());
    say("result", "ready; nothing was trained (run the same command without --check)");
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "resnet_ddp: error: %s%s\n", who.c_str(), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet_ddp: error: %s%s\n", who.c_str(), e.what());
    return 1;
  }
}

}  // namespace rd::train
