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

int main(int argc, char** argv) {
  int victim = 1;
  int sig = SIGKILL;
  std::string pidfile;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--victim" && i + 1 < argc) {
      victim = std::atoi(argv[++i]);
    } else if (a == "--signal" && i + 1 < argc) {
      std::string s = argv[++i];
      if (s == "KILL") sig = SIGKILL;
      else if (s == "STOP") sig = SIGSTOP;
      else { std::fprintf(stderr, "peer_loss: --signal must be KILL or STOP\n"); return 2; }
    } else if (a == "--pidfile" && i + 1 < argc) {
      pidfile = argv[++i];
    } else {
      std::fprintf(stderr, "usage: peer_loss --victim R --signal KILL|STOP [--pidfile F]\n");
      return 2;
    }
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
