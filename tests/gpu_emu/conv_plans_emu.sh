#!/usr/bin/env bash
# resnet_ddp --device cuda on the emulated device, one rank, RD_CONV_REPORT=1: every
# convolution plan of the epoch (the full and the short last training batch, forward and
# both backward directions; validation's batches, forward) is reported once, well-formed,
# before the first training step; fp32's candidates are re-timed with CUDA events.
# One rank makes no NCCL call (RD_EMU_NCCL_TRACE=1 prints every completed one): its
# collectives are identities and it has no gradient reducer.
#   $1 = emulated-device resnet_ddp, $2 = CPU resnet_ddp (makes the data set),
#   $3 = precision: fp32 | fp16
# The one rank runs without mpirun (an MPI singleton), so its stdout and stderr reach the
# log in the order they were written (the report's step lines are unbuffered writes).
set -euo pipefail
EMU_BIN=$1
CPU_BIN=$2
PRECISION=$3

# shellcheck source=tests/gpu_emu/common.sh
source "$(dirname "$0")/common.sh" conv_plans

# 32 training images in batches of 5: a short last batch of 2; 16 validation images: 5 and 1.
"$CPU_BIN" synth --out "$WORK/data" --train 32 --val 16 --size 32x32 --format png --threads 1 >/dev/null
LOG=$WORK/train.log
RD_CONV_REPORT=1 RD_EMU_NCCL_TRACE=1 "$EMU_BIN" --device cuda --data "$WORK/data" \
  --arch resnet_tiny --image-size 32 --threads 1 --workers 1 --batch-size 5 --augment none --epochs 1 \
  --precision "$PRECISION" --log-every 1 --progress lines --tensorboard off --output-dir "$WORK/out" >"$LOG" 2>&1 ||
  { cat "$LOG"; fail "resnet_ddp exited non-zero"; }

if grep -m 5 'nccl trace: ' "$LOG"; then fail "one rank made the NCCL calls above"; fi

PLANS=$WORK/plans
grep '^resnet_ddp: conv plan ' "$LOG" >"$PLANS" || { cat "$LOG"; fail "no conv plan lines (RD_CONV_REPORT=1)"; }
WELL_FORMED='^resnet_ddp: conv plan cuda:[0-9]+ (forward|backward-data|backward-filter) x\[[0-9]+, [0-9]+, [0-9]+, [0-9]+\] '
WELL_FORMED+='w\[[0-9]+, [0-9]+, [0-9]+, [0-9]+\] stride [0-9]+ pad [0-9]+ groups [0-9]+ (f32|f16|bf16) (NHWC|NCHW): '
WELL_FORMED+='(algo [A-Z_0-9]+ \([0-9]+\) math (FMA|DEFAULT|TENSOR_OP|TENSOR_OP_ALLOW_CONVERSION) workspace [0-9.]+ MiB '
WELL_FORMED+='time ([0-9.]+ ms|not measured) \((re-timed with CUDA events|cudnnFind|heuristics), [0-9]+ candidates\)'
WELL_FORMED+='|no algorithm \(runs in f32 NCHW\))$'
if grep -v -E "$WELL_FORMED" "$PLANS"; then fail "the lines above are not well-formed plan reports"; fi
echo "--- $(wc -l <"$PLANS") plan lines, e.g.:"
head -n 3 "$PLANS"

# Planned once each: no (direction, shapes, type) twice.
key() { sed -E 's/^resnet_ddp: conv plan cuda:[0-9]+ ([^:]*):.*/\1/' "$PLANS"; }
dups=$(key | sort | uniq -d)
[ -z "$dups" ] || fail "planned more than once: $dups"

# All of them before the first training step (the setup plans the epoch's shapes).
first_step=$(grep -m 1 -n '^(Epoch 1/1) step ' "$LOG" | cut -d: -f1)
last_plan=$(grep -n '^resnet_ddp: conv plan ' "$LOG" | tail -n 1 | cut -d: -f1)
[ -n "$first_step" ] || { cat "$LOG"; fail "no step line"; }
[ "$last_plan" -lt "$first_step" ] || { cat "$LOG"; fail "a convolution was planned inside the epoch (line $last_plan)"; }

# Batch sizes: 5 and 2 (training), 5 and 1 (validation); every shape at each of them.
shapes_of() { grep -E "^resnet_ddp: conv plan cuda:[0-9]+ $1 x\[$2, " "$PLANS" | sed -E 's/.* x\[[0-9]+, /x[/; s/:.*//' | sort; }
for n in 2 1; do
  [ "$(shapes_of forward "$n")" = "$(shapes_of forward 5)" ] || fail "batch $n's forward shapes differ from batch 5's"
done
[ -n "$(shapes_of forward 5)" ] || fail "no forward plan at batch 5"
# Training batches plan both backward directions (the stem, 3 input channels, needs no
# input gradient); validation's batch of 1 plans none.
for n in 5 2; do
  [ "$(shapes_of backward-filter "$n")" = "$(shapes_of forward "$n")" ] || fail "batch $n: backward-filter plans missing"
  [ "$(shapes_of backward-data "$n")" = "$(shapes_of forward "$n" | grep -v '^x\[3, ')" ] ||
    fail "batch $n: backward-data plans missing"
done
[ -z "$(shapes_of 'backward-[a-z]+' 1)" ] || fail "validation's batch of 1 planned a backward direction"

case "$PRECISION" in
  fp32)
    # Find's order is not trusted in fp32: every choice among candidates was re-timed.
    if grep -v 'no algorithm\|, 1 candidates)' "$PLANS" | grep -v 're-timed with CUDA events'; then
      fail "fp32 plans above were not re-timed"
    fi
    grep -q 're-timed with CUDA events' "$PLANS" || fail "no fp32 plan was re-timed"
    grep -q ' math FMA ' "$PLANS" || fail "fp32 ran no FMA plan"
    if grep ' math DEFAULT \| math TENSOR_OP' "$PLANS"; then fail "fp32 chose a TF32 / tensor-op plan"; fi
    ;;
  fp16)
    if grep 're-timed with CUDA events' "$PLANS"; then fail "fp16 re-timed (cudnnFind's times are its own)"; fi
    ;;
  *) fail "unknown precision $PRECISION" ;;
esac
echo "PASS: conv plans ($PRECISION)"
