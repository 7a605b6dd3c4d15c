#include "resnet_ddp/collective_timeout.h"

#include <atomic>
#include <cmath>

namespace rd {
namespace {
std::atomic<double> g_timeout_s{600.0};  // read by other threads (watchdog, NCCL waits)
}  // namespace

double collective_timeout_s() { return g_timeout_s.load(); }

void set_collective_timeout_s(double seconds) {
  if (std::isfinite(seconds) && seconds > 0) g_timeout_s.store(seconds);
}

}  // namespace rd
