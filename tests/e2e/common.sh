# Shared set-up for the end-to-end tests: sourced by each case with
#   $1 = resnet_ddp binary, $2 = mpiexec, $3 = repository root.
# Every case runs in its own temporary directory, removed on exit.
set -euo pipefail

RD_BIN=$1
RD_MPIEXEC=$2
RD_ROOT=$3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
# Fail fast if a peer disappears (the defaults suit real clusters).
export RD_PEER_TIMEOUT_S=${RD_PEER_TIMEOUT_S:-10}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rd_e2e.XXXXXX")
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
note() { echo "--- $*"; }
# torch_python MODULE...: sets PY to Debian's python3 (RD_TORCH_PYTHON) when it imports
# every MODULE; else the case is skipped (exit 77).
torch_python() {
  PY=${RD_TORCH_PYTHON:-/usr/bin/python3}
  [ -x "$PY" ] || PY=python3
  "$PY" -c "import $(IFS=,; echo "$*")" 2>/dev/null || {
    echo "SKIP: no $(IFS=/; echo "$*") for $PY" >&2
    exit 77
  }
}

# mpi NP ARGS...: resnet_ddp on NP ranks (oversubscribed: CI has 2 cores).
mpi() {
  local np=$1
  shift
  "$RD_MPIEXEC" --oversubscribe --bind-to none -np "$np" "$RD_BIN" "$@"
}

# Tiny-model settings every training case shares: 1 compute thread per rank.
TINY=(--arch resnet_tiny --image-size 32 --threads 1 --workers 1 --log-every 0)

# synth_data DIR TRAIN VAL: a small procedurally generated ImageFolder tree.
synth_data() {
  "$RD_BIN" synth --out "$1" --train "$2" --val "$3" --size 32x32 --format png --threads 1 >/dev/null
}

# fashion_data DIR: 5 classes of real Fashion-MNIST images (some easy, some
# confusable), or exit 77 (skip) when the Debian dataset is not installed.
fashion_data() {
  local py=/usr/bin/python3
  [ -x "$py" ] || py=python3
  if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    echo "SKIP: dataset-fashion-mnist is not installed" >&2
    exit 77
  fi
  "$py" "$RD_ROOT/data/fashion_mnist_to_imagefolder.py" --out "$1" --train-per-class 120 \
    --val-per-class 40 --classes T-shirt_top,Pullover,Coat,Shirt,Bag >/dev/null
}

# value_after TEXT PREFIX: the number following PREFIX on the first matching line.
value_after() {
  grep -o -- "$2[-0-9.e+]*" <<<"$1" | head -n 1 | sed "s/^$2//"
}

# Float comparison through awk (bash has none).
float_lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# wait_for FILE PATTERN SECONDS: until FILE contains PATTERN; 1 on timeout.
wait_for() {
  local deadline=$((SECONDS + $3))
  until grep -q -- "$2" "$1" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.05
  done
}

# rank_pid PID RANK: pid of that rank among the descendants of PID (a background
# job is a subshell running mpirun, whose children are the ranks).
rank_pid() {
  local pid
  for pid in $(pgrep -P "$1") $(for c in $(pgrep -P "$1"); do pgrep -P "$c"; done); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$pid"
      return 0
    fi
  done
  return 1
}

# preempt MPIRUN_PID LOG PATTERN RANK SIGNAL: once LOG shows PATTERN (60 s at most),
# sends SIGNAL to that rank and waits for the job, which must stop cleanly (exit 0).
preempt() {
  local mpirun_pid=$1 log=$2 pattern=$3 rank=$4 sig=$5 pid rc=0
  wait_for "$log" "$pattern" 60 || { cat "$log"; fail "training did not reach '$pattern'"; }
  pid=$(rank_pid "$mpirun_pid" "$rank") || fail "cannot find rank $rank"
  kill "-$sig" "$pid"
  wait "$mpirun_pid" || rc=$?
  [ "$rc" = 0 ] || { cat "$log"; fail "preempted run (SIG$sig to rank $rank) exited $rc, expected 0"; }
}
