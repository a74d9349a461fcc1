"""Dashboard plots: ``grpoplus report`` (one run) and ``grpoplus compare`` (several runs).

One PNG per panel plus an ``index.html`` that shows them. Each metric is drawn as faint raw
points under an EMA-smoothed line; held-out (``eval/*``) metrics, logged every few steps,
are drawn as lines with markers and not smoothed. A panel whose keys were never logged is
left out and named on the page.
"""

from __future__ import annotations

import fnmatch
import html
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .doctor import Finding
from .series import Series, Trace, ema
from .style import (
    MARKS_PER_LINE,
    Style,
    legends_below,
    line_widths,
    metric_labels,
    metric_styles,
    new_figure,
    shorten,
)
from .style import save as save_figure


@dataclass(frozen=True)
class Panel:
    """One plot: the metric keys it overlays (``*`` patterns allowed) and its axes.

    ``kind="lines"`` draws one line per key; ``kind="layers"`` draws a step x layer heat map
    of the keys (one per layer, e.g. ``moe/routing_mismatch/layer<i>``).
    """

    name: str
    title: str
    ylabel: str
    keys: tuple[str, ...]
    logy: bool = False
    kind: str = "lines"


PANELS: tuple[Panel, ...] = (
    Panel("reward", "Reward and held-out accuracy", "reward / accuracy",
          ("reward/mean", "reward/accuracy", "eval/accuracy", "eval/accuracy_sampled",
           "eval/pass@*")),
    Panel("reward_components", "Reward components", "mean reward", ("reward/*/mean",)),
    Panel("entropy", "Policy token entropy (mean)", "entropy (nats)", ("policy/entropy_mean",)),
    Panel("entropy_tail", "Low-entropy tail: token entropy percentiles", "entropy (nats)",
          ("policy/entropy_p25", "policy/entropy_p10"), logy=True),
    Panel("length", "Response length: correct vs incorrect", "tokens",
          ("length/mean", "length/correct_mean", "length/incorrect_mean", "eval/length_mean")),
    Panel("truncation", "Truncated responses (hit the length limit)", "fraction",
          ("length/truncated_frac",)),
    Panel("clip", "Clipped token fractions", "fraction of tokens",
          ("loss/clip_frac_low", "loss/clip_frac_high")),
    Panel("ratio", "Token ratio to the old policy", "ratio", ("loss/ratio_max", "loss/ratio_mean")),
    Panel("kl", "KL: to the old policy and to the reference", "KL estimate",
          ("loss/approx_kl", "loss/kl_ref")),
    Panel("grad_norm", "Gradient norm (before clipping)", "norm", ("optim/grad_norm",), logy=True),
    Panel("mismatch", "Sampler/learner mismatch", "value",
          ("mismatch/k3", "mismatch/abs_p_diff_mean", "mismatch/abs_p_diff_max"), logy=True),
    Panel("zero_variance", "Groups with zero reward spread (all drawn groups)",
          "fraction of groups",
          ("groups/zero_std_frac", "groups/all_correct_frac", "groups/all_wrong_frac",
           "sampling/kept_frac")),
    Panel("batch", "Prompts per step: drawn vs trained", "prompts (groups)",
          ("drawn/prompts", "batch/prompts")),
    Panel("sampling", "Dynamic sampling: groups drawn per group needed, rounds", "x",
          ("sampling/oversample", "sampling/rounds")),
    Panel("async_staleness", "Asynchronous rollouts: staleness", "policy versions",
          ("async/staleness_mean", "async/staleness_max")),
    Panel("async_busy", "Asynchronous rollouts: busy fractions", "fraction of wall time",
          ("async/*busy*",)),
    Panel("moe", "MoE routing: mismatch and load", "fraction",
          ("moe/routing_mismatch", "moe/load_max_frac")),
    Panel("moe_layers", "MoE routing mismatch per layer", "routing mismatch",
          ("moe/routing_mismatch/layer*",), kind="layers"),
    Panel("env_turns", "Multi-turn: turns per trajectory", "turns",
          ("env/turns_mean", "env/turns_correct_mean", "env/turns_max", "eval/turns_mean")),
    Panel("env_ended", "Multi-turn: how trajectories ended", "fraction of trajectories", ("env/ended/*",)),
    Panel("env_turn_reward", "Multi-turn: mean environment reward of turn k", "reward", ("env/turn_reward/*",)),
    Panel("env_tools", "Multi-turn: tool calls and errors, observation share", "count / fraction",
          ("env/tool_calls", "env/tool_errors", "env/obs_token_frac")),
    Panel("time", "Time per step", "seconds",
          ("time/step_s", "time/rollout_s", "time/env_s", "time/reward_s", "time/learner_s", "time/eval_s")),
    Panel("throughput", "Throughput", "tokens / second",
          ("throughput/rollout_tok_s", "throughput/learner_tok_s")),
)


