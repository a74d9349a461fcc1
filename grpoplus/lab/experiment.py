"""What an experiment of the fidelity lab is: arms, measures, checks and a rule, all declared up front.

An experiment pairs configurations (``Arm``) that differ in one switch, runs each with several
seeds, and states before any run how its verdict is reached:

- ``Comparison``: a claim of the literature as "treatment minus control of this ``Measure``
  has this sign", judged per seed by its ``Rule``;
- ``Check``: a precondition that must hold in every seed, or the comparison is no result:
  ``kind="switch"`` (the paired runs differ in the quantity the switch touches: clip
  fractions, mismatch, sampling rounds) gives "switch inactive", ``kind="failure"`` (the
  control arm shows the failure the fix exists for: entropy falling, zero-spread groups)
  gives "no failure to fix".

Adding an experiment is one ``EXPERIMENTS.add(Experiment(...))`` in your own module (see
``grpoplus/lab/experiments.py`` for the built-in ones).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpoplus.core.registry import Registry


@dataclass(frozen=True)
class Measure:
    """One number computed from one run: the registered measure ``name`` (``MEASURES`` in
    :mod:`grpoplus.lab.measures`) called with ``params``; ``label`` says what it is in words."""

    name: str
    label: str
    params: dict[str, Any] = field(default_factory=dict)

    def of(self, run) -> float:
        from grpoplus.lab.measures import MEASURES

        return float(MEASURES.get(self.name)(run, **self.params))


@dataclass(frozen=True)
class Rule:
    """How a comparison's per-seed effects (treatment minus control, seeds paired) become a verdict.

    ``direction`` is the sign the claim predicts (+1: the treatment's measure is higher).
    Reproduced: every seed's effect has that sign and their mean is at least ``min_effect`` in
    that direction. Not reproduced: no seed's effect reaches ``min_effect`` in that direction.
    Inconclusive: anything else (the seeds disagree).
    """

    direction: int
    min_effect: float

    def __post_init__(self) -> None:
        if self.direction not in (1, -1):
            raise ValueError(f"Rule.direction must be +1 or -1, got {self.direction!r}")
        if not self.min_effect >= 0:
            raise ValueError(f"Rule.min_effect must be >= 0, got {self.min_effect!r}")

    def statement(self) -> str:
        sign = ">" if self.direction > 0 else "<"
        size = f"{'+' if self.direction > 0 else '-'}{self.min_effect:g}"
        return (f"reproduced if the effect is {sign} 0 in every seed and its mean is {'>=' if self.direction > 0 else '<='} "
                f"{size}; not reproduced if no seed reaches {size}; otherwise inconclusive")


CHECK_KINDS = ("switch", "regime", "failure")
"""In the order a verdict tests them: the switch acted; the control ran in the regime the
experiment needs (e.g. it kept learning); the control showed the failure the fix targets."""


@dataclass(frozen=True)
class Check:
    """A precondition tested in every seed: ``measure`` of ``arm`` (minus its value in ``minus``,
    the same seed, when given; its absolute value with ``absolute``) must be >= ``at_least``
    and <= ``at_most`` (either may be None)."""

    kind: str  # "switch" | "regime" | "failure"
    measure: Measure
    arm: str
    minus: str | None = None
    at_least: float | None = None
    at_most: float | None = None
    absolute: bool = False

    def __post_init__(self) -> None:
        if self.kind not in CHECK_KINDS:
            raise ValueError(f"Check.kind must be one of {', '.join(CHECK_KINDS)}, got {self.kind!r}")
        if self.at_least is None and self.at_most is None:
            raise ValueError("a Check needs at_least or at_most")

    def holds(self, value: float) -> bool:
        """False for NaN (the measure could not be taken)."""
        return value == value and (self.at_least is None or value >= self.at_least) and (
            self.at_most is None or value <= self.at_most)

    def statement(self) -> str:
        what = f"{self.measure.label} of {self.arm}" + (f" minus {self.minus}" if self.minus else "")
        what = f"|{what}|" if self.absolute else what
        bounds = [f">= {self.at_least:g}" if self.at_least is not None else "",
                  f"<= {self.at_most:g}" if self.at_most is not None else ""]
        return f"{what} {' and '.join(b for b in bounds if b)}"


@dataclass(frozen=True)
class Comparison:
    """One claim: ``effect`` measured on ``treatment`` minus ``control`` (with ``relative``:
    treatment / control - 1, a fraction of the control's value), judged by ``rule``, valid
    only when every one of ``checks`` holds in every seed."""

    claim: str
    control: str
    treatment: str
    effect: Measure
    rule: Rule
    checks: tuple[Check, ...] = ()
    relative: bool = False


@dataclass(frozen=True)
class Arm:
    """One configuration: ``overrides`` (``key=value``, as on the ``grpoplus train`` command line)
    on top of the experiment's ``base``; ``preset`` replaces the experiment's preset."""

    name: str
    overrides: tuple[str, ...] = ()
    preset: str | None = None


@dataclass(frozen=True)
class Experiment:
    """A claim of the literature as paired runs with a verdict rule stated in advance.

    ``base`` holds the overrides every arm shares (task, difficulty, budget, update count);
    ``regime`` says why the control arm can show the failure there. ``plots`` are the metric
    keys drawn as overlays of every run; ``report`` measures are shown per arm for context,
    without a verdict. ``requires`` names config keys the experiment needs (e.g. a switch
    another branch adds): without them it is listed but not run.
    """

    name: str
    title: str
    source: str
    preset: str
    base: tuple[str, ...]
    arms: tuple[Arm, ...]
    comparisons: tuple[Comparison, ...]
    regime: str
    plots: tuple[str, ...]
    report: tuple[Measure, ...] = ()
    requires: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"experiment {self.name!r}: arm names repeat: {names}")
        for c in self.comparisons:
            used = [c.control, c.treatment] + [a for ch in c.checks for a in (ch.arm, ch.minus) if a]
            unknown = sorted(set(used) - set(names))
            if unknown:
                raise ValueError(f"experiment {self.name!r}: comparison {c.claim!r} names unknown arms "
                                 f"{unknown}; arms: {', '.join(names)}")

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    def missing_keys(self) -> list[str]:
        """The ``requires`` keys (``section.name``) this grpoplus's config does not have."""
        import dataclasses

        from grpoplus.config import SECTIONS

        def exists(key: str) -> bool:
            section, _, name = key.partition(".")
            return section in SECTIONS and name in {f.name for f in dataclasses.fields(SECTIONS[section])}

        return [key for key in self.requires if not exists(key)]


EXPERIMENTS: Registry[Experiment] = Registry("lab experiment")
"""Every experiment, by name: ``EXPERIMENTS.add(Experiment(name=..., ...))`` registers one."""


def register(experiment: Experiment) -> Experiment:
    EXPERIMENTS.add(experiment.name, experiment)
    return experiment
