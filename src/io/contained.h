// Runs a function whose library code may crash or hang on hostile input (HDF5's
// parser on a damaged file) in a forked child, and reports what happened.
//
// Why a child process: HDF5 1.10 is not hardened against damaged metadata. Measured
// on this repository's checkpoints (docs/checkpoint_format.md, "Damaged files"), some
// single bit flips make it crash (SIGSEGV) or spin; in process that would take the
// whole command down (every rank, in a resumed run) without a message. The child
// runs no MPI and ends with _exit, and it is only forked for a file already known to
// be damaged.
#pragma once

#include <functional>
#include <string>

namespace rd::io {

struct ContainedResult {
  enum Outcome { Returned, Crashed, TimedOut, NotRun } outcome = NotRun;
  std::string message;  // what `fn` returned (Returned)
  int signal = 0;       // Crashed: the signal that ended the child
};

// Runs `fn` in a child process, killed after `timeout_s`; NotRun when no child could
// be started.
ContainedResult run_contained(const std::function<std::string()>& fn, int timeout_s);

}  // namespace rd::io
