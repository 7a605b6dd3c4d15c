// What the launcher's environment (Open MPI's mpirun, PMI/PMIx, Slurm's srun,
// torchrun-style WORLD_SIZE) says about how this process was started. Read before MPI
// starts (who prints a usage error) and after (does MPI's world match the launcher's).
#pragma once

#include <string>

namespace rd::dist {

// Rank from the launcher's environment (Open MPI, PMIx, PMI, Slurm), for deciding who
// prints before MPI is initialised. 0 when unknown.
int launcher_rank();

// The number of tasks the launcher started (Open MPI, PMI, an srun step), 1 without a
// launcher, 0 when a launcher started this process but does not say how many (PMIx).
int launcher_world_size();

// Whether a launcher started this process (mpirun, a PMI launcher, an srun step): then
// its stdout is not the user's terminal even where isatty says so (Open MPI hands every
// rank a pseudo-terminal).
bool under_launcher();

// When MPI's world is 1 but the launcher's environment says the job has more tasks
// (srun without PMI, torchrun, an mpirun of another MPI), the reason and the fix;
// empty when nothing disagrees.
std::string launcher_world_mismatch(int mpi_world);

// One line naming the launcher (`train --check`); an rd::UsageError with
// launcher_world_mismatch's reason when it would give each task a world of its own.
std::string describe_launcher();

}  // namespace rd::dist
