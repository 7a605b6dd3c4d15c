#!/usr/bin/env bash
# tools/apptainer/resnet_ddp.def installs exactly the Makefile's DEB_BUILD packages from
# Debian bookworm and builds and installs resnet_ddp with make.
set -euo pipefail
def=$RD_SOURCE_DIR/tools/apptainer/resnet_ddp.def
fail() { echo "FAIL: $*" >&2; exit 1; }

# The Makefile's list, as make expands it.
deb_build=$(make --no-print-directory -s -C "$RD_SOURCE_DIR" -f Makefile -f - print-deb-build <<<'print-deb-build: ; @echo $(DEB_BUILD)')
[ -n "$deb_build" ] || fail "no DEB_BUILD in the Makefile"
# The .def's %post: the words after `apt-get install ... ` up to the end of that command.
post=$(awk '/^%/ { in_post = ($1 == "%post") } in_post' "$def")
install=$(sed -n '/apt-get install/,/[^\\]$/p' <<<"$post" | tr -d '\\' | tr -s ' \n' '\n' |
  grep -v -E '^(apt-get|install|-.*|)$')
want=$(tr ' ' '\n' <<<"$deb_build" | sort)
have=$(sort <<<"$install")
if [ "$want" != "$have" ]; then
  diff <(echo "$want") <(echo "$have") >&2 || true
  fail "$def installs other packages than the Makefile's DEB_BUILD (< Makefile, > .def)"
fi
grep -q -x 'Bootstrap: docker' "$def" || fail "not bootstrapped from a docker image"
grep -q -x 'From: debian:bookworm' "$def" || fail "not Debian bookworm"
grep -q -E '^ +make build ' <<<"$post" || fail "%post does not build with make"
grep -q -E '^ +make install PREFIX=/opt/resnet_ddp$' <<<"$post" || fail "%post does not install to /opt/resnet_ddp"
echo "ok: $(wc -w <<<"$deb_build") packages, as in the Makefile"
