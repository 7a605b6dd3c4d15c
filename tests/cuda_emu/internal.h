// Shared by runtime.cpp and kernels.cpp only (not by the library stand-ins).
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

namespace rd::emu {

// cudaGetLastError's next answer (a launch with a bad configuration).
void set_last_error(cudaError_t e);
// Faults if something wrote into the slack behind any of these allocations.
// (Re)installs the SIGSEGV handler that names faulting device accesses.
void install_segv_handler();
void check_canaries_of(const std::vector<const void*>& pointers, const char* when);

}  // namespace rd::emu
