#!/usr/bin/env bash
# pkg-config as if the modules named in RD_PKG_HIDE (space-separated) were not installed.
for arg in "$@"; do
  for hidden in $RD_PKG_HIDE; do
    [[ $arg == "$hidden" || $arg == "$hidden"[\<\>=\ ]* ]] && { echo "Package $hidden was not found" >&2; exit 1; }
  done
done
exec pkg-config "$@"
