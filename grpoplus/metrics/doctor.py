"""The run doctor: read a run's metric trajectories and say what is wrong and what to switch.

It runs every check of :data:`grpoplus.metrics.checks.CHECKS` (a user adds one with
``@CHECKS.register("my_check")``) over a run's records, after it (:func:`diagnose`) or during it
(:class:`LiveDoctor`); :func:`parse_thresholds` reads ``--threshold name=value`` overrides.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from .checks import CHECKS, DoctorThresholds, Finding
from .series import Trace


def parse_thresholds(overrides: Sequence[str]) -> DoctorThresholds:
    """``["window=20", "zero_variance_frac=0.7"]`` -> thresholds; a bad name or value is a
    ValueError that lists the valid names."""
    fields = {f.name: f for f in dataclasses.fields(DoctorThresholds)}
    values: dict[str, Any] = {}
    for item in overrides:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or name not in fields:
            raise ValueError(
                f"unknown doctor threshold {item!r}; use name=value with name one of: "
                f"{', '.join(fields)}"
            )
        kind = int if fields[name].type in (int, "int") else float
        try:
            values[name] = kind(raw)
        except ValueError:
            raise ValueError(f"threshold {name!r} needs a {kind.__name__}, got {raw!r}") from None
    return DoctorThresholds(**values)


def diagnose(
    records: Sequence[dict[str, Any]],
    thresholds: DoctorThresholds | None = None,
    batch_info: Mapping[str, Any] | None = None,
) -> list[Finding]:
    """Run every registered check over a run's records; an empty list means healthy.

    Args:
        records: per-step dicts as read by :func:`grpoplus.metrics.read_metrics`.
        thresholds: when each check fires (defaults: :class:`DoctorThresholds`).
        batch_info: facts of the setup from the config (see :func:`batch_info_from_config`),
            e.g. ``{"responses": 256, "group_size": 8, "loss": "clip", "updates_per_batch": 1}``.
    """
    trace = Trace(records)
    th = thresholds or DoctorThresholds()
    info = dict(batch_info or {})
    findings = [CHECKS.get(name)(trace, th, info) for name in CHECKS.names()]
    return [f for f in findings if f is not None]


def batch_info_from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The setup facts some checks need, from a resolved config as a nested dict
    (``config.yaml``, or ``Config.to_dict()``); keys the config lacks are left out.

    ``responses`` (trained per step) = prompts_per_step x group_size; ``updates_per_batch``
    = num_iterations x num_minibatches (optimizer steps per rollout batch); the precision, TF32, sampler weights and
    ``health.sync_gap_max`` set the sync_gap signal's bound (:func:`grpoplus.metrics.signals.sync_gap_bound`).
    """
    rollout, algo = config.get("rollout") or {}, config.get("algo") or {}
    learner, health = config.get("learner") or {}, config.get("health") or {}
    info: dict[str, Any] = {k: rollout[k] for k in ("group_size", "max_staleness", "quantization", "engine")
                             if k in rollout}
    info.update({k: algo[k] for k in ("loss", "adv_estimator", "routing_replay") if k in algo})
    info.update({k: learner[k] for k in ("precision", "tf32", "device") if k in learner})
    if learner.get("teacher"):
        info["teacher"] = True  # on-policy distillation: zero reward spread still leaves the teacher's advantage
    if health.get("sync_gap_max") is not None:
        info["sync_gap_max"] = health["sync_gap_max"]
    if "group_size" in rollout and "prompts_per_step" in rollout:
        info["responses"] = rollout["prompts_per_step"] * rollout["group_size"]
    if "num_iterations" in algo or "num_minibatches" in algo:
        info["updates_per_batch"] = algo.get("num_iterations", 1) * algo.get("num_minibatches", 1)
    return info


class LiveDoctor:
    """Runs :func:`diagnose` during training and returns only findings not reported before
    (a finding that escalates from warning to severe is reported again, once).

    Example::

        doctor = LiveDoctor(batch_info=batch_info_from_config(cfg.to_dict()), every=10)
        if doctor.due(step):
            for finding in doctor.check(records_so_far):
                print(finding.one_line())
    """

    def __init__(
        self,
        thresholds: DoctorThresholds | None = None,
        batch_info: Mapping[str, Any] | None = None,
        every: int = 10,
    ):
        self.thresholds = thresholds or DoctorThresholds()
        self.batch_info = batch_info
        self.every = every
        self._reported: set[tuple[str, str]] = set()

    def due(self, step: int) -> bool:
        """Check every ``every`` steps, and once at ``structural_min_steps`` so a setup that
        cannot learn (zero advantage, inert clipping) is named before the first period ends;
        ``every=0`` turns the live doctor off."""
        if self.every <= 0 or step <= 0:
            return False
        return step % self.every == 0 or step == self.thresholds.structural_min_steps

    def check(self, records: Sequence[dict[str, Any]]) -> list[Finding]:
        """Diagnose ``records`` (all steps so far); return only the findings not reported yet."""
        new = []
        for finding in diagnose(records, self.thresholds, self.batch_info):
            key = (finding.code, finding.severity)
            if key not in self._reported:
                self._reported.add(key)
                new.append(finding)
        return new
