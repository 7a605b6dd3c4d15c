#!/usr/bin/env bash
# Times the stages of `make test` (CI's whole run) so that where the minutes go is printed
# at the end of every run, not guessed:
#   tools/stage_time.sh FILE NAME COMMAND...   run COMMAND, append "NAME SECONDS RC" to FILE,
#                                              exit with COMMAND's status
#   tools/stage_time.sh --report FILE          print the stages and their total
set -uo pipefail
if [[ ${1:-} == --report ]]; then
  file=${2:?usage: stage_time.sh --report FILE}
  [[ -s $file ]] || exit 0
  echo "== make test: time per stage (wall clock; ctest's 'Label Time Summary' above splits the ctest stage)"
  awk '{ printf "  %-16s %6d s  %5.1f min%s\n", $1, $2, $2 / 60, ($3 == 0 ? "" : "  (failed, rc " $3 ")"); t += $2 }
       END { printf "  %-16s %6d s  %5.1f min\n", "total", t, t / 60 }' "$file"
  exit 0
fi
file=${1:?usage: stage_time.sh FILE NAME COMMAND...}
name=${2:?usage: stage_time.sh FILE NAME COMMAND...}
shift 2
mkdir -p "$(dirname "$file")"
start=$(date +%s)
"$@"
rc=$?
echo "$name $(( $(date +%s) - start )) $rc" >> "$file"
exit $rc
