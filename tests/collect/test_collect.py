"""Collection with dynamic sampling: later rounds draw only the shortfall; DAPO's exactly-B rule; the metrics of
every round count."""

import torch

from grpoplus.collect import CollectPlan, collect, next_draw
from grpoplus.containers import Rollouts, SamplingParams, ScoredGroups
from grpoplus.data.order import PromptSampler
from grpoplus.metrics.step import reduce_metrics
from grpoplus.tasks.base import Example


class CountingEngine:
    """Returns G one-token responses per prompt and records how many prompts each call drew."""

    name = "counting"

    def __init__(self):
        self.calls: list[list[int]] = []

    def generate(self, prompts, params, prompt_index=None, generator=None) -> Rollouts:
        self.calls.append(list(prompt_index))
        n = len(prompts) * params.n
        ones = torch.ones(n, 1)
        return Rollouts(prompt_ids=torch.ones(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1, dtype=torch.long),
                        response_ids=torch.ones(n, 1, dtype=torch.long), response_mask=ones, logp_roll=-ones,
                        finished=torch.ones(n, dtype=torch.bool), group_ids=torch.arange(n) // params.n,
                        texts=["x"] * n, prompt_index=list(prompt_index))


def flat_every_tenth(rollouts: Rollouts):
    """Rewards with spread (0, 1, 0, 1, ...) except for prompts whose index is a multiple of 10 (all 0)."""
    rows = torch.arange(len(rollouts.texts))
    index = torch.tensor([rollouts.prompt_index[g] for g in rollouts.group_ids.tolist()])
    rewards = torch.where(index % 10 == 0, torch.zeros(len(rows)), (rows % 2).float())
    return ScoredGroups(rollouts, rewards, rewards > 0, {"task": rewards.tolist()}), {"reward/mean": 0.0}


def _plan(group_filter="dynamic", batch=10, rounds=3):
    return CollectPlan(params=SamplingParams(n=2), prompts_per_step=batch, group_filter=group_filter, max_rounds=rounds,
                       pad_id=0)


def test_next_draw_is_the_shortfall_over_the_kept_fraction():
    plan = _plan(batch=32)
    assert next_draw(plan, rounds=1, groups_drawn=32, groups_kept=29) == 4  # ceil(3 * 32 / 29) = ceil(3.31)
    assert next_draw(plan, rounds=1, groups_drawn=32, groups_kept=31) == 2  # ceil(1 * 32 / 31) = ceil(1.03)
    assert next_draw(plan, rounds=1, groups_drawn=32, groups_kept=16) == 32  # half kept: 16 / 0.5
    assert next_draw(plan, rounds=1, groups_drawn=32, groups_kept=4) == 32  # 28 / 0.125 = 224, capped at one batch
    assert next_draw(plan, rounds=1, groups_drawn=32, groups_kept=0) == 32  # nothing kept yet: a full batch
    assert next_draw(plan, rounds=2, groups_drawn=36, groups_kept=32) == 0  # enough
    assert next_draw(plan, rounds=3, groups_drawn=96, groups_kept=20) == 0  # max_sampling_rounds spent
    assert next_draw(_plan("zero_variance"), rounds=1, groups_drawn=10, groups_kept=3) == 0  # no refill


def test_dynamic_sampling_draws_only_the_shortfall_and_trains_on_exactly_b_groups():
    engine = CountingEngine()
    examples = [Example(f"p{i}", "0") for i in range(100)]
    sampler = PromptSampler(len(examples), seed=0)
    out = collect(engine, sampler, examples, flat_every_tenth, _plan(), torch.Generator())
    first = engine.calls[0]
    flat = sum(i % 10 == 0 for i in first)
    assert len(first) == 10 and flat > 0, first  # this seed's first batch holds a flat group
    # Round 2 draws ceil(flat * 10 / (10 - flat)) prompts, not another 10.
    assert len(engine.calls[1]) == -(-flat * 10 // (10 - flat))
    assert out.batch.num_groups == 10  # DAPO: exactly B groups when enough were kept
    drawn = sum(len(c) for c in engine.calls)
    kept = sum(i % 10 != 0 for c in engine.calls for i in c)
    assert out.metrics["sampling/rounds"] == len(engine.calls)
    assert out.metrics["sampling/groups_drawn"] == drawn < 20
    assert out.metrics["sampling/groups_kept"] == kept >= 10
    assert out.metrics["sampling/oversample"] == drawn / 10
    assert "sampling/kept_frac" not in out.metrics


def test_collection_resumes_exactly_from_the_sampler_state():
    examples = [Example(f"p{i}", "0") for i in range(100)]
    sampler = PromptSampler(len(examples), seed=3)
    collect(CountingEngine(), sampler, examples, flat_every_tenth, _plan(), torch.Generator())
    state = sampler.state()
    ahead = CountingEngine()
    collect(ahead, sampler, examples, flat_every_tenth, _plan(), torch.Generator())
    again, resumed = CountingEngine(), PromptSampler(len(examples), seed=3)
    resumed.load(state)
    collect(again, resumed, examples, flat_every_tenth, _plan(), torch.Generator())
    assert again.calls == ahead.calls


def test_zero_variance_filter_oversample_is_drawn_per_trained_group():
    engine = CountingEngine()
    examples = [Example(f"p{i}", "0") for i in range(100)]
    out = collect(engine, PromptSampler(100, seed=0), examples, flat_every_tenth, _plan("zero_variance"),
                  torch.Generator())
    assert len(engine.calls) == 1
    trained = out.batch.num_groups
    assert trained == sum(i % 10 != 0 for i in engine.calls[0])
    assert out.metrics["sampling/oversample"] == 10 / trained


def test_reward_metrics_of_all_sampling_rounds_count():
    # Two dynamic-sampling rounds: 2 + 1 errors and 0 + 3 timeouts happened in the step;
    # a fraction averages, (0.25 + 0.75) / 2 = 0.5.
    rounds = [{"reward/errors": 2.0, "reward/timeouts": 0.0, "reward/math/none_frac": 0.25},
              {"reward/errors": 1.0, "reward/timeouts": 3.0, "reward/math/none_frac": 0.75}]
    assert reduce_metrics((r, 32.0) for r in rounds) == {"reward/errors": 3.0, "reward/timeouts": 3.0,
                                                         "reward/math/none_frac": 0.5}
