#!/usr/bin/env bash
# Turns a resnet_ddp metrics CSV (one row per epoch) into loss and accuracy curves.
#   tools/plot_metrics.sh [METRICS.csv] [OUT.png]
# Defaults: output_model/metrics.csv -> METRICS dir/curves.png. Needs gnuplot
# (Debian: gnuplot-nox).
set -euo pipefail

usage() { sed -n '2,5s/^# \{0,1\}//p' "$0"; }
case "${1:-}" in -h | --help) usage; exit 0 ;; esac

csv=${1:-output_model/metrics.csv}
out=${2:-$(dirname "$csv")/curves.png}
if [ $# -gt 2 ]; then usage >&2; exit 2; fi
command -v gnuplot >/dev/null || { echo "plot_metrics: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }
[ -r "$csv" ] || { echo "plot_metrics: cannot read '$csv'" >&2; exit 2; }
head -n 1 "$csv" | grep -q '^epoch,time_s,train_loss,train_acc,val_loss,val_acc' ||
  { echo "plot_metrics: '$csv' is not a resnet_ddp metrics file (unexpected header)" >&2; exit 2; }
rows=$(($(wc -l <"$csv") - 1))
[ "$rows" -ge 1 ] || { echo "plot_metrics: '$csv' has no epochs yet" >&2; exit 2; }

first=$(awk -F, 'NR == 2 { print $1 }' "$csv")
# The top-5 column (val_acc5) by name: files from before it have none.
acc5=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "val_acc5") print i }' "$csv")
acc5_curve=""
[ -z "$acc5" ] || acc5_curve=", '' using 1:$acc5 with linespoints title 'val top-5 accuracy'"
last=$(tail -n 1 "$csv" | cut -d, -f1)
# At most ~15 labelled epochs: one per epoch runs the numbers into each other.
xstep=$(((last - first) / 15 + 1))

# pngcairo draws nicer lines; plain png (libgd) is the fallback.
term=png
gnuplot -e 'set terminal pngcairo' 2>/dev/null && term=pngcairo

gnuplot <<GP
set terminal $term size 1200,500 noenhanced
set output '$out'
set datafile separator ','
set key autotitle columnhead
# The legend goes under each plot, never on the curves (accuracy rises into the top
# right corner where gnuplot puts it by default).
set key outside below center horizontal samplen 1.5 width -1
set multiplot layout 1,2 title 'resnet_ddp: $(basename "$csv") ($rows epochs)'
set xlabel 'epoch'
set grid
set xtics $xstep
set xrange [$first - 0.5:$last + 0.5]
set title 'loss'
plot '$csv' using 1:3 with linespoints title 'train loss', '' using 1:5 with linespoints title 'val loss'
set title 'accuracy'
set yrange [0:1]
plot '$csv' using 1:4 with linespoints title 'train accuracy', '' using 1:6 with linespoints title 'val accuracy', '' using 1:7 with lines dashtype 2 title 'best val accuracy'$acc5_curve
unset multiplot
GP
echo "plot_metrics: wrote $out"
