"""Checks a PNG from tools/plot_metrics.sh: inside each plot's frame there is no text.

gnuplot draws frames, tick labels and legend text in black; curves are coloured and the
grid light grey. The frame of a plot is the pair of long black horizontal lines with the
same ends; dark pixels well inside it (past the inward tick marks) can only be a legend
drawn over the curves.  Usage: legend_off_curves.py FILE.png  (exit 1 naming the plot)
"""
import sys

from PIL import Image

im = Image.open(sys.argv[1]).convert("RGB")
W, H = im.size
px = im.load()


def dark(p):
    return max(p) < 80


segments = {}  # (x0, x1) -> rows with a long black run there
for y in range(H):
    x = 0
    while x < W:
        if dark(px[x, y]):
            s = x
            while x < W and dark(px[x, y]):
                x += 1
            if x - s > 200:
                segments.setdefault((s, x - 1), []).append(y)
        x += 1
frames = [(x0, x1, min(ys), max(ys)) for (x0, x1), ys in segments.items() if max(ys) - min(ys) > 100]
if len(frames) != 2:
    sys.exit(f"{sys.argv[1]}: expected 2 plot frames, found {len(frames)}: {frames}")
inset = 15  # beyond the tick marks gnuplot draws inward from the frame
bad = False
for x0, x1, y0, y1 in sorted(frames):
    n = sum(1 for y in range(y0 + inset, y1 - inset) for x in range(x0 + inset, x1 - inset) if dark(px[x, y]))
    print(f"plot at x {x0}-{x1}, y {y0}-{y1}: {n} dark pixels inside the frame")
    bad |= n > 0
sys.exit(1 if bad else 0)
