#!/usr/bin/env bash
# Containers (review ecosystem D9): with RESNET_DDP_CONTAINER the job scripts take a
# program that exists only inside the image, check it there, and run it through the
# container command. A stand-in for `apptainer exec` maps /opt/rd/bin inside the
# "image" to this build (Apptainer is not in Debian bookworm: the real one is untested).
source "$(dirname "$0")/common.sh"

BIN_DIR=$(dirname "$(readlink -f "$RD_BIN")")
cat >"$WORK/apptainer" <<FAKE
#!/bin/bash
# apptainer exec [--nv] IMAGE CMD ARGS...: CMD and ARGS under /opt/rd/bin are this build's.
[ "\$1" = exec ] || { echo "fake apptainer: only exec" >&2; exit 2; }
shift
[ "\$1" = --nv ] && shift
[ -f "\$1" ] || { echo "fake apptainer: no image \$1" >&2; exit 255; }
shift
args=()
for a in "\$@"; do
  case \$a in /opt/rd/bin/*) a=$BIN_DIR/\${a#/opt/rd/bin/} ;; esac
  args+=("\$a")
done
exec "\${args[@]}"
FAKE
chmod +x "$WORK/apptainer"
touch "$WORK/rd.sif"
[ ! -e /opt/rd/bin/resnet_ddp ] || fail "this test needs /opt/rd/bin/resnet_ddp not to exist on the host"

synth_data "$WORK/data" 8 4
export RESNET_DDP_DATA_SRC=$WORK/data RESNET_DDP_LAUNCHER="$RD_MPIEXEC -np 2"
export RESNET_DDP_CONTAINER="$WORK/apptainer exec --nv $WORK/rd.sif" RESNET_DDP_BIN=/opt/rd/bin/resnet_ddp

note "pre-flight with the program only inside the image"
(cd "$WORK" && env -u SLURM_JOB_ID bash "$RD_ROOT/jobs/cpu.slurm" --arch resnet_tiny --image-size 32 >"$WORK/pf.log" 2>&1) ||
  { cat "$WORK/pf.log"; fail "pre-flight failed for a program inside the container"; }
cat "$WORK/pf.log"
grep -q "program backends: cpu, cuda" "$WORK/pf.log" || fail "the program's --version did not run through the container"
grep -q "check: result:    ready" "$WORK/pf.log" || fail "--check did not run through the container"
grep -q -F "Training command: $RD_MPIEXEC -np 2 $WORK/apptainer exec --nv $WORK/rd.sif /opt/rd/bin/resnet_ddp --data" "$WORK/pf.log" ||
  fail "the training command does not start the program through the container"

note "a path missing inside the image is named"
rc=0
(cd "$WORK" && env -u SLURM_JOB_ID RESNET_DDP_BIN=/opt/rd/bin/nothere bash "$RD_ROOT/jobs/cpu.slurm" >"$WORK/bad.log" 2>&1) || rc=$?
cat "$WORK/bad.log"
[ "$rc" != 0 ] || fail "a missing program passed"
grep -q "RESNET_DDP_BIN=/opt/rd/bin/nothere is not an executable file inside the container" "$WORK/bad.log" || fail "not named"

note "a container command that does not exist is named"
rc=0
(cd "$WORK" && env -u SLURM_JOB_ID RESNET_DDP_CONTAINER="no-such-apptainer exec x.sif" bash "$RD_ROOT/jobs/cpu.slurm" \
  >"$WORK/nocmd.log" 2>&1) || rc=$?
[ "$rc" != 0 ] && grep -q "RESNET_DDP_CONTAINER: 'no-such-apptainer' is not a command here" "$WORK/nocmd.log" ||
  { cat "$WORK/nocmd.log"; fail "a missing container command"; }
echo PASS
