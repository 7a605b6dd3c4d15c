// The collective deadline in seconds (default 600 s; RD_COLLECTIVE_TIMEOUT_S and
// --collective-timeout reach it through dist::set_watchdog_options), read by the
// watchdog's threads. The CUDA backend and its NCCL communicator get it as a value
// (BackendOptions::collective_timeout_s), not from here.
#pragma once

namespace rd {

double collective_timeout_s();
// Positive seconds; anything else is ignored (dist::set_watchdog_options validates).
void set_collective_timeout_s(double seconds);

}  // namespace rd
