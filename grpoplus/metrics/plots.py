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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .doctor import Finding
from .series import Series, Trace, ema


@dataclass(frozen=True)
class Panel:
    """One plot: the metric keys it overlays (``*`` patterns allowed) and its axes."""

    name: str
    title: str
    ylabel: str
    keys: tuple[str, ...]
    logy: bool = False


PANELS: tuple[Panel, ...] = (
    Panel("reward", "Reward and held-out accuracy", "reward / accuracy",
          ("reward/mean", "reward/accuracy", "eval/accuracy", "eval/accuracy_sampled",
           "eval/pass@*")),
    Panel("reward_components", "Reward components", "mean reward", ("reward/*/mean",)),
    Panel("entropy", "Policy token entropy", "entropy (nats)",
          ("policy/entropy_mean", "policy/entropy_p25", "policy/entropy_p10")),
    Panel("length", "Response length: correct vs incorrect", "tokens",
          ("length/mean", "length/correct_mean", "length/incorrect_mean", "eval/length_mean")),
    Panel("truncation", "Truncated responses (hit the length limit)", "fraction",
          ("length/truncated_frac",)),
    Panel("clip", "Clipped token fractions", "fraction of tokens",
          ("loss/clip_frac_low", "loss/clip_frac_high")),
    Panel("kl", "KL: to the old policy and to the reference", "KL estimate",
          ("loss/approx_kl", "loss/kl_ref")),
    Panel("grad_norm", "Gradient norm (before clipping)", "norm", ("optim/grad_norm",), logy=True),
    Panel("mismatch", "Sampler/learner mismatch", "value",
          ("mismatch/k3", "mismatch/abs_p_diff_mean", "mismatch/abs_p_diff_max"), logy=True),
    Panel("zero_variance", "Groups with zero reward spread", "fraction of groups",
          ("groups/zero_std_frac", "groups/all_correct_frac", "groups/all_wrong_frac",
           "sampling/kept_frac")),
    Panel("time", "Time per step", "seconds",
          ("time/step_s", "time/rollout_s", "time/reward_s", "time/learner_s", "time/eval_s")),
    Panel("throughput", "Throughput", "tokens / second",
          ("throughput/rollout_tok_s", "throughput/learner_tok_s")),
)


def panel_keys(panel: Panel, trace: Trace) -> list[str]:
    """The panel's keys that this run logged, patterns expanded, in panel order."""
    present = trace.keys()
    keys: list[str] = []
    for pattern in panel.keys:
        matches = fnmatch.filter(present, pattern) if "*" in pattern else [pattern]
        keys += [k for k in sorted(matches) if k not in keys and len(trace.get(k).finite())]
    return keys


def auto_smooth(n: int) -> float:
    """EMA weight whose effective window is about 1/20 of the run (``2/alpha - 1`` points)."""
    window = max(1.0, n / 20.0)
    return 1.0 - 2.0 / (window + 1.0)


def _draw_series(ax: Any, series: Series, color: Any, style: str, label: str | None,
                 smooth: float | None) -> None:
    series = series.finite()
    if smooth is None:
        smooth = auto_smooth(len(series))
    if series.key.startswith("eval/"):
        ax.plot(series.steps, series.values, style, color=color, marker="o", ms=4, lw=1.6,
                label=label)
        return
    ax.scatter(series.steps, series.values, s=7, color=color, alpha=0.25, linewidths=0)
    ax.plot(series.steps, ema(series.values, 1.0 - smooth), style, color=color, lw=1.8,
            label=label)


def _new_axes(panel: Panel, logy: bool) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.0), dpi=110)
    ax.set_title(panel.title, fontsize=12)
    ax.set_xlabel("step")
    ax.set_ylabel(panel.ylabel)
    ax.grid(True, alpha=0.3)
    if logy:
        ax.set_yscale("log")
    return fig, ax


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.legend import Legend

    # "tight" with every legend named keeps the legends drawn outside the axes
    legends = [a for ax in fig.axes for a in ax.get_children() if isinstance(a, Legend)]
    fig.savefig(path, bbox_inches="tight", bbox_extra_artists=legends)
    plt.close(fig)


def _wants_log(trace: Trace, keys: Sequence[str]) -> bool:
    """Log scale only when every value is positive and they span more than a decade."""
    values = np.concatenate([trace.get(k).finite().values for k in keys])
    return bool(len(values) and values.min() > 0 and values.max() / values.min() > 10.0)


