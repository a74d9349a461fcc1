"""Line styles, line widths, labels and the legend layout of the report and compare figures.

The figures keep a fixed width: legends go *below* the axes (the figure grows in height,
never in width), labels are shortened, and every metric of a panel gets its own
(line style, marker) pair so no two lines of a panel look alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

FIG_WIDTH_IN, FIG_HEIGHT_IN, DPI = 7.0, 3.6, 110
LINESTYLES = ("-", "--", ":", "-.")
# 13 entries, coprime with the 4 line styles: see metric_styles.
MARKERS = (None, "o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p")
MAX_STYLES = len(LINESTYLES) * len(MARKERS)
MARKS_PER_LINE = 12
LABEL_WIDTH = 48


@dataclass(frozen=True)
class Style:
    """How one metric's line is drawn (its colour is chosen by the caller)."""

    linestyle: str
    marker: str | None


def metric_styles(n: int) -> list[Style]:
    """``n`` distinct (line style, marker) pairs, the plain solid line first.

    Style ``i`` is ``(LINESTYLES[i % 4], MARKERS[i % 13])``; since 4 and 13 are coprime,
    ``i -> (i mod 4, i mod 13)`` is one-to-one for ``i < 52`` (Chinese remainder theorem),
    so the styles never repeat within a panel of up to 52 metrics.

    Raises:
        ValueError: ``n > 52`` (a panel that crowded is unreadable anyway).
    """
    if n > MAX_STYLES:
        raise ValueError(f"{n} metrics in one panel; at most {MAX_STYLES} have distinct styles")
    return [Style(LINESTYLES[i % len(LINESTYLES)], MARKERS[i % len(MARKERS)]) for i in range(n)]


def line_widths(n: int, widest: float = 2.6, thinnest: float = 1.2) -> list[float]:
    """Decreasing widths in drawing order: a later line drawn exactly over an earlier one
    leaves the earlier line's edges visible (two runs or metrics that coincide stay two)."""
    if n <= 1:
        return [2.0] * n
    return [widest - (widest - thinnest) * i / (n - 1) for i in range(n)]


def shorten(text: str, width: int = LABEL_WIDTH) -> str:
    """``text`` cut to ``width`` characters with an ellipsis in the middle (both ends of a
    run name or a path carry meaning)."""
    if len(text) <= width:
        return text
    keep = width - 1
    head = (keep + 1) // 2
    return text[:head] + "…" + text[len(text) - (keep - head):]


def metric_labels(keys: Sequence[str]) -> tuple[str, list[str]]:
    """Legend title and labels for a panel's metric keys: a path part every key shares at
    the start or the end goes into the title (``reward/format/mean`` -> ``format`` under
    ``reward/…/mean``), so the labels stay short."""
    parts = [k.split("/") for k in keys]
    if len(keys) < 2 or min(map(len, parts)) < 2:
        return "", list(keys)
    head = 0
    while head < min(map(len, parts)) - 1 and len({p[head] for p in parts}) == 1:
        head += 1
    tail = 0
    while tail < min(map(len, parts)) - head - 1 and len({p[-1 - tail] for p in parts}) == 1:
        tail += 1
    if head == tail == 0:
        return "", list(keys)
    sample = parts[0]
    title = "/".join(sample[:head] + ["…"] + sample[len(sample) - tail:])
    return title, ["/".join(p[head:len(p) - tail]) for p in parts]


def new_figure(rows: int = 1) -> tuple[Any, list[Any]]:
    """A figure of the fixed width with ``rows`` stacked axes (shared step axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    height = FIG_HEIGHT_IN if rows == 1 else 1.2 + 1.5 * rows
    fig, axes = plt.subplots(rows, 1, figsize=(FIG_WIDTH_IN, height), dpi=DPI, sharex=True,
                             squeeze=False)
    for ax in axes[:, 0]:
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    return fig, list(axes[:, 0])


def legends_below(fig: Any, ax: Any, groups: Sequence[tuple[str, list, list[str]]]) -> None:
    """Stack one legend per ``(title, handles, labels)`` group under ``ax``, each with as many
    columns (at most 4) as fit within the figure's width."""
    from matplotlib.legend import Legend

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    to_axes = ax.transAxes.inverted()
    top = to_axes.transform((0, ax.get_tightbbox(renderer).y0))[1] - 0.02
    room = fig.get_figwidth() * fig.dpi - ax.get_window_extent(renderer).x0
    for title, handles, labels in groups:
        if not labels:
            continue
        for ncol in range(min(len(labels), 4), 0, -1):
            legend = Legend(ax, handles, labels, title=title, ncols=ncol, loc="upper left",
                            bbox_to_anchor=(0.0, top), fontsize=8, title_fontsize=8,
                            frameon=False, alignment="left", handlelength=3.0)
            legend.set_figure(fig)
            if ncol == 1 or legend.get_window_extent(renderer).width <= room:
                break
        ax.add_artist(legend)
        top = to_axes.transform((0, legend.get_window_extent(renderer).y0))[1]


def save(fig: Any, path: Path) -> None:
    """Write the PNG with every legend (and the title) inside the saved area, then free the
    figure."""
    import matplotlib.pyplot as plt
    from matplotlib.legend import Legend

    legends = [a for ax in fig.axes for a in ax.get_children() if isinstance(a, Legend)]
    fig.savefig(path, bbox_inches="tight", bbox_extra_artists=legends + list(fig.texts))
    plt.close(fig)
