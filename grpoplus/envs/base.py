"""The environment contract: one instance per rollout, created from its data row.

An environment is any object with

- ``reset(**row) -> observation``: the data row's fields (``prompt``, ``answer`` and every extra column) as
  keywords; the first observation, or None to start from the row's prompt;
- ``step(action_text) -> (observation, reward, done, info)`` (or a :class:`StepResult`): the policy's turn as
  text; the answer to append, the turn's reward (None: none), whether the episode is over, and a dict;
- ``close()`` (optional): always called once the trajectory ends, whatever ended it.

An observation is a string, a chat message (``{"role": "user" | "tool", "content": ...}``) or a list of them; a
message's content may be a list of text and image parts (``{"type": "image", "image": source}``, a source as a data
row's images take: :mod:`grpoplus.data.images`), which a vision-language policy sees.
``reset``, ``step`` and ``close`` may be ``async def``: they are awaited. Environments are registered in
:data:`ENVS` (``@ENVS.register("name")`` on a factory taking the row's fields) and selected by ``data.env``: a
registered name, ``module:factory`` or ``path/file.py:factory``. A factory is called once per rollout with the
row's fields and may return any of the kinds :func:`grpoplus.envs.adapters.adapt` recognises.
"""

from __future__ import annotations

import inspect
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable

from grpoplus.core.registry import Registry, import_object

Observation = str | dict | list | None


@dataclass
class StepResult:
    """What one environment step answered."""

    observation: Observation
    reward: float | None = None
    done: bool = False
    info: dict = field(default_factory=dict)


class MalformedStep(ValueError):
    """An environment returned something that is not a step result (the trajectory ends, counted as malformed)."""


# name -> factory(**row) -> environment
ENVS: Registry = Registry("environment", builtins=("grpoplus.envs.functions", "grpoplus.envs.guess"))


def env_factory(spec: str) -> Callable[..., Any]:
    """The factory ``data.env`` names: a registered environment, ``module:factory`` or ``path/file.py:factory``."""
    if ":" not in spec:
        return ENVS.get(spec)
    factory = import_object(spec)
    if not callable(factory):
        raise ValueError(f"data.env={spec!r} is not callable: name a factory that takes a data row's fields "
                         "and returns an environment")
    return factory


def make(factory: Callable[..., Any], row: dict) -> Any:
    """``factory(**row)``, passing only the fields it takes when it takes no ``**kwargs``."""
    parameters = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return factory(**row)
    return factory(**{k: v for k, v in row.items() if k in parameters})


def as_step(value: Any) -> StepResult:
    """A step's answer as a :class:`StepResult`: the result itself, ``(obs, reward, done, info)``, or the
    Gymnasium shape ``(obs, reward, terminated, truncated, info)``; anything else is :class:`MalformedStep`."""
    if isinstance(value, StepResult):
        result = value
    elif isinstance(value, tuple) and len(value) == 4:
        result = StepResult(value[0], value[1], value[2], value[3])
    elif isinstance(value, tuple) and len(value) == 5:
        result = StepResult(value[0], value[1], bool(value[2]) or bool(value[3]), value[4])
    else:
        raise MalformedStep(f"step returned {type(value).__name__}, not (observation, reward, done, info)")
    if result.reward is not None and (not isinstance(result.reward, numbers.Real) or not math.isfinite(result.reward)):
        raise MalformedStep(f"step returned the reward {result.reward!r}, not a finite number or None")
    check_observation(result.observation)
    if not isinstance(result.info, dict):
        result.info = {}
    result.done = bool(result.done)
    return result


def check_observation(obs: Observation) -> None:
    """A string, a message dict whose ``content`` is a string or a list of parts (``{"type": "text", "text": str}``,
    ``{"type": "image", "image": source}``: a vision-language policy's), a list of those, or None; else
    :class:`MalformedStep`."""
    items = obs if isinstance(obs, list) else [obs]
    for item in items:
        if item is None or isinstance(item, str):
            continue
        if isinstance(item, dict) and (isinstance(item.get("content"), str) or _parts(item.get("content"))):
            continue
        raise MalformedStep(f"observation {str(item)[:60]!r} is not text or a chat message with text content (or a "
                            'list of {"type": "text", "text": ...} and {"type": "image", "image": ...} parts)')


def _parts(content) -> bool:
    """Whether ``content`` is a non-empty list of text and image parts."""
    return isinstance(content, list) and bool(content) and all(
        isinstance(p, dict) and ((p.get("type") == "text" and isinstance(p.get("text"), str))
                                 or (p.get("type") == "image" and p.get("image") is not None)) for p in content)
