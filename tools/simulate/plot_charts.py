#!/usr/bin/env python3
"""Draws the chart data that `simulate --out DIR` writes (DIR/ttft_cdf.csv; with --sweep,
ttft_cdf_80.csv and ttft_vs_load.csv) as PNGs beside it: a.csv -> a.png.

Each CSV is one figure, a row per point: panel,title,x_label,y_label,x_scale,kind,series,x,y.
Panels are laid out three to a row. A series keeps its colour, line style and marker in every
panel, so that series that coincide stay visible, and one legend below the panels names them all.

    python3 tools/simulate/plot_charts.py results/ttft_cdf.csv [more.csv ...] [-o out.png]

Needs matplotlib (python3 -m pip install matplotlib).
"""
import argparse
import csv
import math
import os
import sys

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
LINESTYLES = ["-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (1, 1)), (0, (8, 2)), (0, (3, 1, 1, 1, 1, 1))]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
CDF_MARKS = 8  # markers per CDF curve: enough to tell curves apart, few enough not to hide them


def read_figure(path):
    """Panels in file order: {panel: {"meta": {...}, "series": {label: ([x], [y])}}}."""
    panels = {}
    with open(path, newline="") as f:
        rows = csv.DictReader(f)
        needed = {"panel", "title", "x_label", "y_label", "x_scale", "kind", "series", "x", "y"}
        if rows.fieldnames is None or not needed <= set(rows.fieldnames):
            raise ValueError(f"{path}: expected the columns {','.join(sorted(needed))}")
        for line, row in enumerate(rows, start=2):
            try:
                x, y = float(row["x"]), float(row["y"])
            except ValueError:
                raise ValueError(f"{path}:{line}: x '{row['x']}' or y '{row['y']}' is not a number") from None
            p = panels.setdefault(row["panel"], {"meta": row, "series": {}})
            xs, ys = p["series"].setdefault(row["series"], ([], []))
            xs.append(x)
            ys.append(y)
    if not panels:
        raise ValueError(f"{path}: no points")
    return list(panels.values())


def log_axis(axis, values):
    """Round ticks, plainly written: 1-2-5 per decade over short ranges, decades over long ones."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    positive = [v for v in values if v > 0]
    decades = math.log10(max(positive) / min(positive)) if positive else 0
    axis.set_major_locator(LogLocator(base=10, subs=(1.0,) if decades > 3 else (1.0, 2.0, 5.0)))
    axis.set_minor_formatter(NullFormatter())
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def draw(path, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator, MultipleLocator

    panels = read_figure(path)
    labels = []  # every series of the figure, in order of first appearance: one style each
    for p in panels:
        labels += [s for s in p["series"] if s not in labels]
    style = {
        s: dict(color=COLORS[i % len(COLORS)], linestyle=LINESTYLES[i % len(LINESTYLES)],
                marker=MARKERS[i % len(MARKERS)])
        for i, s in enumerate(labels)
    }
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    legend_rows = math.ceil(len(labels) / min(len(labels), 5))
    legend_height = 0.28 * legend_rows + 0.12  # inches below the panels
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 4.0 * rows + legend_height), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, p in zip(axes.flat, panels):
        meta = p["meta"]
        cdf = meta["kind"] == "cdf"
        for label, (xs, ys) in p["series"].items():
            k = labels.index(label)
            # Markers at a few points, shifted per series so that coinciding curves show each marker.
            step = max(1, len(xs) // CDF_MARKS)
            every = (k * step // max(1, len(labels)) % step, step) if cdf else None
            ax.plot(xs, ys, linewidth=1.6, markersize=5, markevery=every, **style[label])
        all_x = [x for xs, _ in p["series"].values() for x in xs]
        all_y = [y for _, ys in p["series"].values() for y in ys]
        if meta["x_scale"] == "log":
            ax.set_xscale("log")
            log_axis(ax.xaxis, all_x)
        if cdf:
            ax.set_ylim(0, 1.0)
            ax.yaxis.set_major_locator(MultipleLocator(0.2))
        elif min(all_y) > 0 and max(all_y) > 100 * min(all_y):
            # Values over more than two decades: a linear axis would flatten the small ones onto 0.
            ax.set_yscale("log")
            log_axis(ax.yaxis, all_y)
        else:
            ax.set_ylim(bottom=0)
            ax.yaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
        if not cdf and meta["x_scale"] != "log" and len(set(all_x)) <= 8:
            ax.set_xticks(sorted(set(all_x)))  # the measured points themselves, not interpolated ticks
        ax.set_title(meta["title"], fontsize=11)
        ax.set_xlabel(meta["x_label"])
        ax.set_ylabel(meta["y_label"] + (", log scale" if ax.get_yscale() == "log" else ""))
        ax.grid(True, which="major", alpha=0.3)
    handles = [plt.Line2D([], [], linewidth=1.6, markersize=5, **style[s]) for s in labels]
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), frameon=False,
               borderaxespad=0.2)
    fig.tight_layout(rect=(0, legend_height / fig.get_figheight(), 1, 1))
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="+", help="chart data written by simulate --out")
    parser.add_argument("-o", "--output", help="the PNG to write (one CSV only; default: the CSV's name, .png)")
    args = parser.parse_args()
    if args.output and len(args.csv) > 1:
        parser.error("-o takes one CSV")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("plot_charts.py: matplotlib is missing; install it with: python3 -m pip install matplotlib")
    for path in args.csv:
        out = args.output or os.path.splitext(path)[0] + ".png"
        try:
            draw(path, out)
        except (OSError, ValueError) as e:
            sys.exit(f"plot_charts.py: {e}")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
