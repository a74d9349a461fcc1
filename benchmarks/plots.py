"""Plots of stored records, drawn as SVG with matplotlib (:mod:`render` places them on the pages).

A benchmark module's ``PLOTS[name]`` turns a record's figures into a spec, a plain dict::

    {"kind": "bars", "title": ..., "labels": [...], "series": {"name": [values]}, "unit": "x TRL", "line": 1.0}
    {"kind": "stacked", "title": ..., "labels": [...], "series": {"part": [values]}, "unit": "s per step"}
    {"kind": "lines", "title": ..., "x": [...], "series": {"name": [values]}, "xlabel": ..., "unit": ...,
     "color": {"name": 0}, "dashed": ["name"]}

``bars`` draws grouped horizontal bars (``line``: a reference drawn across, such as 1.0 for "level with TRL"),
``stacked`` one horizontal bar per label split into its parts, ``lines`` a curve per series (``color`` gives series
one colour by index, ``dashed`` draws some dashed). The spec's digest is
written into the SVG, so a test can tell that a stored plot was drawn from a record's current figures without
comparing drawings (which change with matplotlib's version).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import textwrap
from pathlib import Path

DIGEST = re.compile(r"grpoplus-plot-digest:([0-9a-f]{16})")


def digest(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def stored_digest(path: Path) -> str | None:
    """The digest written into a stored SVG, or None where there is none (or no file)."""
    if not path.exists():
        return None
    found = DIGEST.search(path.read_text(errors="replace"))
    return found[1] if found else None


def draw(spec: dict) -> bytes:
    """The SVG of ``spec`` (deterministic for one matplotlib version: no date, a fixed id salt)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.hashsalt": "grpoplus", "svg.fonttype": "none", "font.size": 10}):
        rows = len(spec.get("labels", [])) * max(1, len(spec["series"]) if spec["kind"] == "bars" else 1)
        fig, ax = plt.subplots(figsize=(7, 2.2 + 0.28 * rows if spec["kind"] != "lines" else 3.6))
        {"bars": _bars, "stacked": _stacked, "lines": _lines}[spec["kind"]](ax, spec)
        fig.suptitle(spec["title"], fontsize=11)
        ax.spines[["top", "right"]].set_visible(False)
        fig.tight_layout()
        out = io.BytesIO()
        fig.savefig(out, format="svg", metadata={"Date": None, "Description": f"grpoplus-plot-digest:{digest(spec)}"})
        plt.close(fig)
    return out.getvalue()


def _bars(ax, spec: dict) -> None:
    labels, series = spec["labels"], spec["series"]
    height = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        where = [k + (i - (len(series) - 1) / 2) * height for k in range(len(labels))]
        bars = ax.barh(where, values, height=height, label=name)
        ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], padding=3, fontsize=8)
    _labels(ax, labels)
    ax.set_xlabel(spec["unit"])
    if spec.get("line") is not None:
        ax.axvline(spec["line"], color="grey", linewidth=1, linestyle="--")
    if len(series) > 1:
        _legend(ax)


def _stacked(ax, spec: dict) -> None:
    labels, left = spec["labels"], [0.0] * len(spec["labels"])
    for name, values in spec["series"].items():
        ax.barh(range(len(labels)), values, left=left, label=name)
        left = [a + b for a, b in zip(left, values)]
    for k, total in enumerate(left):
        ax.text(total, k, f" {total:.1f}", va="center", fontsize=8)
    _labels(ax, labels)
    ax.set_xlabel(spec["unit"])
    _legend(ax)


def _lines(ax, spec: dict) -> None:
    for k, (name, values) in enumerate(spec["series"].items()):
        ax.plot(spec["x"], values, marker="o", markersize=3, label=name, color=f"C{spec.get('color', {}).get(name, k)}",
                linestyle="--" if name in spec.get("dashed", ()) else "-")
    ax.set_xlabel(spec.get("xlabel", ""))
    ax.set_ylabel(spec["unit"])
    _legend(ax)


def _labels(ax, labels: list[str]) -> None:
    """Long labels (a side with its overrides) wrapped onto short lines, the first label on top."""
    ax.set_yticks(range(len(labels)), [textwrap.fill(label, 26, break_long_words=False) for label in labels], fontsize=8)
    ax.invert_yaxis()


def _legend(ax) -> None:
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
