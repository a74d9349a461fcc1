"""Multi-turn collection: the engine samples one turn for every live trajectory of the batch at once, the
environments answer concurrently, their observations are appended as ids, and ended trajectories leave the
batch (ALGORITHMS.md section 12).

Rounds: the trajectories whose environments have answered take their next turn together. A round waits for every
step in flight while they answer promptly; once ``patience_s`` has passed with some answered, those go on and a
straggler keeps running (its own deadline is ``timeout_s``) and joins a later round when it answers. So a slow
tool delays the others by at most ``patience_s``, and a run whose environments all answer within it samples the
same batches, the same way, every time (reproducible); a straggler makes which turns are sampled together depend
on timing.

Every trajectory owns its environment, made from its data row; ``G`` trajectories share a prompt (a group).
A trajectory ends, with the reason recorded (``env/ended/<reason>``), when

- ``done``: the environment says so (the only *finished* ending);
- ``max_turns``: the policy has taken ``max_turns`` turns;
- ``length``: a turn reached ``max_new_tokens`` without its end token, or the trajectory's token budget ran out;
- ``context``: an observation would overflow the budget or the engine's context;
- ``error`` / ``timeout`` / ``malformed``: the environment raised, did not answer within ``timeout_s``, or
  answered something that is not a step result. Counted, never a crash and never a hang; the trajectory has no
  score (:mod:`grpoplus.collect.scoring`: left out of its group's statistics and of the loss, as a failed reward's sample).

Environment tokens are attended to but carry no loss (``Rollouts.model_mask``); nothing sampled is re-tokenized.
"""

from __future__ import annotations

import inspect
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from grpoplus.containers import Rollouts, SamplingParams
from grpoplus.envs.adapters import adapt
from grpoplus.envs.base import MalformedStep, as_step, check_observation, make
from grpoplus.envs.calls import InFlight, Outcome, awaited, run_all
from grpoplus.envs.drift import drifted
from grpoplus.envs.render import first_prompt_ids, is_tool_result, messages, observation_ids, text_of
from grpoplus.envs.trajectory import Trajectory, Turn, to_rollouts
from grpoplus.envs.vision_turns import (
    context_inputs,
    row_opening,
    shows_images,
    trajectory_inputs,
    vision_observation,
    vision_opening,
    vision_row_prompt,
)
from grpoplus.models.vision import VisionInputs, processor_of
from grpoplus.rollout.base import check_rollouts

REASONS = ("done", "max_turns", "length", "context", "error", "timeout", "malformed")
TURN_METRICS = 8  # env/turn_reward/k is logged for the first turns


@dataclass(frozen=True)
class EpisodeLimits:
    """Bounds on one trajectory."""

    max_turns: int = 8
    max_tokens: int = 0  # sampled + observation tokens after the prompt (0: no budget beyond max_turns)
    timeout_s: float = 30.0  # per reset / step / close call
    patience_s: float = 2.0  # once some steps of a round answered, how long the round waits for the others
    max_context: int = 1024  # prompt + response must fit the engine's context


@dataclass(frozen=True, kw_only=True)
class EpisodePlan:
    """How a run plays its environments, decided once from the config: the factory, the limits and the tokenizer
    (multi-turn collection: each response is a trajectory played in its own environment)."""

    factory: Callable[..., Any]
    limits: EpisodeLimits
    tokenizer: Any
    chat: bool = True  # a row's prompt goes through the chat template when the tokenizer has one
    warned: set = field(default_factory=set, compare=False, repr=False)  # environment failures said on stderr

    def run(self, engine, examples: list, params: SamplingParams, prompt_index: list[int],
            generator: torch.Generator | None) -> tuple[Rollouts, dict[str, float]]:
        return run_episodes(engine, self.tokenizer, self.factory, [row_of(ex) for ex in examples], params,
                            self.limits, generator, prompt_index, chat=self.chat, warned=self.warned)


def row_of(example) -> dict:
    """A task example as the data row an environment is made from: ``prompt``, ``answer`` and its extra fields (its
    ``images`` among them, where its prompt shows some)."""
    images = getattr(example, "images", ())
    return {"prompt": example.prompt, "answer": example.answer, **example.fields, **({"images": images} if images else {})}


