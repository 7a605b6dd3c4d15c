#include "resnet_ddp/dist/launcher.h"

#include <cstdlib>

#include "resnet_ddp/errors.h"

namespace rd::dist {

namespace {
// A positive integer from the environment, 0 when unset or not a number.
long env_count(const char* var) {
  const char* v = std::getenv(var);
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return *end == '\0' && x > 0 ? x : 0;
}

// Inside a Slurm job step (srun), not the batch script itself, where SLURM_NTASKS is the
// allocation's and one process is normal.
bool in_slurm_step() { return std::getenv("SLURM_STEP_ID") || std::getenv("SLURM_STEPID"); }
}  // namespace

int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(var); v && *v) return std::atoi(v);
  }
  return 0;
}

int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const long n = env_count(var); n > 0) return static_cast<int>(n);
  if (in_slurm_step())
    if (const long n = env_count("SLURM_NTASKS"); n > 0) return static_cast<int>(n);
  return under_launcher() ? 0 : 1;
}

bool under_launcher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK") ||
         std::getenv("SLURM_STEP_ID");
}

std::string launcher_world_mismatch(int mpi_world) {
  if (mpi_world != 1) return "";
  const std::string fix =
      ". Each task would train its own copy of the model alone. Start the ranks so that they share one MPI "
      "world: inside the allocation `mpirun -np N resnet_ddp ...`, or `srun --mpi=pmix resnet_ddp ...` "
      "(`srun --mpi=list` shows the PMI types this Slurm offers; jobs/*.slurm set RESNET_DDP_LAUNCHER)";
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) {
    // Started by Open MPI's mpirun: it knows the world. A bigger number means this
    // program's MPI library is not the one mpirun belongs to.
    const long n = env_count("OMPI_COMM_WORLD_SIZE");
    if (n > 1)
      return "MPI gave this process a world of 1 rank, but mpirun started " + std::to_string(n) +
             " (OMPI_COMM_WORLD_SIZE=" + std::to_string(n) +
             "): resnet_ddp is linked against another MPI than this mpirun's" + fix;
    return "";
  }
  const bool in_step = in_slurm_step();
  for (const char* var : {"SLURM_NTASKS", "SLURM_NPROCS"}) {
    const long n = env_count(var);
    if (in_step && n > 1)
      return "MPI gave this process a world of 1 rank, but Slurm started " + std::to_string(n) + " tasks (" +
             var + "=" + std::to_string(n) + "): srun started them without PMI (add --mpi=pmix)" + fix;
  }
  if (const long n = env_count("WORLD_SIZE"); n > 1)
    return "MPI gave this process a world of 1 rank, but WORLD_SIZE=" + std::to_string(n) +
           " (torchrun or a similar launcher): resnet_ddp communicates through MPI, not torch.distributed" + fix;
  return "";
}

std::string describe_launcher() {
  if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE"))
    return std::string("Open MPI's mpirun, ") + n + " rank(s)";
  if (std::getenv("PMIX_RANK") || std::getenv("PMI_RANK")) return "a PMI launcher (srun --mpi=..., mpiexec)";
  if (const std::string why = launcher_world_mismatch(1); !why.empty()) throw UsageError(why);
  if (const char* job = std::getenv("SLURM_JOB_ID"))
    return std::string("Slurm job ") + job + ", no task launcher yet (the job script starts one)";
  return "none: one process (mpirun -np N or srun starts the ranks)";
}

}  // namespace rd::dist
