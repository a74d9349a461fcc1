"""Rollout engines: sample G responses per prompt and record the sampler's own log-probs.

Importing this package registers the built-in engines in ``ENGINES`` (``"hf"``; ``"vllm"``
when the vllm package is importable at build time).
"""

from grpoplus.containers import Rollouts, SamplingParams
from grpoplus.rollout.base import ENGINES, EngineOptions, RolloutEngine, check_rollouts
from grpoplus.rollout.hf import HFEngine
from grpoplus.rollout.vllm_engine import VLLMEngine

__all__ = ["ENGINES", "EngineOptions", "HFEngine", "RolloutEngine", "Rollouts", "SamplingParams", "VLLMEngine",
           "check_rollouts"]
