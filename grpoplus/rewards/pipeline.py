"""Reward composition: specs -> components -> one weighted reward per completion.

Failure policy (what a user running a long job wants):

- a reward returns the wrong number of values, or a value that is not a number/None:
  a bug in the reward, the same on every batch -> ``ValueError``/``TypeError`` at once,
  naming the reward and the problem;
- a reward raises on some samples, times out, or returns NaN, inf or a value beyond
  ``MAX_ABS_REWARD`` for a sample: that sample is *not scored* (``RewardResult.scored``
  False), counted (``reward/errors``, ``reward/timeouts``, ``reward/failed_frac``) and left
  out of its group's statistics and of the loss; the run goes on. A reward that could not
  judge one sample for a reason of its own (the math verifier hung, a judge did not answer)
  returns :class:`~grpoplus.rewards.events.Unscored` for it, with the same effect;
- a reward raises on *every* sample of a batch: almost always a bug (a missing field, a
  bad signature) -> ``RuntimeError`` at once with the first exception;
- a reward times out on every sample of ``MAX_TIMEOUT_STREAK`` batches in a row, or
  ``MAX_HUNG`` of its in-process calls are still running past their limit: it hangs ->
  ``RuntimeError`` naming ``data.reward_timeout_s`` and ``data.reward_workers``;
- None means "does not apply" and is allowed, even for a whole batch: it counts 0 in
  the total and is left out of that component's mean.

Time limit (``timeout_s``, ``data.reward_timeout_s``): the time a reward may take per sample,
as a pool worker's call scores one sample. In-process, a component's call scores the whole
batch of n in a daemon thread (:mod:`grpoplus.rewards.timed`; one thread hand-off per batch, so
cheap rewards stay cheap) under ``n * timeout_s``: a reward whose cost grows with the batch (the
math verifier with its own per-sample limit, a reward model's forward) is not cut short by a
big batch. A batch call that raises or times out is retried once per sample, every sample in
its own thread (in turn, in one thread, for an ``in_process = True`` function, which may not
be thread-safe), all under one more limit of the same length; so a component costs at most
``2 * n * timeout_s`` per batch. A timed-out ``in_process`` batch is not retried.
"""

from __future__ import annotations

import inspect
import logging
import math
import numbers
import os
import pickle
import re
import warnings
from dataclasses import dataclass, field
from typing import Callable

import yaml

from grpoplus.core.registry import import_object
from grpoplus.rewards import events
from grpoplus.rewards.events import Unscored
from grpoplus.rewards.pool import Call, KillablePool
from grpoplus.rewards.registry import REWARDS
from grpoplus.rewards.timed import TimedCalls

RewardFn = Callable[..., list]
logger = logging.getLogger("grpoplus.rewards")

# A finite value this large is no score but a bug (an unnormalised logit sum, a sentinel): one such sample makes
# every other response of its group (with a batch std, of the batch) look alike to the advantage.
MAX_ABS_REWARD = 1e6
MAX_TIMEOUT_STREAK = 3  # batches in a row on which a reward timed out on every sample: it hangs
MAX_HUNG = 32  # in-process calls still running past their limit (threads that cannot be stopped)


@dataclass
class RewardComponent:
    """One weighted reward. ``kwargs`` are fixed parameters (``max_len=...``); ``source``
    is the import spec it came from, so a pool worker can re-import it."""

    name: str
    fn: RewardFn
    weight: float = 1.0
    kwargs: dict = field(default_factory=dict)
    source: str | None = None


@dataclass
class RewardResult:
    total: list[float]  # [N] weighted sum over components
    components: dict[str, list[float | None]]  # name -> [N]
    errors: int  # failures: a reward raised, timed out or returned NaN/inf/an absurd value
    metrics: dict[str, float]
    # [N] False where a component failed: that sample has no score (its total is a 0 placeholder, its failed
    # components None) and is left out of its group's statistics and of the loss
    scored: list[bool] = field(default_factory=list)


def _scalar(text: str):
    return yaml.safe_load(text)  # "512" -> 512, "0.5" -> 0.5, "true" -> True, "abc" -> "abc"


