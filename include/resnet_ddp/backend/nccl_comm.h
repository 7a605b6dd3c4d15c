// The NCCL communicator of the CUDA backend (defined in src/backend/cuda, rd_cuda),
// so it exists only in CUDA builds: callers guard with RESNET_DDP_HAVE_CUDA.
#pragma once

#ifdef RESNET_DDP_HAVE_CUDA
#include <memory>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/dist/comm.h"  // MPI's C API only (it sets OMPI_SKIP_MPICXX first)

namespace rd {

// NCCL communicator over device memory among the ranks of `base`, on the device of
// `compute`, which must be a CUDA backend (make_cuda_backend) and outlive the
// communicator. Its collectives start after the work already queued on the backend's
// compute stream, and work queued there afterwards waits for them (events, no host
// wait). Waits are bounded by the backend's BackendOptions::collective_timeout_s.
// Throws rd::Error on failure (not a CUDA backend, NCCL init error or timeout).
std::unique_ptr<dist::Comm> make_nccl_comm(MPI_Comm base, Backend& compute);

}  // namespace rd
#endif
