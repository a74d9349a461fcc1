"""Verifiable rewards: built-in verifiers, a code sandbox, and their composition.

Every reward is registered in :data:`REWARDS` with one signature,
``fn(prompts, completions, **fields) -> list[float | None]``; a run combines several
with :func:`parse_reward_specs` and :class:`RewardPipeline`.
"""

from grpoplus.rewards import code as _code  # noqa: F401 (imported to register its rewards)
from grpoplus.rewards import format as _format  # noqa: F401
from grpoplus.rewards import function_call as _function_call  # noqa: F401
from grpoplus.rewards import judge as _judge  # noqa: F401
from grpoplus.rewards import length as _length  # noqa: F401
from grpoplus.rewards import math_answer as _math  # noqa: F401
from grpoplus.rewards import reward_model as _reward_model  # noqa: F401
from grpoplus.rewards.code import code_reward, extract_code
from grpoplus.rewards.extract import extract_answer, last_boxed, reference_answer
from grpoplus.rewards.format import format_ok
from grpoplus.rewards.function_call import function_call_score
from grpoplus.rewards.length import soft_overlong_penalty
from grpoplus.rewards.math_answer import math_reward
from grpoplus.rewards.pipeline import (
                                       RewardComponent,
                                       RewardError,
                                       RewardPipeline,
                                       RewardResult,
                                       RewardTypeError,
                                       parse_reward_specs,
)
from grpoplus.rewards.registry import REWARDS
from grpoplus.rewards.sandbox import SandboxResult, run_python

__all__ = [
    "REWARDS",
    "RewardComponent",
    "RewardError",
    "RewardTypeError",
    "RewardPipeline",
    "RewardResult",
    "SandboxResult",
    "code_reward",
    "extract_answer",
    "extract_code",
    "format_ok",
    "function_call_score",
    "last_boxed",
    "math_reward",
    "parse_reward_specs",
    "reference_answer",
    "run_python",
    "soft_overlong_penalty",
]
