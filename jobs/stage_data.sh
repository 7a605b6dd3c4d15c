#!/usr/bin/env bash
# Copy a dataset once to node-local storage on every node of the current Slurm job, so
# training reads from local disk instead of the shared file system.
#
#   stage_data.sh SRC DEST           stage on every node (on this machine alone outside Slurm)
#   stage_data.sh --path SRC DEST    print the staged path to give resnet_ddp as --data
#   stage_data.sh --remove SRC DEST  delete the staged copy on every node
#
# SRC (on a file system every node can read) is one of
#   - a tarball (.tar.gz .tgz .tar .tar.xz .tar.bz2 .tar.zst) holding ONE top-level folder,
#     e.g. data.tar.gz with Dataset_2/{Train,Validation}/... -> DEST/Dataset_2
#   - a directory (an ImageFolder tree)                      -> DEST/<its name>
#   - a single file, typically a packed .h5                  -> DEST/<its name>
# DEST is the node-local folder, normally /tmp. "%n" in DEST becomes the node's name; that is
# for machines whose "nodes" share one /tmp (Slurm's multiple-slurmd test set-ups).
#
# One task per node runs the copy (srun, not an ssh loop). A node that already holds an
# identical copy (same source path, size and time stamp; staged tree unchanged) is skipped.
# Afterwards every node's file count and byte total are checked against the source; any
# node that differs, fails or does not answer is named and the script exits non-zero.
set -euo pipefail

readonly PROG=stage_data.sh
SELF=$(readlink -f "${BASH_SOURCE[0]}")
readonly SELF

die() {
  echo "$PROG: error: $*" >&2
  exit 1
}
usage() {
  sed -n '2,13p' "$SELF" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

source_kind() { # tar | dir | file
  case $1 in
    *.tar.gz | *.tgz | *.tar | *.tar.xz | *.txz | *.tar.bz2 | *.tbz2 | *.tar.zst | *.tzst) echo tar ;;
    *) if [[ -d $1 ]]; then echo dir; else echo file; fi ;;
  esac
}

