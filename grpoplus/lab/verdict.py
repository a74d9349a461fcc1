"""Verdicts: the runs' measures -> per-seed effects -> the status the experiment's rule gives.

A comparison's status is, in this order:

1. ``switch inactive`` when a ``kind="switch"`` check fails in some seed (the paired runs do
   not differ where the switch acts: no result);
2. ``regime not met`` when a ``kind="regime"`` check fails in some seed (the control arm did
   not run in the regime the experiment needs, e.g. it stopped learning: no result);
3. ``no failure to fix`` when a ``kind="failure"`` check fails in some seed (the control arm
   never showed the failure the fix exists for: no result);
4. otherwise the :class:`~grpoplus.lab.experiment.Rule` on the per-seed effects:
   ``reproduced``, ``not reproduced`` or ``inconclusive``.

Seeds are paired: seed ``s`` of the treatment is compared with seed ``s`` of the control
(same warm start, same data order). Nothing here knows what the paper found.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from grpoplus.lab.experiment import CHECK_KINDS, Check, Comparison, Experiment, Measure, Rule
from grpoplus.lab.measures import LabRun

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
SWITCH_INACTIVE, REGIME_NOT_MET, NO_FAILURE = "switch inactive", "regime not met", "no failure to fix"
STATUSES = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, SWITCH_INACTIVE, REGIME_NOT_MET, NO_FAILURE)
_CHECK_STATUS = {"switch": SWITCH_INACTIVE, "regime": REGIME_NOT_MET, "failure": NO_FAILURE}

Runs = dict[str, dict[int, LabRun]]
"""arm -> seed -> finished run."""


@dataclass
class CheckResult:
    kind: str
    statement: str
    values: list[float]  # one per seed
    passed: bool


@dataclass
class ComparisonVerdict:
    claim: str
    control: str
    treatment: str
    measure: str
    rule: str
    seeds: list[int]
    control_values: list[float]
    treatment_values: list[float]
    effects: list[float]  # treatment - control, per seed
    checks: list[CheckResult]
    status: str
    reason: str
    mean_effect: float = field(init=False)
    effect_range: tuple[float, float] = field(init=False)
    effect_std: float = field(init=False)

    def __post_init__(self) -> None:
        finite = [e for e in self.effects if math.isfinite(e)]
        self.mean_effect = statistics.fmean(finite) if finite else math.nan
        self.effect_range = (min(finite), max(finite)) if finite else (math.nan, math.nan)
        self.effect_std = statistics.stdev(finite) if len(finite) > 1 else math.nan


def measure_arm(measure: Measure, runs: Runs, arm: str, seeds: list[int]) -> list[float]:
    return [measure.of(runs[arm][s]) for s in seeds]


def run_check(check: Check, runs: Runs, seeds: list[int]) -> CheckResult:
    values = measure_arm(check.measure, runs, check.arm, seeds)
    if check.minus:
        values = [v - w for v, w in zip(values, measure_arm(check.measure, runs, check.minus, seeds))]
    if check.absolute:
        values = [abs(v) for v in values]
    return CheckResult(check.kind, check.statement(), values, all(check.holds(v) for v in values))


def apply_rule(rule: Rule, effects: list[float]) -> tuple[str, str]:
    """(status, reason) of the per-seed effects under ``rule`` (see :class:`Rule`)."""
    if not effects or not all(math.isfinite(e) for e in effects):
        return INCONCLUSIVE, f"the measure could not be taken in every seed (effects {_list(effects)})"
    signed = [rule.direction * e for e in effects]
    mean = statistics.fmean(signed)
    size = f"{rule.direction * rule.min_effect:+.3g}"
    if all(s > 0 for s in signed) and mean >= rule.min_effect:
        return REPRODUCED, f"every seed's effect has the claimed sign and the mean {rule.direction * mean:+.3g} reaches {size}"
    if all(s < rule.min_effect for s in signed):
        return NOT_REPRODUCED, f"no seed's effect reaches {size} (effects {_list(effects)})"
    return INCONCLUSIVE, f"the seeds disagree (effects {_list(effects)}, threshold {size})"


def judge(comparison: Comparison, runs: Runs) -> ComparisonVerdict:
    """The verdict of one comparison over the seeds both of its arms ran."""
    seeds = sorted(set(runs[comparison.control]) & set(runs[comparison.treatment]))
    control = measure_arm(comparison.effect, runs, comparison.control, seeds)
    treatment = measure_arm(comparison.effect, runs, comparison.treatment, seeds)
    effects = [_effect(t, c, comparison.relative) for t, c in zip(treatment, control)]
    checks = [run_check(ch, runs, seeds) for ch in comparison.checks]
    failed = next(([c for c in checks if c.kind == kind and not c.passed] for kind in CHECK_KINDS
                   if any(c.kind == kind and not c.passed for c in checks)), [])
    if failed:
        status, reason = _CHECK_STATUS[failed[0].kind], _failed_text(failed)
    else:
        status, reason = apply_rule(comparison.rule, effects)
    return ComparisonVerdict(comparison.claim, comparison.control, comparison.treatment, comparison.effect.label,
                             ("relative effect (treatment / control - 1): " if comparison.relative else "")
                             + comparison.rule.statement(), seeds, control, treatment, effects, checks, status, reason)


def _effect(treatment: float, control: float, relative: bool) -> float:
    if not relative:
        return treatment - control
    return treatment / control - 1.0 if control else math.nan


def _failed_text(checks: list[CheckResult]) -> str:
    return "; ".join(f"not in every seed: {c.statement} (per seed {_list(c.values)})" for c in checks)


def _list(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.3g}" for v in values) + "]"


@dataclass
class ExperimentVerdict:
    """Everything ``verdict.json`` holds: the definition as run, the measured effects and verdicts,
    context measures per arm, and where and how the runs were made."""

    experiment: str
    title: str
    source: str
    regime: str
    command: str
    seeds: list[int]
    steps: int
    arms: dict[str, dict[str, Any]]
    comparisons: list[ComparisonVerdict]
    report: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    machine: dict[str, Any]
    plots: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def report_measures(experiment: Experiment, runs: Runs, seeds: list[int]) -> list[dict[str, Any]]:
    """Context measures (no verdict) per arm and seed: ``[{"measure": label, "arms": {arm: [values]}}]``."""
    return [{"measure": m.label, "arms": {a.name: measure_arm(m, runs, a.name, [s for s in seeds if s in runs[a.name]])
                                          for a in experiment.arms}}
            for m in experiment.report]


def markdown(v: ExperimentVerdict) -> str:
    """A short human verdict: the command, the regime, one row per claim, the checks, context, plots."""
    lines = [f"# {v.experiment}: {v.title}", "", f"Source: {v.source}", "",
             f"`{v.command}` — {len(v.seeds)} seeds x {len(v.arms)} arms x {v.steps} steps; "
             f"machine: {v.machine.get('summary', '?')}", "", f"Regime: {v.regime}", "",
             "| claim | control -> treatment | measure | control | treatment | effect: mean [min, max] (sd) | verdict |",
             "|---|---|---|---:|---:|---:|---|"]
    for c in v.comparisons:
        lines.append(f"| {c.claim} | {c.control} -> {c.treatment} | {c.measure} | {_mean(c.control_values)} | "
                     f"{_mean(c.treatment_values)} | {c.mean_effect:+.3g} [{c.effect_range[0]:+.3g}, "
                     f"{c.effect_range[1]:+.3g}] ({c.effect_std:.2g}) | **{c.status}** |")
    lines.append("")
    for c in v.comparisons:
        lines += [f"**{c.claim}** — {c.status}: {c.reason}.", f"Rule (stated in advance): {c.rule}.", ""]
        lines += [f"- {'ok' if ch.passed else 'FAILED'} ({ch.kind}): {ch.statement}; per seed {_list(ch.values)}"
                  for ch in c.checks]
        lines += [f"- seed {s}: control {a:.4g}, treatment {b:.4g}, effect {e:+.4g}"
                  for s, a, b, e in zip(c.seeds, c.control_values, c.treatment_values, c.effects)]
        lines.append("")
    if v.report:
        lines += ["Context (per arm: mean [min, max] over seeds):", "",
                  "| measure | " + " | ".join(v.arms) + " |", "|---|" + "---:|" * len(v.arms)]
        lines += [f"| {r['measure']} | " + " | ".join(_span(r["arms"].get(a, [])) for a in v.arms) + " |"
                  for r in v.report]
        lines.append("")
    lines += [f"![{p}]({p})" for p in v.plots]
    return "\n".join(lines) + "\n"


def _mean(values: list[float]) -> str:
    finite = [x for x in values if math.isfinite(x)]
    return f"{statistics.fmean(finite):.3g}" if finite else "nan"


def _span(values: list[float]) -> str:
    finite = [x for x in values if math.isfinite(x)]
    if not finite:
        return "nan"
    return f"{statistics.fmean(finite):.3g} [{min(finite):.3g}, {max(finite):.3g}]"


def summary_table(verdicts: list[ExperimentVerdict]) -> str:
    """The summary table (docs/results/lab.md): one row per claim with its measured effect, verdict and command."""
    lines = ["| experiment | claim | measure | effect: mean [min, max] | verdict | seeds x steps | command |",
             "|---|---|---|---:|---|---|---|"]
    for v in verdicts:
        for c in v.comparisons:
            lines.append(f"| {v.experiment} | {c.claim} | {c.measure} | {c.mean_effect:+.3g} "
                         f"[{c.effect_range[0]:+.3g}, {c.effect_range[1]:+.3g}] | {c.status} | "
                         f"{len(v.seeds)} x {v.steps} | `{v.command}` |")
    return "\n".join(lines) + "\n"
