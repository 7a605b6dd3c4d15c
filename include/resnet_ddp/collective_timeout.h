// The collective deadline in seconds (default 600 s; RD_COLLECTIVE_TIMEOUT_S and
// --collective-timeout reach it through dist::set_watchdog_options). It lives in
// rd_base, without MPI, because the CUDA backend bounds its teardown waits by it
// and must build where there is no MPI (tools/gpu_check.sh's standalone build).
#pragma once

namespace rd {

double collective_timeout_s();
// Positive seconds; anything else is ignored (dist::set_watchdog_options validates).
void set_collective_timeout_s(double seconds);

}  // namespace rd