# Name of the staged entry under DEST. For a tarball, the first path component of its first
# member (reading stops there, so this is cheap even for a large archive).
staged_name() {
  local src=$1 first
  case $(source_kind "$src") in
    tar)
      first=$(set +o pipefail; tar -tf "$src" 2>/dev/null | head -n 1)
      first=${first#./}
      first=${first%%/*}
      [[ -n $first ]] ||
        die "$src: cannot read a first member, or it is '.' (pack one folder: tar czf data.tar.gz Dataset_2)"
      echo "$first"
      ;;
    *) basename "$src" ;;
  esac
}

node_name() { echo "${SLURMD_NODENAME:-$(hostname -s)}"; }
node_dest() { local dest=$1; echo "${dest//%n/$(node_name)}"; }

say_stats() { echo "${1% *} files, ${1#* } bytes"; }

# "FILES BYTES" of the regular files under PATH (PATH itself if it is a file).
tree_stats() {
  find "$1" -type f -printf '%s\n' | awk '{ n++; s += $1 } END { printf "%d %.0f\n", n, s }'
}

# What the staged copy must contain, computed from the source.
source_stats() {
  local src=$1
  case $(source_kind "$src") in
    tar) # Regular members ('-' in the mode column); the size is the third column.
      tar -tvf "$src" | awk '$1 ~ /^-/ { n++; s += $3 } END { printf "%d %.0f\n", n, s }' ;;
    *) tree_stats "$src" ;;
  esac
}

# Identifies the source version a staged copy came from.
source_identity() {
  local src=$1 real
  real=$(readlink -f "$src")
  if [[ -d $src ]]; then
    echo "$real $(find "$src" -type f -printf '%s %T@\n' |
      awk '{ n++; s += $1; if ($2 > t) t = $2 } END { printf "%d %.0f %.0f", n, s, t }')"
  else
    echo "$real $(stat -L -c '%s %Y' "$src")"
  fi
}

# --- one node's work (run by srun on every node, or directly outside Slurm) --------------
# Prints a human line and a machine line "STAGE_RESULT node status files bytes".
node_stage_work() {
  local src=$1 dest=$2 node name target manifest identity stats start tmp
  node=$(node_name)
  dest=$(node_dest "$dest")
  name=$(staged_name "$src")
  target=$dest/$name
  manifest=$dest/.$name.staged
  start=$(now)
  identity=$(source_identity "$src")
  if [[ -e $target && -f $manifest ]] && [[ $(sed -n 1p "$manifest") == "$identity" ]]; then
    stats=$(tree_stats "$target")
    if [[ $(sed -n 2p "$manifest") == "$stats" ]]; then
      echo "$PROG: node $node: identical copy already at $target ($(say_stats "$stats")), skipped in $(elapsed "$start") s"
      echo "STAGE_RESULT $node skipped $stats"
      return 0
    fi
  fi
  mkdir -p "$dest"
  rm -rf "$target" "$manifest"
  # Build in a hidden folder next to the target and rename at the end, so an interrupted
  # copy never looks like a complete one.
  tmp=$(mktemp -d "$dest/.$name.partial.XXXXXX")
  case $(source_kind "$src") in
    tar)
      tar -xf "$src" -C "$tmp"
      local entries
      entries=$(cd "$tmp" && find . -mindepth 1 -maxdepth 1 -printf '%P\n' | sort | tr '\n' ' ')
      if [[ $entries != "$name " ]]; then
        rm -rf "$tmp"
        die "$src must hold one top-level folder; it holds: $entries"
      fi
      ;;
    dir) cp -a "$src" "$tmp/$name" ;;
    file) cp -p "$src" "$tmp/$name" ;;
  esac
  mv "$tmp/$name" "$target"
  rmdir "$tmp"
  stats=$(tree_stats "$target")
  printf '%s\n%s\n' "$identity" "$stats" >"$manifest"
  echo "$PROG: node $node: staged $(basename "$src") to $target ($(say_stats "$stats")) in $(elapsed "$start") s"
  echo "STAGE_RESULT $node staged $stats"
}

node_stage() {
  local rc
  # A subshell with errexit of its own: any failing step fails this node, which then still
  # reports, so the coordinator can name it. (Not `( ) || rc=$?`: errexit is ignored there.)
  set +e
  (
    set -e
    node_stage_work "$@"
  )
  rc=$?
  set -e
  if ((rc != 0)); then
    echo "$PROG: node $(node_name): FAILED (exit $rc) staging $1 to $(node_dest "$2")"
    echo "STAGE_RESULT $(node_name) failed - -"
  fi
  return 0
}

node_remove() {
  local src=$1 dest name
  dest=$(node_dest "$2")
  name=$(staged_name "$src")
  rm -rf "${dest:?}/$name" "$dest/.$name.staged" "$dest/.$name".partial.*
  echo "$PROG: node $(node_name): removed $dest/$name"
}

# Runs "$SELF MODE SRC DEST" once on every node of the job; output goes to stdout.
on_every_node() {
  srun --nodes="$SLURM_NNODES" --ntasks="$SLURM_NNODES" --ntasks-per-node=1 \
    --mpi=none --kill-on-bad-exit=0 "$SELF" "$@"
}

in_slurm_job() { [[ -n ${SLURM_JOB_ID:-} && -n ${SLURM_NNODES:-} ]]; }

# --- coordinator ---------------------------------------------------------------------------
stage_everywhere() {
  local src=$1 dest=$2 start results srun_pid srun_rc=0 expected nodes
  start=$(now)
  results=$(mktemp "${TMPDIR:-/tmp}/stage_data.XXXXXX")
  # shellcheck disable=SC2064  # expand now: the path is fixed
  trap "rm -f '$results'" EXIT
  if in_slurm_job; then
    nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tr '\n' ' ')
    echo "$PROG: staging $src to $dest on $SLURM_NNODES node(s): $nodes"
    on_every_node --node-stage "$src" "$dest" >"$results" 2>&1 &
    srun_pid=$!
  else
    nodes="$(node_name) "
    echo "$PROG: not inside a Slurm job: staging $src to $dest on this machine only"
    node_stage "$src" "$dest" >"$results" 2>&1 &
    srun_pid=$!
  fi
  # Read the source's expected totals while the nodes copy.
  expected=$(source_stats "$src") || die "cannot list $src"
  wait "$srun_pid" || srun_rc=$?
  grep -v '^STAGE_RESULT ' "$results" || true

  local node status files bytes bad=() seen=" "
  while read -r _ node status files bytes; do
    seen+="$node "
    if [[ $status == failed ]]; then
      bad+=("$node (failed, see above)")
    elif [[ "$files $bytes" != "$expected" ]]; then
      bad+=("$node (has $(say_stats "$files $bytes"), the source has $(say_stats "$expected"))")
    fi
  done < <(grep '^STAGE_RESULT ' "$results" || true)
  for node in $nodes; do
    [[ $seen == *" $node "* ]] || bad+=("$node (no report; srun exit $srun_rc)")
  done
  if ((${#bad[@]} > 0)); then
    die "staging failed on: ${bad[*]}"
  fi
  echo "$PROG: every node holds $(say_stats "$expected") at $(node_dest "$dest")/$(staged_name "$src"); total $(elapsed "$start") s"
}

remove_everywhere() {
  if in_slurm_job; then
    on_every_node --node-remove "$1" "$2"
  else
    node_remove "$1" "$2"
  fi
}

main() {
  local mode=stage
  case ${1:-} in
    --path | --remove | --node-stage | --node-remove)
      mode=${1#--}
      shift
      ;;
    -h | --help) usage ;;
    -*) echo "$PROG: unknown option $1" >&2; usage ;;
  esac
  (($# == 2)) || usage
  local src=$1 dest=$2
  [[ -n $dest ]] || die "DEST is empty"
  [[ -e $src ]] || die "source $src does not exist (node $(node_name))"
  [[ -r $src ]] || die "source $src is not readable (node $(node_name))"
  local name
  case $mode in
    path) # Assigned first: a failure inside $(...) within echo's arguments would be lost.
      name=$(staged_name "$src")
      echo "$(node_dest "$dest")/$name"
      ;;
    stage) stage_everywhere "$src" "$dest" ;;
    remove) remove_everywhere "$src" "$dest" ;;
    node-stage) node_stage "$src" "$dest" ;;
    node-remove) node_remove "$src" "$dest" ;;
  esac
}

main "$@"