def _natural(key: str) -> tuple:
    """Sort key that puts ``layer2`` before ``layer10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key))


def panel_keys(panel: Panel, trace: Trace) -> list[str]:
    """The panel's keys that this run logged, patterns expanded, in panel order."""
    present = trace.keys()
    keys: list[str] = []
    for pattern in panel.keys:
        matches = fnmatch.filter(present, pattern) if "*" in pattern else [pattern]
        keys += [k for k in sorted(matches, key=_natural)
                 if k not in keys and len(trace.get(k).finite())]
    return keys


def auto_smooth(n: int) -> float:
    """EMA weight whose effective window is about 1/20 of the run (``2/alpha - 1`` points)."""
    window = max(1.0, n / 20.0)
    return 1.0 - 2.0 / (window + 1.0)


def _draw_series(ax: Any, series: Series, color: Any, style: Style, lw: float,
                 smooth: float | None, mark_phase: float) -> None:
    """Faint raw points under an EMA line (held-out ``eval/*`` metrics: the points joined);
    markers every ~1/12 of the line, shifted by ``mark_phase`` (0-1) so coinciding lines
    do not hide each other's markers."""
    series = series.finite()
    every = max(1, len(series) // MARKS_PER_LINE)
    line = dict(color=color, ls=style.linestyle, marker=style.marker, ms=4.5, lw=lw,
                alpha=0.9, markevery=(int(mark_phase * every), every))
    if series.key.startswith("eval/"):
        ax.plot(series.steps, series.values, **{**line, "markevery": 1})
        return
    if smooth is None:
        smooth = auto_smooth(len(series))
    ax.scatter(series.steps, series.values, s=7, color=color, alpha=0.25, linewidths=0)
    ax.plot(series.steps, ema(series.values, 1.0 - smooth), **line)


def _handle(color: Any, style: Style, lw: float = 2.0) -> Any:
    from matplotlib.lines import Line2D

    return Line2D([], [], color=color, ls=style.linestyle, marker=style.marker, ms=4.5, lw=lw)


def _wants_log(trace: Trace, keys: Sequence[str]) -> bool:
    """Log scale only when every value is positive and they span more than a decade."""
    values = np.concatenate([trace.get(k).finite().values for k in keys])
    return bool(len(values) and values.min() > 0 and values.max() / values.min() > 10.0)


def _nonfinite_steps(trace: Trace, keys: Sequence[str]) -> list[float]:
    return sorted({s for k in keys for s, v in zip(trace.get(k).steps, trace.get(k).values)
                   if not np.isfinite(v)})


def _mark_nonfinite(ax: Any, steps: Sequence[float], color: Any) -> None:
    """A dotted line at each step where a panel metric was NaN/inf (a skipped update)."""
    for step in steps:
        ax.axvline(step, color=color, ls=":", lw=1.2, alpha=0.7)


def _setup(ax: Any, panel: Panel, logy: bool) -> None:
    ax.set_title(panel.title, fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(panel.ylabel)
    if logy:
        ax.set_yscale("log")


def draw_run(trace: Trace, panel: Panel, smooth: float | None) -> Any | None:
    """One panel of one run as a matplotlib figure (colour and style = metric); None when
    none of its keys was logged."""
    keys = panel_keys(panel, trace)
    if not keys:
        return None
    if panel.kind == "layers":
        return _draw_layers([trace], [""], panel, keys)
    fig, (ax,) = new_figure()
    _setup(ax, panel, panel.logy and _wants_log(trace, keys))
    styles, widths = metric_styles(len(keys)), line_widths(len(keys))
    for i, key in enumerate(keys):
        _draw_series(ax, trace.get(key), f"C{i % 10}", styles[i], widths[i], smooth,
                     i / len(keys))
    handles = [_handle(f"C{i % 10}", styles[i]) for i in range(len(keys))]
    title, labels = metric_labels(keys)
    bad = _nonfinite_steps(trace, keys)
    if bad:
        _mark_nonfinite(ax, bad, "red")
        handles.append(_handle("red", Style(":", None), 1.2))
        labels.append("non-finite value")
    legends_below(fig, ax, [(title, handles, labels)])
    return fig


def draw_runs(traces: Sequence[Trace], labels: Sequence[str], panel: Panel,
              smooth: float | None) -> Any | None:
    """One panel with several runs overlaid: colour = run, (line style, marker) = metric."""
    keys_per_run = [panel_keys(panel, t) for t in traces]
    keys = list(dict.fromkeys(k for ks in keys_per_run for k in ks))
    if not keys:
        return None
    if panel.kind == "layers":
        return _draw_layers(traces, labels, panel, keys)
    logy = panel.logy and all(_wants_log(t, ks) for t, ks in zip(traces, keys_per_run) if ks)
    fig, (ax,) = new_figure()
    _setup(ax, panel, logy)
    styles, widths = metric_styles(len(keys)), line_widths(len(traces))
    colors = run_colors(len(traces))
    for r, (trace, run_keys) in enumerate(zip(traces, keys_per_run)):
        for key in run_keys:
            _draw_series(ax, trace.get(key), colors[r], styles[keys.index(key)], widths[r],
                         smooth, r / len(traces))
        _mark_nonfinite(ax, _nonfinite_steps(trace, run_keys), colors[r])
    groups = [("run", [_handle(c, Style("-", None), 2.5) for c in colors],
               [shorten(label) for label in labels])]
    if len(keys) > 1:
        title, metric_names = metric_labels(keys)
        groups.append((f"metric {title}".strip(), [_handle("0.3", s) for s in styles],
                       metric_names))
    legends_below(fig, ax, groups)
    return fig


def run_colors(n: int) -> list[Any]:
    """Distinct colours for ``n`` runs: the 10 tab10 colours, then tab20's lighter shades."""
    import matplotlib

    if n <= 10:
        return [f"C{i}" for i in range(n)]
    cmap = matplotlib.colormaps["tab20"]
    order = [2 * i for i in range(10)] + [2 * i + 1 for i in range(10)]
    return [cmap(order[i % 20]) for i in range(n)]


def _draw_layers(traces: Sequence[Trace], labels: Sequence[str], panel: Panel,
                 keys: Sequence[str]) -> Any:
    """Step x layer heat map per run (one row of axes per run), one shared colour scale."""
    grids = [_layer_grid(t, keys) for t in traces]
    finite = np.concatenate([g[1][np.isfinite(g[1])] for g in grids])
    vmin, vmax = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
    fig, axes = new_figure(len(traces))
    for ax, (steps, grid), label in zip(axes, grids, labels):
        mesh = ax.pcolormesh(_edges(steps), np.arange(len(keys) + 1) - 0.5, grid,
                             vmin=vmin, vmax=max(vmax, vmin + 1e-12), cmap="viridis")
        ax.set_ylabel("layer")
        ax.grid(False)
        if label:
            ax.set_title(shorten(label), fontsize=9, loc="left")
    if len(axes) == 1:
        axes[0].set_title(panel.title, fontsize=11)
    else:
        fig.suptitle(panel.title, fontsize=11)
    axes[-1].set_xlabel("step")
    fig.colorbar(mesh, ax=axes, label=panel.ylabel)
    return fig


def _layer_grid(trace: Trace, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(steps [S], values [L, S]) with NaN where a layer was not logged at a step."""
    steps = np.unique(np.concatenate([trace.get(k).steps for k in keys]))
    grid = np.full((len(keys), len(steps)), np.nan)
    for layer, key in enumerate(keys):
        series = trace.get(key)
        grid[layer, np.searchsorted(steps, series.steps)] = series.values
    return steps, grid


def _edges(steps: np.ndarray) -> np.ndarray:
    """Cell edges half-way between logged steps ([S] -> [S + 1])."""
    if len(steps) == 1:
        return np.array([steps[0] - 0.5, steps[0] + 0.5])
    mid = (steps[1:] + steps[:-1]) / 2.0
    return np.concatenate([[2 * steps[0] - mid[0]], mid, [2 * steps[-1] - mid[-1]]])


def _html_page(title: str, intro: str, images: Sequence[tuple[str, str]],
               missing: Sequence[Panel]) -> str:
    cards = "\n".join(
        f'<figure><img src="{html.escape(f)}" alt="{html.escape(t)}">'
        f"<figcaption>{html.escape(t)}</figcaption></figure>"
        for f, t in images
    )
    absent = "".join(
        f"<li>{html.escape(p.title)}: none of {html.escape(', '.join(p.keys))} logged</li>"
        for p in missing
    )
    absent_html = f"<h2>Panels without data</h2><ul>{absent}</ul>" if absent else ""
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;margin:1.5em;color:#222}"
        ".grid{display:flex;flex-wrap:wrap;gap:12px}"
        "figure{margin:0;border:1px solid #ddd;padding:6px;flex:1 1 600px;max-width:820px}"
        "img{width:100%}"
        ".severe{color:#b00020}.warning{color:#a15c00}.healthy{color:#1b7a1b}"
        f"</style></head><body><h1>{html.escape(title)}</h1>{intro}"
        f"<div class='grid'>{cards}</div>{absent_html}</body></html>\n"
    )


def findings_html(findings: Sequence[Finding]) -> str:
    if not findings:
        return "<p class='healthy'><b>Doctor: healthy</b> (no finding fired)</p>"
    items = "".join(
        f"<li class='{f.severity}'><b>{f.severity} {html.escape(f.code)}</b>: "
        f"{html.escape(f.title)}<br>evidence: {html.escape(f.evidence)}<br>"
        f"fix: {html.escape(f.fix)}</li>"
        for f in findings
    )
    return f"<h2>Doctor</h2><ul>{items}</ul>"


def _write_panels(draw: Any, out: Path) -> tuple[list[Path], list[Panel]]:
    """``draw(panel) -> figure | None`` for every panel; PNGs written, panels without data."""
    out.mkdir(parents=True, exist_ok=True)
    written, missing = [], []
    for panel in PANELS:
        path = out / f"{panel.name}.png"
        fig = draw(panel)
        if fig is None:
            missing.append(panel)
            path.unlink(missing_ok=True)  # a stale panel from an earlier report
        else:
            save_figure(fig, path)
            written.append(path)
    return written, missing


def write_report(records: Sequence[dict[str, Any]], out_dir: str | os.PathLike, title: str,
                 findings: Sequence[Finding] = (), smooth: float | None = None) -> list[Path]:
    """All panels of one run as PNGs under ``out_dir`` plus ``index.html``; returns the PNGs."""
    trace, out = Trace(records), Path(out_dir)
    written, missing = _write_panels(lambda panel: draw_run(trace, panel, smooth), out)
    images = [(p.name, _title(p.stem)) for p in written]
    page = _html_page(title, findings_html(findings), images, missing)
    (out / "index.html").write_text(page, encoding="utf-8")
    return written


def write_compare(runs: Sequence[Sequence[dict[str, Any]]], labels: Sequence[str],
                  out_dir: str | os.PathLike, smooth: float | None = None,
                  descriptions: Sequence[str] | None = None) -> list[Path]:
    """The same panels with every run overlaid, plus ``index.html``; returns the PNGs.

    ``labels`` name the runs in the figures (keep them short, see
    :func:`grpoplus.metrics.commands.run_labels`); ``descriptions`` (default: the labels)
    are listed in full on the page.
    """
    traces, out = [Trace(r) for r in runs], Path(out_dir)
    written, missing = _write_panels(lambda panel: draw_runs(traces, labels, panel, smooth), out)
    full = descriptions or labels
    intro = "<ul>" + "".join(
        f"<li><b>{html.escape(label)}</b>: {html.escape(text)}</li>" if text != label
        else f"<li>{html.escape(label)}</li>" for label, text in zip(labels, full)
    ) + "</ul>"
    images = [(p.name, _title(p.stem)) for p in written]
    page = _html_page(f"Comparison of {len(runs)} runs", intro, images, missing)
    (out / "index.html").write_text(page, encoding="utf-8")
    return written


def _title(name: str) -> str:
    return next(p.title for p in PANELS if p.name == name)
