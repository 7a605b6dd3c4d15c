#!/usr/bin/env bash
# `make run`: trains on real images end to end, the way the reference recipe is
# run, but sized for a 2-core machine (a few minutes):
#   - Fashion-MNIST (Debian's dataset-fashion-mnist) converted once into an
#     ImageFolder tree under data/fashion_mnist/ (10 classes, 400 train and 50
#     validation images per class);
#   - 2 MPI ranks x 1 thread, ResNet-18 with the reference MLP head at 32x32,
#     Adam lr 3e-4, 4 epochs, plateau scheduler, label smoothing 0.1 (about 80% validation accuracy);
#   - then predict on the validation split with the best checkpoint, and plot the
#     metrics if gnuplot is installed.
# Environment: BUILD_DIR (default build), DEMO_RANKS (2), DEMO_EPOCHS (4),
# DEMO_OUT (output_model).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
RANKS=${DEMO_RANKS:-2}
EPOCHS=${DEMO_EPOCHS:-4}
OUT=${DEMO_OUT:-output_model}
DATA=data/fashion_mnist

bin=""
for candidate in "$BUILD_DIR/resnet_ddp" ./resnet_ddp; do
  if [ -x "$candidate" ]; then bin=$candidate; break; fi
done
[ -n "$bin" ] || { echo "demo: resnet_ddp is not built (run 'make build' or 'make run')" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "demo: mpirun not found (apt-get install openmpi-bin, or 'make deps')" >&2; exit 1; }

if [ ! -d "$DATA/Train" ] || [ ! -d "$DATA/Validation" ]; then
  # Debian's python3 (the converter needs only the standard library).
  py=/usr/bin/python3
  [ -x "$py" ] || py=python3
  echo "demo: converting Fashion-MNIST into $DATA (one time)"
  rm -rf "$DATA.partial"
  "$py" data/fashion_mnist_to_imagefolder.py --out "$DATA.partial" --train-per-class 400 --val-per-class 50
  mv "$DATA.partial" "$DATA"
fi

if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMP_NUM_THREADS=1

cmd=(mpirun --oversubscribe --bind-to none -np "$RANKS" "$bin" --data "$DATA" --arch resnet18 --image-size 32
  --batch-size 32 --epochs "$EPOCHS" --lr 3e-4 --augment flip --threads 1 --workers 1 --log-every 25
  --output-dir "$OUT" --resume none)
echo "demo: ${cmd[*]}"
echo
"${cmd[@]}"

echo
echo "demo: $bin predict --checkpoint $OUT/best_model.h5 --split Validation $DATA  (summary)"
"$bin" predict --checkpoint "$OUT/best_model.h5" --split Validation "$DATA" | sed -n '/^Accuracy:/,$p'

if command -v gnuplot >/dev/null; then
  echo
  tools/plot_metrics.sh "$OUT/metrics.csv" "$OUT/curves.png"
fi
