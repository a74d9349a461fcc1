"""Collection: prompts -> rollouts -> scored groups, with the group filters of ALGORITHMS.md section 6 (the rewards of
the rollouts through the reward pipeline: :mod:`grpoplus.collect.scoring`).

One call draws ``prompts_per_step`` prompts, samples ``G`` responses each with the rollout
engine, scores them, and applies the group filter:

- dynamic sampling (DAPO): drop groups whose rewards are all equal (only scored responses count: a group
  with fewer than 2 has no spread) and draw again until
  ``prompts_per_step`` groups with spread are kept or ``max_rounds`` rounds are spent, then
  train on exactly the first ``prompts_per_step`` kept groups; a later round draws only the
  shortfall, over-sampled by the kept fraction seen so far (:func:`next_draw`);
- zero-variance filtering: drop those groups, no refill;
- none: keep every group.

Metrics: ``sampling/rounds``, ``sampling/groups_drawn``, ``sampling/groups_kept`` (groups with
spread, every round), ``sampling/oversample`` (groups drawn per group trained on: the
sampling cost of the filter; not logged on a step that trains on nothing).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from grpoplus import algo as A
from grpoplus.containers import Collected, Rollouts, SamplingParams, ScoredGroups
from grpoplus.data.images import load_image
from grpoplus.data.order import PromptSampler
from grpoplus.envs.episodes import EpisodePlan
from grpoplus.metrics.step import reduce_metrics
from grpoplus.rollout.base import check_rollouts


@dataclass(frozen=True, kw_only=True)
class CollectPlan:
    """How collection draws and filters, decided once from the config."""

    params: SamplingParams
    prompts_per_step: int
    group_filter: str  # "dynamic" | "zero_variance" | "none"
    max_rounds: int  # sampling rounds per step (1 unless dynamic sampling)
    pad_id: int
    episodes: EpisodePlan | None = None  # multi-turn: each response is a trajectory played in an environment

    @classmethod
    def from_algo(cls, algo: A.AlgoConfig, params: SamplingParams, prompts_per_step: int, pad_id: int,
                  episodes: EpisodePlan | None = None):
        group_filter = "dynamic" if algo.dynamic_sampling else "zero_variance" if algo.zero_variance_filter else "none"
        max_rounds = algo.max_sampling_rounds if algo.dynamic_sampling else 1
        return cls(params=params, prompts_per_step=prompts_per_step, group_filter=group_filter, max_rounds=max_rounds,
                   pad_id=pad_id, episodes=episodes)


def sample(engine, examples: list, idx: list[int], params: SamplingParams, episodes: EpisodePlan | None,
           generator: torch.Generator | None) -> tuple[Rollouts, dict[str, float]]:
    """``params.n`` responses to each example: one engine call, or with ``episodes`` whole trajectories played in
    their environments (with the ``env/*`` metrics)."""
    chosen = [examples[i] for i in idx]
    if episodes is not None:
        return episodes.run(engine, chosen, params, idx, generator)
    shown = [getattr(ex, "images", ()) for ex in chosen]  # a vision-language policy's prompt images
    images = [[load_image(s) for s in own] for own in shown] if any(shown) else None
    rollouts = engine.generate([ex.prompt for ex in chosen], params, prompt_index=idx, generator=generator,
                               **({} if images is None else {"images": images}))
    return check_rollouts(rollouts, len(idx), params, engine.name), {}


def collect(engine, sampler: PromptSampler, examples: list, scorer, plan: CollectPlan,
            generator: torch.Generator) -> Collected:
    """Sample, score and filter one rollout batch (see the module docstring)."""
    kept: list[ScoredGroups] = []
    drawn: list[ScoredGroups] = []
    round_metrics: list[tuple[dict, float]] = []
    times = {"time/rollout_s": 0.0, "time/reward_s": 0.0}
    draw = plan.prompts_per_step
    while draw > 0:
        idx = sampler.next(draw)
        t0 = time.perf_counter()
        rollouts, env_metrics = sample(engine, examples, idx, plan.params, plan.episodes, generator)
        t1 = time.perf_counter()
        scored, metrics = scorer(rollouts)
        metrics.update(env_metrics)
        times["time/env_s"] = times.get("time/env_s", 0.0) + metrics.pop("time/env_s", 0.0)
        times["time/rollout_s"] += t1 - t0
        times["time/reward_s"] += time.perf_counter() - t1
        drawn.append(scored)
        round_metrics.append((metrics, float(len(scored.rewards))))
        scored = _filter(scored, plan.group_filter)
        if scored is not None:
            kept.append(scored)
        draw = next_draw(plan, len(drawn), sum(d.num_groups for d in drawn), sum(k.num_groups for k in kept))
    batch = _first_groups(ScoredGroups.concat(kept, plan.pad_id), plan.prompts_per_step) if kept else None
    metrics = reduce_metrics(round_metrics)
    metrics.update(times)
    metrics.update(_sampling_metrics(len(drawn), sum(d.num_groups for d in drawn), sum(k.num_groups for k in kept),
                                     batch.num_groups if batch else 0))
    return Collected(batch, drawn, metrics)


def next_draw(plan: CollectPlan, rounds: int, groups_drawn: int, groups_kept: int) -> int:
    """Prompts the next dynamic-sampling round draws; 0 = collection is done.

    The shortfall ``S = prompts_per_step - groups_kept`` divided by the kept fraction seen so
    far this step (``groups_kept / groups_drawn``), rounded up: the expected number of
    draws that yields S groups with spread. So one failing group costs a handful of extra
    prompts, not a whole second batch. (verl's DAPO recipe over-samples by a fixed factor, 3 x
    the training batch per generation round, and repeats whole rounds; here the factor is the
    inverse kept fraction the step has measured.) Capped at ``prompts_per_step``, the batch the
    engine is sized for; with nothing kept yet, a full batch.
    """
    shortfall = plan.prompts_per_step - groups_kept
    if plan.group_filter != "dynamic" or rounds >= plan.max_rounds or shortfall <= 0:
        return 0
    if groups_kept == 0:
        return plan.prompts_per_step
    return min(plan.prompts_per_step, -(-shortfall * groups_drawn // groups_kept))  # exact integer ceil


def _sampling_metrics(rounds: int, groups_drawn: int, groups_kept: int, groups_trained: int) -> dict[str, float]:
    out = {"sampling/rounds": float(rounds), "sampling/groups_drawn": float(groups_drawn),
           "sampling/groups_kept": float(groups_kept)}
    if groups_trained:
        out["sampling/oversample"] = groups_drawn / groups_trained
    return out


def _filter(scored: ScoredGroups, group_filter: str) -> ScoredGroups | None:
    """The groups with reward spread (or all of them when there is no filter); None if none is left."""
    if group_filter == "none":
        return scored
    keep = A.dynamic_sampling_keep(scored.rewards, scored.rollouts.group_ids, scored=scored.scored)
    return scored.select(torch.nonzero(keep).squeeze(1)) if keep.any() else None


def _first_groups(scored: ScoredGroups, max_groups: int) -> ScoredGroups:
    """DAPO trains on exactly B groups: the first ``max_groups`` of the kept ones."""
    if scored.num_groups <= max_groups:
        return scored
    return scored.select(torch.nonzero(scored.rollouts.group_ids < max_groups).squeeze(1))
