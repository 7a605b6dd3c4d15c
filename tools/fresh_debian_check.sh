#!/usr/bin/env bash
# Proves `make test` (or another target) works on a brand-new Debian 12 that has
# nothing but `make`: builds a debootstrap minbase chroot, clones this repository's
# committed HEAD into it, and runs the target there (CUDA absent, as on most hosts).
#   tools/fresh_debian_check.sh [CHROOT_DIR] [make target...]
#   tools/fresh_debian_check.sh --apptainer-def DEF [CHROOT_DIR]
# The second form runs an Apptainer definition's build as `apptainer build` would on
# its `From: debian:bookworm` (where no apptainer is installed): the %files line
# `. DEST` clones HEAD to DEST, then the %post section and the %test section run in
# the fresh chroot (tools/apptainer/resnet_ddp.def: the Debian packages, a CPU-only
# build, `make install`, `resnet_ddp --version`).
# The clone lives at /src (FRESH_CLONE_DIR), a short path at the root: where the
# join bug `//src/jobs` showed up, so tests must not depend on the clone's path.
# Needs root and the debootstrap package; takes ~30 s plus the target's time.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
def=""
if [ "${1:-}" = --apptainer-def ]; then
  def=$(cd "$(dirname "${2:?--apptainer-def DEF}")" && pwd)/$(basename "$2")
  shift 2
  [ -f "$def" ] || { echo "fresh_debian_check: $def: no such definition file" >&2; exit 2; }
fi
root=${1:-/tmp/resnet_ddp_fresh_debian}
shift || true
targets=("${@:-test}")
clone=${FRESH_CLONE_DIR:-/src}

if [ "$(id -u)" != 0 ]; then echo "fresh_debian_check: must run as root (chroot)" >&2; exit 2; fi
command -v debootstrap >/dev/null || { echo "fresh_debian_check: apt-get install debootstrap" >&2; exit 2; }

if [ ! -x "$root/bin/bash" ]; then
  echo "== debootstrap --variant=minbase bookworm $root"
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian
fi
cleanup() { for m in dev/pts dev sys proc; do umount -l "$root/$m" 2>/dev/null || true; done; }
trap cleanup EXIT
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
in_chroot() {
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    CI="${CI:-true}" CI_SANITIZE="${CI_SANITIZE:-}" bash -c "$1"
}

if [ -n "$def" ]; then
  # section NAME: the lines of %NAME up to the next %section, as the definition has them.
  section() { awk -v s="%$1" '/^%/ { on = ($1 == s); next } on' "$def"; }
  dest=$(section files | awk '$1 == "." { print $2 }')
  [ -n "$dest" ] || { echo "fresh_debian_check: $def: no '%files' line '. DEST'" >&2; exit 2; }
  rm -rf "${root:?}$dest"
  mkdir -p "$(dirname "$root$dest")"
  git clone -q "$repo" "$root$dest"
  section post > "$root/tmp/post.sh"
  section environment > "$root/tmp/environment.sh"
  section test > "$root/tmp/test.sh"
  echo "== %post of $def"
  in_chroot "bash -e /tmp/post.sh"
  echo "== %test"
  in_chroot ". /tmp/environment.sh && bash -e /tmp/test.sh"
  echo "fresh_debian_check: $(basename "$def")'s %post and %test passed in a fresh Debian chroot"
  exit 0
fi

rm -rf "${root:?}$clone"
git clone -q "$repo" "$root$clone"
in_chroot "apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q make >/dev/null && cd $clone && make ${targets[*]}"
echo "fresh_debian_check: make ${targets[*]} passed in a fresh Debian chroot"
