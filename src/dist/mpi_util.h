// Internals shared by the dist sources: MPI error checks and the polled wait
// that gives every blocking operation a deadline and a lost-peer exit.
#pragma once

#include <string>

#include "resnet_ddp/dist/comm.h"

namespace rd::dist::detail {

// Throws rd::Error "<what>: <MPI error string>" unless rc == MPI_SUCCESS.
void check_mpi(int rc, const char* what);

// Waits for all `n` requests by polling MPI_Testall; throws rd::Error when the
// watchdog declared a peer lost or collective_timeout_s() passes.
void wait_requests(MPI_Request* requests, int n, const char* what);

// True when MPI is initialised and not yet finalised.
bool mpi_active();

}  // namespace rd::dist::detail