def split_spec(spec: str) -> tuple[str, float, dict]:
    """``target[:weight][:k=v,k=v]`` -> (target, weight, kwargs); the parameters start at the first ``:``-part
    holding ``=``, so a value may itself contain ``:`` (``url=http://host:8000/v1``)."""
    parts = spec.split(":")
    kwargs: dict = {}
    first = next((i for i, part in enumerate(parts) if "=" in part), None)
    if first:  # not None, not 0 (a target comes first)
        for item in ":".join(parts[first:]).split(","):
            key, _, value = item.partition("=")
            kwargs[key.strip()] = _scalar(value.strip())
        parts = parts[:first]
    weight = 1.0
    if len(parts) > 1:
        try:
            weight = float(parts[-1])
            parts.pop()
        except ValueError:
            pass  # "module:function" without a weight
    return ":".join(parts), weight, kwargs


def _resolve(target: str, extra: dict[str, RewardFn]) -> tuple[str, RewardFn, str | None]:
    if target in extra:
        return target, extra[target], None
    if target in REWARDS:
        return target, REWARDS.get(target), None
    if ":" in target:
        fn = import_object(target)
        if not callable(fn):
            raise ValueError(f"reward spec {target!r} names a {type(fn).__name__}, not a function")
        return target.rpartition(":")[2], fn, target
    known = sorted(set(REWARDS.names()) | set(extra))
    raise ValueError(
        f"unknown reward {target!r}; choose one of: {', '.join(known)}, "
        "or give 'module:function' / 'path/to/file.py:function'"
    )


def parse_reward_specs(specs: list, extra: dict[str, RewardFn] | None = None) -> list[RewardComponent]:
    """Build components from specs.

    A spec is a string ``name[:weight][:k=v,...]`` where ``name`` is a registered reward,
    a key of ``extra`` (e.g. ``{"task": task.reward}``), ``module:function`` or
    ``path/to/file.py:function``; or a dict ``{"name": ..., "weight": ..., "kwargs": {...}}``.

    >>> [(c.name, c.weight, c.kwargs) for c in parse_reward_specs(["math", "soft_overlong:0.5:max_len=512,cache=128"])]
    [('math', 1.0, {}), ('soft_overlong', 0.5, {'max_len': 512, 'cache': 128})]
    """
    extra = extra or {}
    components: list[RewardComponent] = []
    for spec in _rejoined(specs):
        if isinstance(spec, RewardComponent):
            components.append(spec)
            continue
        if isinstance(spec, dict):
            unknown = set(spec) - {"name", "weight", "kwargs"}
            if "name" not in spec or unknown:
                raise ValueError(f"reward spec {spec!r} must have 'name' and only 'weight', 'kwargs' besides")
            target, weight, kwargs = spec["name"], float(spec.get("weight", 1.0)), dict(spec.get("kwargs") or {})
        elif isinstance(spec, str) and spec.strip():
            target, weight, kwargs = split_spec(spec.strip())
        else:
            raise ValueError(f"reward spec must be a non-empty string or a dict, got {spec!r}")
        name, fn, source = _resolve(target, extra)
        _check_kwargs(name, fn, kwargs)
        _check_options(fn, kwargs)
        components.append(RewardComponent(name, fn, weight, kwargs, source))
    names = [c.name for c in components]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"reward names must be unique, {duplicates} appear more than once")
    return components


_PARAMETER_ONLY = re.compile(r"^\s*[A-Za-z_]\w*\s*=")


def _rejoined(specs: list) -> list:
    """A list item that is only ``key=value`` continues the string spec before it: an unquoted command-line list
    (``rewards=[task,judge:url=...,choices=true]``) is split at every comma, parameters included, and no reward
    name holds ``=``.

    >>> _rejoined(["task", "judge:0.5:url=http://h:8000/v1", "choices=true", "max_score=5"])
    ['task', 'judge:0.5:url=http://h:8000/v1,choices=true,max_score=5']
    """
    out: list = []
    for spec in specs:
        if isinstance(spec, str) and _PARAMETER_ONLY.match(spec) and out and isinstance(out[-1], str) \
                and "=" in out[-1]:
            out[-1] = f"{out[-1]},{spec.strip()}"
        else:
            out.append(spec)
    return out


def _check_kwargs(name: str, fn: RewardFn, kwargs: dict) -> None:
    accepted = _accepted_names(fn)
    if accepted is not None and set(kwargs) - accepted:
        raise ValueError(
            f"reward {name!r} takes no parameter(s) {sorted(set(kwargs) - accepted)}; it accepts {sorted(accepted)}"
        )


