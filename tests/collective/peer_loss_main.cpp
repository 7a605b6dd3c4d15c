// A job in which one rank dies (SIGKILL) or freezes (SIGSTOP) in the middle of
// a stream of all-reduces. Driven by peer_loss_test.sh, which checks that the
// job ends non-zero, quickly, naming the lost rank.
//   peer_loss --victim R --signal KILL|STOP [--pidfile FILE]
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "resnet_ddp/dist/comm.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/flags.h"

int main(int argc, char** argv) {
  int victim = 1;
  int sig = SIGKILL;
  std::string pidfile;
  try {
    rd::FlagSet fs("", "peer_loss");
    fs.integer("--victim", &victim, 0, "rank that dies or freezes");
    fs.enumeration("--signal", &sig, {{"KILL", SIGKILL}, {"STOP", SIGSTOP}}, "what happens to it");
    fs.path("--pidfile", &pidfile, "FILE", "where the victim writes its pid");
    fs.parse_or_help(argc, argv, "usage: peer_loss [flags]\n\nFlags:\n");
  } catch (const rd::UsageError& e) {
    std::fprintf(stderr, "peer_loss: %s\n", e.what());
    return 2;
  }
  try {
    auto env = rd::dist::init_process(argc, argv);
    auto comm = rd::dist::make_mpi_comm();
    std::vector<float> v(4096, 1.0f);
    // About 20 s of healthy traffic at most; the victim strikes after 1 s.
    for (int iter = 0; iter < 2000; ++iter) {
      if (env.rank == victim && iter == 100) {
        if (!pidfile.empty()) std::ofstream(pidfile) << getpid() << "\n";
        std::fprintf(stderr, "rank %d: raising SIG%s\n", env.rank, sig == SIGKILL ? "KILL" : "STOP");
        std::fflush(stderr);
        raise(sig);
      }
      comm->allreduce(v.data(), v.size(), rd::dist::ReduceOp::Average);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::printf("rank %d: finished without noticing a lost peer\n", env.rank);
    comm.reset();
    rd::dist::finalize_process();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    rd::dist::abort_job(1);
  }
}
