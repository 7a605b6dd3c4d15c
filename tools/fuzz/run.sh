#!/usr/bin/env bash
# Runs every fuzz target of BUILD_DIR for SECONDS each (docs/hardening.md):
# replays tests/fuzz/regressions/<target>/ first (inputs of fixed crashes), then fuzzes
# from the generated seeds plus the corpus kept in BUILD_DIR/fuzz/corpus/<target>.
# Crash inputs land in BUILD_DIR/fuzz/artifacts/<target>/; any crash fails.
# Usage: run.sh BUILD_DIR SECONDS [target...]
set -uo pipefail
build=$(cd "$1" && pwd); seconds=$2; shift 2
src=$(cd "$(dirname "$0")/../.." && pwd)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(fuzz_image fuzz_packed fuzz_checkpoint fuzz_flags fuzz_safetensors fuzz_pth)
py=/usr/bin/python3; [ -x "$py" ] || py=python3
work="$build/fuzz"
rm -rf "$work/seeds" && mkdir -p "$work/seeds"
"$py" "$src/tools/fuzz/make_seeds.py" "$work/seeds" || exit 1
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$src/tools/sanitize/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export OMP_NUM_THREADS=1
status=0
for t in "${targets[@]}"; do
  bin="$build/fuzz/$t"
  [ -x "$bin" ] || bin="$build/$t"
  [ -x "$bin" ] || { echo "fuzz: $t not built in $build" >&2; status=1; continue; }
  mkdir -p "$work/corpus/$t" "$work/artifacts/$t"
  reg="$src/tests/fuzz/regressions/$t"
  if [ -d "$reg" ] && [ -n "$(ls -A "$reg")" ]; then
    if ! "$bin" -runs=0 "$reg"/* >"$work/$t.regressions.log" 2>&1; then
      echo "fuzz: $t fails a regression input:"; tail -n 40 "$work/$t.regressions.log"; status=1; continue
    fi
  fi
  echo "fuzz: $t for ${seconds}s"
  "$bin" -max_total_time="$seconds" -timeout=120 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
         -artifact_prefix="$work/artifacts/$t/" "$work/corpus/$t" "$work/seeds/$t" >"$work/$t.log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$work/$t.log" | awk '{print $2}')
  rate=$(grep -o 'stat::average_exec_per_sec: [0-9]*' "$work/$t.log" | awk '{print $2}')
  echo "fuzz: $t rc=$rc execs=${execs:-?} exec/s=${rate:-?} corpus=$(ls "$work/corpus/$t" | wc -l) files"
  if [ $rc -ne 0 ]; then
    echo "fuzz: $t found a crash (inputs in $work/artifacts/$t):"; grep -A30 'ERROR\|runtime error\|deadly signal\|uncaught' "$work/$t.log" | head -n 60
    status=1
  fi
done
exit $status