def _check_options(fn: RewardFn, kwargs: dict) -> None:
    """A reward's own ``check_options`` (a parametrised reward's refusal of parameters no sample can be scored with: a
    judge without url=, ...), asked with every keyword parameter of ``fn`` (the spec's, else their defaults) as the
    specs are parsed: before the pipeline exists, and by the config rule ``rewards`` before anything loads."""
    check = getattr(fn, "check_options", None)
    if check is None:
        return
    params = inspect.signature(fn).parameters
    options = {name: p.default for name, p in params.items()
               if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is not p.empty}
    check(**{**options, **kwargs})


def _accepted_names(fn: RewardFn) -> set[str] | None:
    """Keyword names ``fn`` accepts, or None when it takes ``**kwargs``."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None  # a builtin or C callable: pass everything
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def pool_size(workers: int | str) -> int:
    """The reward processes of ``workers`` (``data.reward_workers``): 0 = in-process, N, or ``auto`` (this machine's
    cores but one); anything else is refused, here for the pipeline and for the config rule
    ``sampling_and_rewards``."""
    if workers == "auto":
        return max(1, len(os.sched_getaffinity(0)) - 1)  # leave a core to the trainer
    if not isinstance(workers, int) or workers < 0:
        raise ValueError(f"config key data.reward_workers must be an integer >= 0 or 'auto', got {workers!r}")
    return workers


def _payload(comp: RewardComponent) -> tuple | None:
    """How a pool worker gets the function: a pickle, else its import spec, else None."""
    try:
        blob = pickle.dumps(comp.fn)
        pickle.loads(blob)
        return ("pickle", blob)
    except Exception:  # noqa: BLE001 - any pickling failure means "not shippable"
        return ("spec", comp.source) if comp.source else None


class RewardError(RuntimeError):
    """A reward function is broken in a way no sample can survive (it stops the run with this message)."""


class RewardTypeError(RewardError, TypeError):
    """A reward returned something that is not a list of float / None."""


def _to_value(name: str, value, index: int) -> float | None:
    if value is None:
        return None
    if isinstance(value, numbers.Real) or hasattr(value, "item"):
        return float(value)
    raise RewardTypeError(
        f"reward {name!r} returned a {type(value).__name__} at index {index}; rewards must be float or None"
    )


def _check_count(name: str, values, n: int) -> list:
    if not hasattr(values, "__len__") or isinstance(values, (str, bytes, dict)):
        raise RewardTypeError(f"reward {name!r} returned a {type(values).__name__}; it must return a list of {n} values")
    if len(values) != n:
        raise ValueError(f"reward {name!r} returned {len(values)} values for {n} completions; it must return one each")
    return list(values)


# Verifier and judge failures inside a reward (the sample is Unscored): counted as timeouts or errors
_FAILURE_EVENTS = {"verifier/timeouts": "timeout", "verifier/crashes": "error", "verifier/errors": "error",
                   "judge/timeouts": "timeout", "judge/errors": "error", "judge/unparseable": "error"}


class RewardPipeline:
    """Score a batch with every component; see the module docstring for the failure policy and the time limit.

    ``workers=0`` calls each reward once per batch in this process, in a daemon thread under
    ``timeout_s`` per sample. ``workers>0`` or ``"auto"`` calls each reward once per sample in a pool of
    spawn processes, with a ``timeout_s`` limit per call; a hung worker is killed and
    replaced. A function that cannot be sent to a worker (a lambda, a closure) runs
    in-process, with a warning. A function with ``in_process = True`` (a reward model, which
    scores a whole batch on a device and would load a copy of itself in every worker) always
    runs in-process, once per batch, without a warning.
    """

    def __init__(self, components: list[RewardComponent], *, workers: int | str = 0, timeout_s: float = 10.0):
        if not components:
            raise ValueError("RewardPipeline needs at least one reward component")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.components = components
        self.timeout_s = timeout_s
        self._pool: KillablePool | None = None
        self._pooled: set[str] = set()
        self._timed = TimedCalls()
        self._timeout_streak: dict[str, int] = {}
        size = pool_size(workers)
        if size > 0:
            payloads = {}
            for comp in components:
                if getattr(comp.fn, "in_process", False):
                    continue
                payload = _payload(comp)
                if payload is None:
                    warnings.warn(
                        f"reward {comp.name!r} cannot be sent to a worker process (not picklable, no import "
                        "spec): it runs in-process, where a hung call cannot be killed. Define it at module level "
                        "to pool it.",
                        stacklevel=2,
                    )
                else:
                    payloads[comp.name] = payload
            self._pooled = set(payloads)
            self._pool = KillablePool(size, payloads) if payloads else None

    def __call__(self, prompts: list[str], completions: list[str], fields: dict[str, list] | None = None) -> RewardResult:
        n = len(completions)
        fields = dict(fields or {})
        if len(prompts) != n:
            raise ValueError(f"got {len(prompts)} prompts for {n} completions")
        for key, values in fields.items():
            if len(values) != n:
                raise ValueError(f"field {key!r} has {len(values)} values for {n} completions")
        components, metrics = {}, {}
        errors = timeouts = 0
        failed = [False] * n
        for comp in self.components:
            kwargs = self._kwargs(comp, fields)
            if comp.name in self._pooled:
                outcomes, counted = self._score_pooled(comp, prompts, completions, kwargs)
            else:
                outcomes, counted = self._score_local(comp, prompts, completions, kwargs)
            self._check_streak(comp.name, outcomes)
            values, comp_metrics, comp_failed, comp_errors, comp_timeouts = _reduce(comp.name, outcomes, counted)
            components[comp.name] = values
            metrics.update(comp_metrics)
            failed = [a or b for a, b in zip(failed, comp_failed)]
            errors, timeouts = errors + comp_errors, timeouts + comp_timeouts
        scored = [not f for f in failed]
        total = [
            sum(c.weight * (components[c.name][i] or 0.0) for c in self.components) if scored[i] else 0.0
            for i in range(n)
        ]
        metrics["reward/errors"] = float(errors)
        metrics["reward/timeouts"] = float(timeouts)
        if n:
            metrics["reward/failed_frac"] = failed.count(True) / n
        if any(scored):  # the mean of what the model earned: failures are no score
            metrics["reward/mean"] = sum(t for t, ok in zip(total, scored) if ok) / scored.count(True)
        return RewardResult(total, components, errors, metrics, scored)

    def _check_streak(self, name: str, outcomes: list) -> None:
        """Stop a reward that timed out on every sample of ``MAX_TIMEOUT_STREAK`` batches in a row: it hangs."""
        all_timed_out = bool(outcomes) and all(status == "timeout" for status, _ in outcomes)
        streak = self._timeout_streak[name] = self._timeout_streak.get(name, 0) + 1 if all_timed_out else 0
        if streak >= MAX_TIMEOUT_STREAK:
            raise RewardError(
                f"reward {name!r} timed out on every sample of {streak} batches in a row: raise "
                f"data.reward_timeout_s (now {self.timeout_s:g}) if it is slow, or fix the hang; "
                "data.reward_workers=auto kills hung calls")

    @staticmethod
    def _kwargs(comp: RewardComponent, fields: dict[str, list]) -> dict:
        clash = set(fields) & set(comp.kwargs)
        if clash:
            raise ValueError(f"reward {comp.name!r}: parameter(s) {sorted(clash)} are also batch fields; rename one")
        accepted = _accepted_names(comp.fn)
        passed = fields if accepted is None else {k: v for k, v in fields.items() if k in accepted}
        return {**passed, **comp.kwargs}

    def _score_local(self, comp: RewardComponent, prompts, completions, kwargs) -> tuple[list, dict]:
        n = len(completions)
        whole = getattr(comp.fn, "in_process", False)  # scores whole batches by design, maybe not thread-safe
        limit = self.timeout_s * max(1, n)  # the time per sample, as in the pool
        self._check_hung(comp.name)
        before = events.snapshot()
        [(status, value)] = self._timed.run([lambda: comp.fn(prompts, completions, **kwargs)], limit)
        if status == "ok":
            outcomes = [("ok", v) for v in _check_count(comp.name, value, n)]
        elif status == "error" and isinstance(value, RewardError):
            raise value  # the reward found that no sample can succeed (e.g. its server is down): retrying only waits
        elif status == "timeout" and whole:
            outcomes = [("timeout", None)] * n
        else:  # boundary: retried per sample to find the samples at fault, all under one more limit
            thunks = [lambda i=i: comp.fn([prompts[i]], [completions[i]], **_slice(kwargs, comp.kwargs, i))
                      for i in range(n)]
            outcomes = [("ok", _check_count(comp.name, v, 1)[0]) if s == "ok" else (s, v)
                        for s, v in self._timed.run(thunks, limit, parallel=not whole)]
        outcomes = [(s, f"{type(v).__name__}: {v}") if s == "error" else (s, v) for s, v in outcomes]
        return outcomes, events.delta(before, events.snapshot())

    def _check_hung(self, name: str) -> None:
        """Stop before in-process calls that never returned pile up (each holds a thread that cannot be stopped)."""
        hung = self._timed.hung()
        if hung >= MAX_HUNG:
            raise RewardError(
                f"{hung} in-process calls of reward {name!r} still run past data.reward_timeout_s and cannot be "
                "stopped: score it with data.reward_workers=auto (or N > 0), whose hung workers are killed")

    def _score_pooled(self, comp: RewardComponent, prompts, completions, kwargs) -> tuple[list, dict]:
        calls = [
            Call(comp.name, ([prompts[i]], [completions[i]]), _slice(kwargs, comp.kwargs, i))
            for i in range(len(completions))
        ]
        outcomes, counted = [], {}
        for status, value, delta in self._pool.run(calls, self.timeout_s):
            for key, count in delta.items():
                counted[key] = counted.get(key, 0) + count
            outcomes.append(("ok", _check_count(comp.name, value, 1)[0]) if status == "ok" else (status, value))
        return outcomes, counted

    def close(self) -> None:
        """Stop the worker processes (idempotent)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> "RewardPipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _slice(kwargs: dict, fixed: dict, i: int) -> dict:
    """Sample ``i`` of every per-sample field; fixed parameters pass unchanged."""
    return {k: (v if k in fixed else [v[i]]) for k, v in kwargs.items()}


