"""Rollout engines: sample G responses per prompt and record the sampler's own log-probs.

Importing this package registers the built-in engines in ``ENGINES`` (``"hf"``).
"""

from grpoplus.rollout.base import ENGINES, RolloutEngine, Rollouts, SamplingParams
from grpoplus.rollout.hf import HFEngine

__all__ = ["ENGINES", "HFEngine", "RolloutEngine", "Rollouts", "SamplingParams"]