def _mark_nonfinite(ax: Any, trace: Trace, keys: Sequence[str]) -> None:
    """A dotted red line at each step where a panel metric was NaN/inf (a skipped update)."""
    steps = sorted({s for k in keys for s, v in zip(trace.get(k).steps, trace.get(k).values)
                    if not np.isfinite(v)})
    for i, step in enumerate(steps):
        ax.axvline(step, color="red", ls=":", lw=1.2, alpha=0.7,
                   label="non-finite value" if i == 0 else None)


def plot_run(trace: Trace, panel: Panel, path: Path, smooth: float | None) -> bool:
    """Draw one panel of one run to ``path``; False (nothing written) when no key is logged."""
    keys = panel_keys(panel, trace)
    if not keys:
        return False
    fig, ax = _new_axes(panel, panel.logy and _wants_log(trace, keys))
    for i, key in enumerate(keys):
        _draw_series(ax, trace.get(key), f"C{i}", "-", key, smooth)
    _mark_nonfinite(ax, trace, keys)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path)
    return True


def plot_runs(traces: Sequence[Trace], labels: Sequence[str], panel: Panel, path: Path,
              smooth: float | None) -> bool:
    """Overlay several runs on one panel: colour = run, line style = metric."""
    from matplotlib.lines import Line2D

    keys_per_run = [panel_keys(panel, t) for t in traces]
    keys = list(dict.fromkeys(k for ks in keys_per_run for k in ks))
    if not keys:
        return False
    styles = ["-", "--", ":", "-."]
    logy = panel.logy and all(_wants_log(t, ks) for t, ks in zip(traces, keys_per_run))
    fig, ax = _new_axes(panel, logy)
    for r, (trace, run_keys) in enumerate(zip(traces, keys_per_run)):
        for key in run_keys:
            _draw_series(ax, trace.get(key), f"C{r % 10}", styles[keys.index(key) % 4], None,
                         smooth)
    run_handles = [Line2D([], [], color=f"C{r % 10}", lw=2) for r in range(len(traces))]
    run_legend = ax.legend(run_handles, labels, fontsize=8, title="run", loc="upper left",
                           bbox_to_anchor=(1.01, 1.0))
    if len(keys) > 1:  # line style -> metric, below the run legend
        ax.add_artist(run_legend)
        key_handles = [Line2D([], [], color="0.3", ls=styles[i % 4]) for i in range(len(keys))]
        ax.legend(key_handles, keys, fontsize=8, title="metric", loc="lower left",
                  bbox_to_anchor=(1.01, 0.0))
    _save(fig, path)
    return True


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


def write_report(records: Sequence[dict[str, Any]], out_dir: str | os.PathLike, title: str,
                 findings: Sequence[Finding] = (), smooth: float | None = None) -> list[Path]:
    """All panels of one run as PNGs under ``out_dir`` plus ``index.html``; returns the PNGs."""
    trace, out = Trace(records), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, missing = [], []
    for panel in PANELS:
        path = out / f"{panel.name}.png"
        if plot_run(trace, panel, path, smooth):
            written.append(path)
        else:
            missing.append(panel)
            path.unlink(missing_ok=True)  # a stale panel from an earlier report
    images = [(p.name, _title(p.stem)) for p in written]
    page = _html_page(title, findings_html(findings), images, missing)
    (out / "index.html").write_text(page, encoding="utf-8")
    return written


def write_compare(runs: Sequence[Sequence[dict[str, Any]]], labels: Sequence[str],
                  out_dir: str | os.PathLike, smooth: float | None = None) -> list[Path]:
    """The same panels with every run overlaid, plus ``index.html``; returns the PNGs."""
    traces, out = [Trace(r) for r in runs], Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, missing = [], []
    for panel in PANELS:
        path = out / f"{panel.name}.png"
        if plot_runs(traces, labels, panel, path, smooth):
            written.append(path)
        else:
            missing.append(panel)
            path.unlink(missing_ok=True)  # a stale panel from an earlier report
    intro = "<ul>" + "".join(f"<li>{html.escape(label)}</li>" for label in labels) + "</ul>"
    images = [(p.name, _title(p.stem)) for p in written]
    page = _html_page(f"Comparison of {len(runs)} runs", intro, images, missing)
    (out / "index.html").write_text(page, encoding="utf-8")
    return written


def _title(name: str) -> str:
    return next(p.title for p in PANELS if p.name == name)
