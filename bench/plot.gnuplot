# Plots for bench/summarize.py (one PNG per section):
#   gnuplot -e "section='step'; data='bench/results.raw/plot_step.dat'; out='x.png'" bench/plot.gnuplot
# section: step | epoch | ddp | loader | scaling (data files written by summarize.py).
set terminal pngcairo noenhanced size 900,520 font "DejaVu Sans,11"
set output out
set grid ytics lc rgb "#dddddd"
set bmargin 4
set key top left
set border 3
set tics nomirror

if (section eq 'step') {
  set title "Training step, fp32, equal threads (median, whiskers = slowest/fastest step)"
  set ylabel "images / s"
  set style data histograms
  set style histogram errorbars gap 2 lw 1.5
  set style fill solid 0.85 border -1
  set logscale y
  set yrange [0.5:*]
  plot data using 2:3:4:xtic(1) title "resnet_ddp" lc rgb "#1f77b4", \
       ''   using 5:6:7 title "PyTorch" lc rgb "#ff7f0e"
}

if (section eq 'epoch') {
  set title "Reference-recipe epoch, 2 ranks: where the wall time goes (median run)"
  set ylabel "seconds"
  set style data histograms
  set style histogram rowstacked
  set style fill solid 0.85 border -1
  set boxwidth 0.5
  set yrange [0:*]
  plot data using 2:xtic(1) title "training compute (incl. comm, optimizer)" lc rgb "#1f77b4", \
       ''   using 3 title "training: waiting for data" lc rgb "#d62728", \
       ''   using 4 title "validation" lc rgb "#2ca02c"
}

if (section eq 'ddp') {
  set title "DDP exposed communication vs bucket size (2 ranks, median with min/max)"
  set xlabel "bucket size (MB)"
  set ylabel "exposed communication, % of step"
  set logscale x 2
  set yrange [0:*]
  set key top right
  plot data using 1:2:3:4 with yerrorlines lw 2 pt 7 lc rgb "#1f77b4" title "overlap on", \
       ''   using 1:5:6:7 with yerrorlines lw 2 pt 5 lc rgb "#ff7f0e" title "overlap off", \
       5 with lines dt 2 lc rgb "#888888" title "target 5 %"
}

if (section eq 'loader') {
  set title "Data loader, AutoAugment + Resize, 1 worker (median, min/max)"
  set ylabel "images / s per core"
  set style data histograms
  set style histogram errorbars gap 2 lw 1.5
  set style fill solid 0.85 border -1
  set logscale y
  set yrange [10:*]
  set key off
  plot data using 2:3:4:xtic(1) lc rgb "#1f77b4"
}

if (section eq 'scaling') {
  set terminal pngcairo noenhanced size 1000,560 font "DejaVu Sans,11"
  set output out
  set title "MODELLED weak-scaling efficiency, batch 16 per GPU (solid: overlap, dashed: no overlap)"
  set xlabel "GPUs (2 nodes; the ring crosses InfiniBand past one node)"
  set ylabel "scaling efficiency"
  set yrange [0:1.05]
  set xrange [1:8]
  set key bottom left
  # Blocks in the data file: frontera r34 fp16, r34 fp32, r50 fp16, r50 fp32, then
  # lonestar6 r34 bf16, r34 tf32, r50 bf16, r50 tf32.
  plot data index 1 using 1:2 with linespoints lw 2 pt 7 lc rgb "#1f77b4" title "RTX 5000 + FDR, ResNet-34@244 fp32", \
       data index 1 using 1:3 with linespoints lw 1 dt 2 pt 7 lc rgb "#1f77b4" notitle, \
       data index 0 using 1:2 with linespoints lw 2 pt 6 lc rgb "#17becf" title "RTX 5000 + FDR, ResNet-34@244 fp16", \
       data index 0 using 1:3 with linespoints lw 1 dt 2 pt 6 lc rgb "#17becf" notitle, \
       data index 3 using 1:2 with linespoints lw 2 pt 5 lc rgb "#ff7f0e" title "RTX 5000 + FDR, ResNet-50@224 fp32", \
       data index 3 using 1:3 with linespoints lw 1 dt 2 pt 5 lc rgb "#ff7f0e" notitle, \
       data index 5 using 1:2 with linespoints lw 2 pt 9 lc rgb "#2ca02c" title "A100 + HDR, ResNet-34@244 tf32", \
       data index 5 using 1:3 with linespoints lw 1 dt 2 pt 9 lc rgb "#2ca02c" notitle, \
       data index 4 using 1:2 with linespoints lw 2 pt 8 lc rgb "#98df8a" title "A100 + HDR, ResNet-34@244 bf16", \
       data index 4 using 1:3 with linespoints lw 1 dt 2 pt 8 lc rgb "#98df8a" notitle, \
       data index 6 using 1:2 with linespoints lw 2 pt 11 lc rgb "#d62728" title "A100 + HDR, ResNet-50@224 bf16", \
       data index 6 using 1:3 with linespoints lw 1 dt 2 pt 11 lc rgb "#d62728" notitle
}
