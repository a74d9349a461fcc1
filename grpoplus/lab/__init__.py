"""The fidelity lab: each claim of the literature as one command with a measured verdict.

``grpoplus lab list`` shows the experiments; ``grpoplus lab NAME --out DIR`` runs one.
From Python::

    from grpoplus.lab import EXPERIMENTS, run_experiment
    verdict = run_experiment("clip_higher", "lab/clip_higher", seeds=3)
    verdict.comparisons[0].status      # "reproduced" | "not reproduced" | "inconclusive" | ...
"""

from grpoplus.lab import experiments as _builtin  # noqa: F401  (registers the built-in experiments)
from grpoplus.lab.experiment import EXPERIMENTS, Arm, Check, Comparison, Experiment, Measure, Rule, register
from grpoplus.lab.measures import MEASURES, LabRun
from grpoplus.lab.runner import run_experiment
from grpoplus.lab.verdict import STATUSES, ExperimentVerdict, judge

__all__ = ["EXPERIMENTS", "MEASURES", "STATUSES", "Arm", "Check", "Comparison", "Experiment", "ExperimentVerdict",
           "LabRun", "Measure", "Rule", "judge", "register", "run_experiment"]
