#!/usr/bin/env bash
# Runs ctest in a sanitizer build directory and fails on any sanitizer report,
# including reports from processes whose exit status a test expects to be
# non-zero (cli_errors) or that mpirun reaps: every report goes to a log file
# under BUILD/sanitizer-logs, and a non-empty log is a failure.
# Usage: run_ctest.sh BUILD_DIR LABEL_REGEX [extra ctest args...]
set -uo pipefail
build=$(cd "$1" && pwd); labels=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
logs="$build/sanitizer-logs"
rm -rf "$logs" && mkdir -p "$logs"
common="log_path=$logs/report:print_suppressions=0"
# halt_on_error: the first report ends the process (a test then fails as well).
export ASAN_OPTIONS="$common:detect_leaks=1:detect_stack_use_after_return=0:strict_string_checks=1:check_initialization_order=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="$common:print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="$common:suppressions=$here/tsan.supp:halt_on_error=1:second_deadlock_stack=1"
[ -f "$build/librd_keep_dso.so" ] && export LD_PRELOAD="$build/librd_keep_dso.so${LD_PRELOAD:+:$LD_PRELOAD}"
# Open MPI's memory hooks (patcher) fight the sanitizers' allocator interposition.
export OMPI_MCA_memory=^patcher
if grep -q '^RESNET_DDP_SANITIZE:STRING=thread' "$build/CMakeCache.txt"; then
  # Debian's LLVM OpenMP runtime is not built with TSan annotations: its barriers are
  # invisible to TSan, so OpenMP worker threads would report false races. Our own
  # threads (loader workers, watchdog, progress thread, DDP bucketer) are std::threads.
  export OMP_NUM_THREADS=1
fi
status=0
(cd "$build" && ctest --output-on-failure -j "${CTEST_JOBS:-2}" --timeout 900 -L "$labels" "$@") || status=$?
reports=$(find "$logs" -type f -size +0 | sort)
if [ -n "$reports" ]; then
  echo "=== sanitizer reports ($(echo "$reports" | wc -l) files) ==="
  for r in $reports; do echo "--- $r"; head -n 60 "$r"; done
  status=1
else
  echo "sanitizers: no reports"
fi
exit $status
