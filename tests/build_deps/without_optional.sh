#!/usr/bin/env bash
# A build without libtiff, libwebp and yaml-cpp (as on a cluster that lacks them):
# configure says what is left out, resnet_ddp builds, and at run time a .tif or .webp
# image and a YAML config are refused with an error that says how to rebuild.
set -euo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
build=$RD_NOOPT_BUILD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The same settings as this build, so that ccache has every object but rd_data's and flags.cpp.
"$RD_CMAKE" -S "$RD_SOURCE_DIR" -B "$build" -DCMAKE_BUILD_TYPE=Release -DRESNET_DDP_CUDA="$RD_CUDA" \
  -DRESNET_DDP_WERROR=ON -DRESNET_DDP_TESTS=OFF -DCMAKE_CXX_COMPILER_LAUNCHER="$RD_LAUNCHER" \
  -DCMAKE_C_COMPILER_LAUNCHER="$RD_LAUNCHER" -DCMAKE_CUDA_COMPILER_LAUNCHER="$RD_LAUNCHER" \
  -DRESNET_DDP_TIFF=OFF -DRESNET_DDP_WEBP=OFF -DRESNET_DDP_YAML=OFF >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; fail "configure"; }
for what in "RESNET_DDP_TIFF=OFF: .tif/.tiff images not supported" "RESNET_DDP_WEBP=OFF: .webp images not supported" \
  "RESNET_DDP_YAML=OFF: YAML --config files not supported"; do
  grep -q -F "resnet_ddp: $what (refused at run time)" "$work/configure.log" ||
    { cat "$work/configure.log"; fail "configure does not say '$what'"; }
done
start=$SECONDS
"$RD_CMAKE" --build "$build" --target resnet_ddp -j "$(nproc)" >"$work/build.log" 2>&1 ||
  { tail -50 "$work/build.log"; fail "build"; }
echo "built in $((SECONDS - start)) s"
bin=$build/resnet_ddp
! ldd "$bin" | grep -E "libtiff|libwebp|libyaml-cpp" || fail "linked against an optional library"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# expect_refusal NAME MESSAGE COMMAND...: exit status 2 and MESSAGE on stderr.
expect_refusal() {
  local name=$1 message=$2 rc=0
  shift 2
  "$@" >"$work/$name.log" 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { cat "$work/$name.log"; fail "$name: exit status $rc, not 2"; }
  grep -q -F -- "$message" "$work/$name.log" || { cat "$work/$name.log"; fail "$name: no '$message'"; }
  echo "ok: $name"
}

"$RD_BIN" synth --out "$work/data" --train 8 --val 4 --size 32x32 --format png --threads 1 >/dev/null
train=(--arch resnet_tiny --image-size 32 --threads 1 --workers 1 --epochs 1 --output-dir "$work/out")
# One class folder holding a TIFF (the extension is enough: it is refused before decoding).
tif_dir=$(find "$work/data/Train" -mindepth 1 -maxdepth 1 -type d | sort | head -n 1)
cp "$(find "$tif_dir" -name '*.png' | sort | head -n 1)" "$tif_dir/scan.tif"
expect_refusal tiff_folder "1 TIFF image(s) ($tif_dir/scan.tif), and this build of resnet_ddp has no TIFF support: rebuild with libtiff >= 4.5 found (docs/hpc.md)" \
  "$bin" --data "$work/data" "${train[@]}"
rm "$tif_dir/scan.tif"
cp "$(find "$tif_dir" -name '*.png' | sort | head -n 1)" "$tif_dir/photo.webp"
expect_refusal webp_folder "and this build of resnet_ddp has no WebP support: rebuild with libwebp found (docs/hpc.md)" \
  "$bin" --data "$work/data" "${train[@]}"
rm "$tif_dir/photo.webp"
# A file with TIFF content under another name: predict refuses it by its bytes.
printf 'II*\0\010\0\0\0\0\0' >"$work/image.png"
"$bin" --data "$work/data" "${train[@]}" --max-steps 1 >"$work/train.log" 2>&1 || { cat "$work/train.log"; fail "training without TIFF files"; }
rc=0
"$bin" predict --checkpoint "$work/out/last.h5" "$work/image.png" >"$work/predict.log" 2>&1 || rc=$?
grep -q -F "$work/image.png: a TIFF image: this build of resnet_ddp has no TIFF support" "$work/predict.log" ||
  { cat "$work/predict.log"; fail "predict: no refusal of the TIFF bytes (exit $rc)"; }
echo "ok: tiff_bytes"
printf 'epochs: 1\n' >"$work/config.yaml"
expect_refusal yaml_config "$work/config.yaml: a YAML config, and this build of resnet_ddp has no YAML support: rebuild with yaml-cpp found (docs/hpc.md)" \
  "$bin" --data "$work/data" "${train[@]}" --config "$work/config.yaml"
