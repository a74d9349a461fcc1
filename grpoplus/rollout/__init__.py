"""Rollout engines: sample G responses per prompt and record the sampler's own log-probs.

Importing this package registers the built-in engines in ``ENGINES``: ``"hf"`` and ``"vllm"``
(which imports vLLM only when an engine is built).
"""

from grpoplus.containers import Rollouts, SamplingParams
from grpoplus.rollout.base import ENGINES, EngineError, EngineOptions, RolloutEngine, check_rollouts, require_engine
from grpoplus.rollout.hf import HFEngine
from grpoplus.rollout.vllm_engine import VLLMEngine

__all__ = ["ENGINES", "EngineError", "EngineOptions", "HFEngine", "RolloutEngine", "Rollouts", "SamplingParams", "VLLMEngine",
           "check_rollouts", "require_engine"]
