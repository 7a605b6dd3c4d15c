#!/usr/bin/env bash
# tools/plot_metrics.sh keeps its legend off the curves: 30 epochs whose accuracy rises
# into the top right corner (where gnuplot puts the key by default) are plotted, and no
# text may lie inside either plot's frame (legend_off_curves.py reads the PNG's pixels).
source "$(dirname "$0")/common.sh"
command -v gnuplot >/dev/null || { echo "SKIP: gnuplot is not installed" >&2; exit 77; }
/usr/bin/python3 -c 'import PIL' 2>/dev/null || { echo "SKIP: Debian python3-pil is not installed" >&2; exit 77; }

csv="$WORK/metrics.csv"
# With the top-5 column (found by name), its curve near 1.0 and its legend entry too.
echo "epoch,time_s,train_loss,train_acc,val_loss,val_acc,best_val_acc,lr,val_acc5" >"$csv"
awk 'BEGIN { b = 0; for (e = 1; e <= 30; e++) {
  v = 1 - 0.92 * exp(-e / 7) - 0.02; if (v > b) b = v
  printf "%d,10,%.4f,%.4f,%.4f,%.4f,%.4f,0.001,%.4f\n", e, 2 * exp(-e / 8) + 0.1, 1 - 0.9 * exp(-e / 6),
    2.1 * exp(-e / 9) + 0.15, v, b, 1 - 0.5 * exp(-e / 3) } }' >>"$csv"
for rows in 3 30; do
  head -n $((rows + 1)) "$csv" >"$WORK/m$rows.csv"
  "$RD_ROOT/tools/plot_metrics.sh" "$WORK/m$rows.csv" "$WORK/m$rows.png" || fail "plot_metrics.sh ($rows epochs)"
  /usr/bin/python3 "$RD_ROOT/tests/e2e/legend_off_curves.py" "$WORK/m$rows.png" ||
    fail "$rows epochs: text inside a plot frame (the legend over the curves)"
done
note "ok"
