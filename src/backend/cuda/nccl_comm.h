// NcclComm: rd::dist::Comm over device memory with NCCL (factory
// rd::dist::make_nccl_comm in comm.h). Bootstrap: rank 0's ncclGetUniqueId
// goes to every rank with MPI_Bcast, then a non-blocking ncclCommInitRankConfig
// polled against collective_timeout_s() and the watchdog's lost_peer().
// Collectives run on a dedicated comm stream that first waits (event) for the
// CUDA backend's compute stream of the same device (registered by CudaBackend);
// completion is an event the compute stream waits on, so compute, comm and the
// optimizer stay ordered without device-wide synchronisation. Any wait that
// passes the deadline or sees an NCCL error aborts the communicator
// (ncclCommAbort) and throws rd::Error naming the operation.
#pragma once

#include <memory>

#include "resnet_ddp/dist/comm.h"

namespace rd::cuda {

std::unique_ptr<dist::Comm> make_nccl_comm_impl(MPI_Comm base, int device_index);

}  // namespace rd::cuda
