#!/usr/bin/env bash
# The hygiene checks must be able to fail: on a scratch tree, tools/check_layering.py
# refuses a train header included from src/nn (and a dist header from src/core, an app
# header from src/train) and a component whose DEPS reach up, shipped code (src/, kernels/) including test equipment
# (tests/cuda_emu, the emulated CUDA device), and
# tools/check_function_length.py refuses a 90-line function unless a "Long because:"
# comment sits above it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

mkdir -p "$tmp/src/nn" "$tmp/src/core" "$tmp/include/resnet_ddp/train" "$tmp/include/resnet_ddp/dist" "$tmp/tools"
echo '#pragma once' > "$tmp/include/resnet_ddp/train/cli.h"
echo '#pragma once' > "$tmp/include/resnet_ddp/dist/comm.h"
: > "$tmp/tools/layering_allow.txt"
printf '#include "resnet_ddp/dist/comm.h"\n' > "$tmp/src/nn/ok.cpp"  # dist sits above nn
python3 "$repo/tools/check_layering.py" --root "$tmp" > "$tmp/out" && fail "nn including dist passed"
grep -q "src/nn/ok.cpp:1: nn includes" "$tmp/out" || fail "nn -> dist not named: $(cat "$tmp/out")"
printf '#include "resnet_ddp/train/cli.h"\n' > "$tmp/src/nn/ok.cpp"
printf 'int x;\n#include "resnet_ddp/dist/comm.h"\n' > "$tmp/src/core/up.cpp"
python3 "$repo/tools/check_layering.py" --root "$tmp" > "$tmp/out" && fail "upward includes passed"
grep -q "src/nn/ok.cpp:1: nn includes include/resnet_ddp/train/cli.h (train)" "$tmp/out" || fail "nn -> train: $(cat "$tmp/out")"
grep -q "src/core/up.cpp:2: core includes include/resnet_ddp/dist/comm.h (dist)" "$tmp/out" || fail "core -> dist: $(cat "$tmp/out")"
echo "core -> dist: a test" > "$tmp/tools/layering_allow.txt"
rm "$tmp/src/nn/ok.cpp"
python3 "$repo/tools/check_layering.py" --root "$tmp" > "$tmp/out" || fail "an allowed edge failed: $(cat "$tmp/out")"
rm "$tmp/src/core/up.cpp"
python3 "$repo/tools/check_layering.py" --root "$tmp" > "$tmp/out" && fail "a stale allowed edge passed"
grep -q "no longer needed" "$tmp/out" || fail "stale edge not named: $(cat "$tmp/out")"

printf 'rd_component(rd_nn DIRS src/nn DEPS rd_base rd_train)\nrd_component(rd_train DIRS src/train DEPS rd_base)\n' \
  > "$tmp/CMakeLists.txt"
python3 "$repo/tools/check_layering.py" --root "$tmp" > "$tmp/out" && fail "rd_nn depending on rd_train passed"
grep -q "rd_nn (nn) depends on rd_train (train)" "$tmp/out" || fail "component edge not named: $(cat "$tmp/out")"
# The commands (src/app) sit above the trainer: neither its library nor its files reach them.
printf 'rd_component(rd_app DIRS src/app EXCLUDE src/app/main.cpp DEPS rd_train)\nrd_component(rd_train DIRS src/train DEPS rd_app)\n' \
  > "$tmp/CMakeLists.txt"
mkdir -p "$tmp/src/train" "$tmp/include/resnet_ddp/app"
echo '#pragma once' > "$tmp/include/resnet_ddp/app/commands.h"
printf '#include "resnet_ddp/app/commands.h"\n' > "$tmp/src/train/up.cpp"
python3 "$repo/tools/check_layering.py" --root "$tmp" > "$tmp/out" && fail "rd_train depending on rd_app passed"
grep -q "rd_train (train) depends on rd_app (app)" "$tmp/out" || fail "train -> app edge not named: $(cat "$tmp/out")"
grep -q "src/train/up.cpp:1: train includes include/resnet_ddp/app/commands.h (app)" "$tmp/out" \
  || fail "train -> app include not named: $(cat "$tmp/out")"
grep -q "rd_app (app) depends" "$tmp/out" && fail "rd_app's own edge refused: $(cat "$tmp/out")"
rm -r "$tmp/CMakeLists.txt" "$tmp/src/train" "$tmp/include/resnet_ddp/app"

mkdir -p "$tmp/tests/cuda_emu" "$tmp/src/backend/cuda" "$tmp/kernels"
echo '#pragma once' > "$tmp/tests/cuda_emu/emu.h"
printf '#include "cuda_emu/emu.h"\n' > "$tmp/src/backend/cuda/uses_emu.cpp"
printf 'int y;\n#include "tests/cuda_emu/emu.h"\n' > "$tmp/kernels/uses_emu.cu"
python3 "$repo/tools/check_layering.py" --root "$tmp" > "$tmp/out" && fail "src including test equipment passed"
grep -q "src/backend/cuda/uses_emu.cpp:1: includes tests/cuda_emu/emu.h, test equipment" "$tmp/out" \
  || fail "src -> tests/cuda_emu not named: $(cat "$tmp/out")"
grep -q "kernels/uses_emu.cu:2: includes tests/cuda_emu/emu.h, test equipment" "$tmp/out" \
  || fail "kernels -> tests/cuda_emu not named: $(cat "$tmp/out")"
rm -r "$tmp/tests" "$tmp/src/backend" "$tmp/kernels"

: > "$tmp/tools/function_length_allow.txt"
long_fn() {  # name, then the comment line above it (may be empty)
  [[ -n $2 ]] && echo "$2"
  echo "int $1(int a) {"
  for i in $(seq 1 88); do echo "  a += $i;  // { not a brace"; done
  echo "  return a;"
  echo "}"
}
{ echo "namespace rd {"; long_fn too_long ""; echo "}  // namespace rd"; } > "$tmp/src/core/long.cpp"
python3 "$repo/tools/check_function_length.py" --root "$tmp" > "$tmp/out" && fail "a 91-line function passed"
grep -q "src/core/long.cpp:2: too_long is 91 lines" "$tmp/out" || fail "long function not named: $(cat "$tmp/out")"
{ echo "namespace rd {"; long_fn explained "// Long because: a test."; echo "}  // namespace rd"; } > "$tmp/src/core/long.cpp"
python3 "$repo/tools/check_function_length.py" --root "$tmp" > "$tmp/out" || fail "a function with a reason failed: $(cat "$tmp/out")"
# A reason above a function that has since become short is stale.
printf 'namespace rd {\n// Long because: it was.\nint short_now(int a) {\n  return a;\n}\n}  // namespace rd\n' > "$tmp/src/core/long.cpp"
python3 "$repo/tools/check_function_length.py" --root "$tmp" > "$tmp/out" && fail "a stale 'Long because:' passed"
grep -q "src/core/long.cpp:3: short_now is 3 lines, within the limit (80): remove its stale 'Long because:' comment" "$tmp/out" \
  || fail "stale reason not named: $(cat "$tmp/out")"
echo "checks refuse what they must"