@dataclass
class Episode:
    """One live trajectory: its environment, its ids so far, and how it ended."""

    env: Any
    prompt: list[int]
    turns: list[Turn] = field(default_factory=list)
    reason: str | None = None
    tool_calls: int = 0
    tool_errors: int = 0
    opening: list[dict] | None = None  # the messages the prompt was rendered from (None: raw text)
    said: list = field(default_factory=list)  # each turn's observation as the environment gave it
    tools: list[dict] | None = None  # the tool schemas the prompt described
    vision: VisionInputs | None = None  # a vision-language policy's: the prompt's processor outputs

    @property
    def used(self) -> int:
        return sum(len(t.sampled) + len(t.observation) for t in self.turns)

    def context(self) -> list[int]:
        return self.prompt + [i for t in self.turns for i in t.sampled + t.observation]


def run_episodes(engine, tokenizer, factory: Callable[..., Any], rows: list[dict], params: SamplingParams,
                 limits: EpisodeLimits, generator: torch.Generator | None = None,
                 prompt_index: list[int] | None = None, chat: bool = True,
                 warned: set[str] | None = None) -> tuple[Rollouts, dict[str, float]]:
    """``params.n`` trajectories per row (groups contiguous), each with its own environment; returns the rollouts
    (``model_mask`` 0 on observations, per-turn rewards and turn ends) and the ``env/*`` metrics. ``chat``: a row
    prompt goes through the tokenizer's chat template (when a reset answers none of its own). ``warned``: the kinds of
    environment failure already said on stderr (a run's own set, so each run says its first failure of a kind once)."""
    warned = set() if warned is None else warned
    t0 = time.perf_counter()
    expanded = [row for row in rows for _ in range(params.n)]
    episodes = _start(tokenizer, factory, expanded, limits, chat, warned)
    _check_room(episodes, limits)
    env_s = time.perf_counter() - t0
    turn = replace(params, n=1)
    versions = []  # the policy version of every turn's sampler: the trajectories carry the oldest
    steps = InFlight()
    while True:
        ready = _ready(episodes, steps, limits)
        if ready:
            versions += _sample_turn(engine, tokenizer, [e for _, e in ready], turn, limits, generator)
            _start_steps(steps, tokenizer, [(i, e) for i, e in ready if e.reason is None], limits)
        if not len(steps):
            break
        t1 = time.perf_counter()
        for i, outcome in steps.wait(limits.patience_s).items():
            _answer(tokenizer, episodes[i], outcome, limits, warned)
        env_s += time.perf_counter() - t1
    t2 = time.perf_counter()
    run_all([e.env.close for e in episodes if callable(getattr(e.env, "close", None))], limits.timeout_s)
    env_s += time.perf_counter() - t2
    trajectories = [Trajectory(e.prompt, e.turns, e.reason == "done", _text(tokenizer, e), e.reason,
                               None if e.vision is None else trajectory_inputs(e)) for e in episodes]
    rollouts = to_rollouts(trajectories, [i // params.n for i in range(len(episodes))],
                           list(prompt_index) if prompt_index is not None else list(range(len(rows))),
                           engine.pad_id, policy_version=min(versions, default=getattr(engine, "version", 0)))
    metrics = dict(episode_metrics(episodes), **{"time/env_s": env_s})
    metrics["env/retokenize_drift"] = sum(drifted(tokenizer, e) for e in episodes) / len(episodes)
    return rollouts, metrics


def _check_room(episodes: list[Episode], limits: EpisodeLimits) -> None:
    """Refuse, in one line, trajectories whose first prompt (the row's, rendered with the tools' descriptions) leaves
    the model's context no room for a token: nothing could be sampled, and a run would take it for cut answers."""
    full = [e for e in episodes if e.reason is None and len(e.prompt) >= limits.max_context]
    if not full:
        return
    run_all([e.env.close for e in episodes if callable(getattr(e.env, "close", None))], limits.timeout_s)
    tools = " with the tools' descriptions" if any(e.tools for e in full) else ""
    raise ValueError(f"{len(full)} of {len(episodes)} trajectories open with a prompt of up to "
                     f"{max(len(e.prompt) for e in full)} tokens (the row's prompt{tools}), and the model's context "
                     f"holds {limits.max_context}: nothing can be sampled; shorten the prompts or the tools' "
                     "descriptions (data.tools), or use a model with a longer context")


def _start(tokenizer, factory, rows: list[dict], limits: EpisodeLimits, chat: bool, warned: set[str]) -> list[Episode]:
    """Make and reset one environment per trajectory, concurrently (a factory may be slow too); the first
    observation, when there is one, is the prompt, else the row's prompt (as a user message for a chat model)."""
    envs: list[Any] = [None] * len(rows)

    def start(i: int, row: dict):
        envs[i] = adapt(make(factory, row))
        return _reset(envs[i], row)

    resets = run_all([lambda i=i, row=row: start(i, row) for i, row in enumerate(rows)], limits.timeout_s)
    episodes = []
    for row, env, r in zip(rows, envs, resets):
        tools = getattr(env, "tool_schemas", None)
        opening = messages(r.value) if r.ok else []
        shown = row.get("images") if not opening else None
        if not opening and chat:  # the row's prompt as the opening messages, showing the row's images
            opening, shown = (row_opening(row["prompt"], tuple(shown)) if shown else messages(row["prompt"])), None
        episode = Episode(env, [], opening=opening or None, tools=tools)
        try:
            episode.prompt, episode.vision = _prompt(tokenizer, row, opening, tools, shown)
        except ValueError as err:  # an image that does not decode, or one a text policy was shown
            r = Outcome(error=MalformedStep(str(err)))
            episode.prompt = tokenizer(text_of(row["prompt"]))["input_ids"]
        if not r.ok:
            episode.reason = _failure(r, "reset", warned)
        episodes.append(episode)
    return episodes


def _prompt(tokenizer, row: dict, opening: list[dict], tools, shown) -> tuple[list[int], VisionInputs | None]:
    """A trajectory's prompt ids (and a vision-language policy's processor outputs): from its opening messages, or
    the row's prompt as it is (text that shows the row's images ``shown``, or a template-less model's text)."""
    processor = processor_of(tokenizer)
    if processor is not None:
        if opening:
            return vision_opening(processor, opening, tools)
        return vision_row_prompt(processor, row["prompt"], tuple(shown or ()))
    if shown or shows_images(opening):
        raise ValueError("the prompt shows images, and the policy is a text model: use a vision-language policy")
    return (first_prompt_ids(tokenizer, opening, tools) if opening else tokenizer(row["prompt"])["input_ids"]), None


def _reset(env, row: dict):
    obs = awaited(env.reset(**reset_kwargs(env.reset, row)))
    if isinstance(obs, tuple) and len(obs) == 2 and isinstance(obs[1], dict):  # Gymnasium: (observation, info)
        obs = obs[0]
    check_observation(obs)
    return obs


def reset_kwargs(reset, row: dict) -> dict:
    """What ``reset`` takes of the row: every field when it takes ``**row`` (a native environment); the fields it
    names; else, for a Gymnasium-style ``reset(seed=None, options=None)``, the row as its ``options``."""
    try:
        params = inspect.signature(reset).parameters
    except (TypeError, ValueError):
        return row
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return row
    named = {key: value for key, value in row.items() if key in params}
    if not named and "options" in params:
        return {"options": dict(row)}
    return named


def _sample_turn(engine, tokenizer, live: list[Episode], params: SamplingParams, limits: EpisodeLimits,
                 generator) -> list[int]:
    """One turn for every live trajectory at once; each row cut at its own cap (budget and context). Returns the
    policy version that sampled it (none when no trajectory had room left)."""
    contexts = [e.context() for e in live]
    caps = [min(params.max_new_tokens, limits.max_context - len(c),
                (limits.max_tokens - e.used) if limits.max_tokens else params.max_new_tokens)
            for e, c in zip(live, contexts)]
    for e, cap in zip(live, caps):
        if cap <= 0:
            e.reason = "length" if limits.max_tokens and e.used >= limits.max_tokens else "context"
    active = [(e, c, cap) for e, c, cap in zip(live, contexts, caps) if cap > 0]
    if not active:
        return []
    turn = replace(params, max_new_tokens=max(cap for _, _, cap in active))
    shown = {"vision": [context_inputs(e) for e, _, _ in active]} if active[0][0].vision is not None else {}
    out = check_rollouts(engine.generate([c for _, c, _ in active], turn, generator=generator, **shown), len(active),
                         turn, engine.name)
    for row, (e, _, cap) in enumerate(active):
        n = int(out.response_mask[row].sum())
        ids, logp = out.response_ids[row, :n].tolist(), out.logp_roll[row, :n].tolist()
        ended = bool(out.finished[row]) and n <= cap
        e.turns.append(Turn(ids[:cap], logp[:cap]))
        if not ended:
            e.reason = "length"
    return [out.policy_version]


def _ready(episodes: list[Episode], steps: InFlight, limits: EpisodeLimits) -> list[tuple[int, Episode]]:
    """The live trajectories whose environment has answered: they take their next turn (or end at max_turns)."""
    ready = []
    for i, e in enumerate(episodes):
        if e.reason is not None or i in steps.deadlines:
            continue
        if len(e.turns) >= limits.max_turns:
            e.reason = "max_turns"
        else:
            ready.append((i, e))
    return ready


def _start_steps(steps: InFlight, tokenizer, started: list[tuple[int, Episode]], limits: EpisodeLimits) -> None:
    """Each environment starts answering its trajectory's last turn (in flight until it answers)."""
    for i, e in started:
        action = tokenizer.decode(e.turns[-1].sampled, skip_special_tokens=True)
        steps.start(i, lambda e=e, a=action: as_step(awaited(e.env.step(a))), limits.timeout_s)


def _answer(tokenizer, e: Episode, outcome: Outcome, limits: EpisodeLimits, warned: set[str]) -> None:
    """What an environment answered to the trajectory's last turn: the turn's reward, then the end of the episode
    or the observation appended (if there is room for it and a next turn)."""
    if not outcome.ok:
        e.reason = _failure(outcome, "step", warned)
        return
    result = outcome.value
    e.turns[-1].reward = None if result.reward is None else float(result.reward)
    e.tool_calls += int(result.info.get("tool_calls", 0))
    e.tool_errors += int(result.info.get("tool_errors", 0))
    if result.done:
        e.reason = "done"
        return
    try:
        obs, shown = _observation(tokenizer, e, result.observation)
    except ValueError as err:
        e.reason = _failure(Outcome(error=MalformedStep(str(err))), "step", warned)
        return
    room = limits.max_context - len(e.context())
    if limits.max_tokens:
        room = min(room, limits.max_tokens - e.used)
    if len(obs) >= room:  # no room left for the observation and a next turn
        e.reason = "context"
    else:
        e.turns[-1].observation, e.turns[-1].shown = obs, shown
        e.turns[-1].by_tool = is_tool_result(result.observation)
        e.said.append(result.observation)


def _observation(tokenizer, e: Episode, obs) -> tuple[list[int], VisionInputs | None]:
    """An observation's ids (and a vision-language policy's processor outputs); ``ValueError`` for one that cannot be
    appended (an image a text policy was shown, or one that does not decode)."""
    if e.vision is not None:
        return vision_observation(processor_of(tokenizer), obs)
    if shows_images(obs):
        raise ValueError("the observation shows an image, and the policy is a text model: use a vision-language "
                         "policy, or observations of text")
    return observation_ids(tokenizer, obs), None


def _failure(outcome: Outcome, call: str, warned: set[str]) -> str:
    """The ending a failed call gives its trajectory; the first failure of each kind (not yet in ``warned``) is said
    once on stderr."""
    reason = "timeout" if outcome.timed_out else "malformed" if isinstance(outcome.error, MalformedStep) else "error"
    what = "did not answer in time" if outcome.timed_out else f"{type(outcome.error).__name__}: {outcome.error}"
    key = f"{call}:{reason}:{type(outcome.error).__name__}"
    if key not in warned:
        warned.add(key)
        print(f"grpoplus: warning: an environment's {call} {what} (its trajectory ends, counted in env/ended/{reason};"
              " said once)", file=sys.stderr)
    return reason


def _text(tokenizer, e: Episode) -> str:
    """The transcript the reward functions read: every turn's text and observation, special tokens dropped."""
    return tokenizer.decode([i for t in e.turns for i in t.sampled + t.observation], skip_special_tokens=True)


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    """``env/*``: turns, endings, observation share, environment returns and per-turn rewards, tool use."""
    n = len(episodes)
    turns = torch.tensor([float(len(e.turns)) for e in episodes])
    sampled = sum(len(t.sampled) for e in episodes for t in e.turns)
    observed = sum(len(t.observation) for e in episodes for t in e.turns)
    out = {"env/turns_mean": float(turns.mean()), "env/turns_max": float(turns.max()),
           "env/obs_token_frac": observed / max(1, sampled + observed),
           "env/return_mean": sum(_return(e.turns) for e in episodes) / n,
           "env/tool_calls": float(sum(e.tool_calls for e in episodes)),
           "env/tool_call_frac": sum(e.tool_calls > 0 for e in episodes) / n,
           "env/tool_errors": float(sum(e.tool_errors for e in episodes)),
           "env/errors": float(sum(e.reason in ("error", "malformed") for e in episodes)),
           "env/timeouts": float(sum(e.reason == "timeout" for e in episodes))}
    out.update({f"env/ended/{r}": sum(e.reason == r for e in episodes) / n for r in REASONS})
    for k in range(TURN_METRICS):
        rewards = [e.turns[k].reward for e in episodes if len(e.turns) > k and e.turns[k].reward is not None]
        if rewards:
            out[f"env/turn_reward/{k + 1}"] = sum(rewards) / len(rewards)
    return out


def _return(turns: list[Turn]) -> float:
    return sum(t.reward for t in turns if t.reward is not None)