def _reduce(name: str, outcomes: list, counted: dict) -> tuple[list, dict, list[bool], int, int]:
    """Values (None where the sample failed), metrics, failed flags, error count (timeouts included), timeout
    count."""
    values: list[float | None] = []
    failed: list[bool] = []
    raised = timed_out = nonfinite = out_of_range = 0
    first_error = None
    for i, (status, value) in enumerate(outcomes):
        x = _to_value(name, value, i) if status == "ok" else None
        bad = status != "ok" or (x is not None and (not math.isfinite(x) or abs(x) > MAX_ABS_REWARD))
        values.append(None if bad else x)
        failed.append(bad)
        if isinstance(value, Unscored):
            continue  # the reward counted why (verifier/..., judge/...): a timeout or an error below
        if status == "timeout":
            timed_out += 1
        elif status != "ok":
            raised += 1
            first_error = first_error or value
        elif bad and math.isfinite(x):
            out_of_range += 1
        elif bad:
            nonfinite += 1
    if outcomes and raised == len(outcomes):
        raise RewardError(
            f"reward {name!r} raised on every sample of the batch, which points at a bug in the reward "
            f"(a missing field? a wrong signature?): {first_error}"
        )
    if raised:
        logger.warning("reward %r raised on %d of %d samples (left out): %s", name, raised, len(outcomes), first_error)
    if out_of_range:
        logger.warning("reward %r returned %d values beyond +-%g (left out)", name, out_of_range, MAX_ABS_REWARD)
    failure_events = {kind: 0 for kind in ("error", "timeout")}
    for event, count in counted.items():
        if event in _FAILURE_EVENTS:
            failure_events[_FAILURE_EVENTS[event]] += count
    timeouts = timed_out + failure_events["timeout"]
    errors = raised + nonfinite + out_of_range + failure_events["error"] + timeouts
    metrics = _component_metrics(name, values, failed, counted)
    for key, count in {"errors": errors, "timeouts": timeouts, "nonfinite": nonfinite,
                       "out_of_range": out_of_range}.items():
        if count:
            metrics[f"reward/{name}/{key}"] = float(count)
    return values, metrics, failed, errors, timeouts


def _component_metrics(name: str, values: list, failed: list[bool], counted: dict) -> dict[str, float]:
    """Mean over the samples it scored; the fraction it does not apply to (None), failures not counted there."""
    present = [x for x in values if x is not None]
    answered = len(values) - failed.count(True)
    metrics: dict[str, float] = {}
    if present:
        metrics[f"reward/{name}/mean"] = sum(present) / len(present)
    if len(present) < answered:
        metrics[f"reward/{name}/none_frac"] = 1.0 - len(present) / answered
    for event, count in counted.items():
        metrics[f"reward/{name}/{event.replace('/', '_')}"] = float(count)
    return metrics
