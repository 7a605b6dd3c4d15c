// Catch2 main for tests that run under mpirun: every rank runs every test case
// in the same order, so collectives inside the cases match up across ranks.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "resnet_ddp/dist/comm.h"

int main(int argc, char** argv) {
  rd::dist::ProcessEnv env;
  try {
    env = rd::dist::init_process(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  Catch::Session session;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) rc = session.run();
  // A failing rank must not leave the others waiting in the final barrier.
  auto comm = rd::dist::make_mpi_comm();
  int64_t failed = rc != 0;
  comm->allreduce(&failed, 1, rd::dist::ReduceOp::Sum);
  comm.reset();
  if (failed && env.rank == 0)
    std::fprintf(stderr, "%lld of %d ranks failed\n", static_cast<long long>(failed), env.world);
  rd::dist::finalize_process();
  return rc == 0 && failed ? 1 : rc;
}
