"""Rewards cannot hang a run or lie to it: a hung in-process reward is timed out, and a failed score (raised, timed
out, NaN, absurd) is left out of its group's statistics and of the loss instead of being trained on as a 0."""

import textwrap
import time

import pytest
import torch

from grpoplus.algo import AlgoConfig, compute_advantages, dynamic_sampling_keep
from grpoplus.containers import Rollouts, ScoredGroups
from grpoplus.entry.cli import main
from grpoplus.learner.prepare import LearnerPlan, prepare
from grpoplus.metrics import read_metrics
from grpoplus.rewards import RewardComponent, RewardPipeline


def odd(prompts, completions, **fields):
    """Completion "x<k>" scores k; "boom" raises, "nan" is NaN, "huge" is 1e30, "hang" sleeps far past the limit."""
    out = []
    for c in completions:
        if c == "boom":
            raise RuntimeError("boom")
        if c == "hang":
            time.sleep(60)
        out.append({"nan": float("nan"), "huge": 1e30}.get(c) or float(c[1:]))
    return out


def test_an_in_process_reward_sleeping_far_past_its_limit_does_not_hang_the_call():
    pipe = RewardPipeline([RewardComponent("odd", odd)], timeout_s=0.25)
    result = pipe(["q"] * 2, ["x1", "hang"], {})  # at most 2 x (2 x 0.25 s): the batch's limit and the retry's
    assert result.scored == [True, False] and result.components["odd"] == [1.0, None]
    assert result.metrics["reward/timeouts"] == 1.0 and result.metrics["reward/failed_frac"] == 0.5


def scored_groups(texts: list[str], timeout_s: float = 0.05) -> ScoredGroups:
    """Groups of 4 responses (one per text), scored by ``odd`` through the pipeline."""
    n, t = len(texts), 3
    result = RewardPipeline([RewardComponent("odd", odd)], timeout_s=timeout_s)(["q"] * n, texts, {})
    ids, ones = torch.randint(5, 40, (n, t)), torch.ones(n, t)
    rollouts = Rollouts(ids, ones.long(), ids, ones, -ones, torch.ones(n, dtype=torch.bool), torch.arange(n) // 4,
                        texts, list(range(n // 4)))
    return ScoredGroups(rollouts, torch.tensor(result.total), torch.zeros(n, dtype=torch.bool), result.components,
                        torch.tensor(result.scored))


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "batch_std", "reinforce_pp"])
def test_failed_samples_are_left_out_of_group_statistics_and_of_the_loss(estimator):
    # group 0: x1 boom x3 x4; group 1: x0 nan x2 huge; group 2: x5 x5 x6 hang
    texts = ["x1", "boom", "x3", "x4", "x0", "nan", "x2", "huge", "x5", "x5", "x6", "hang"]
    scored = scored_groups(texts)
    assert scored.scored.tolist() == [True, False, True, True, True, False, True, False, True, True, True, False]
    batch, _, _ = prepare(scored, None, None, AlgoConfig.preset("grpo", adv_estimator=estimator),
                          LearnerPlan(temperature=1.0, micro_batch_size=4, max_grad_norm=1.0, logp_old="rollout"))
    ok = scored.scored
    # an independent computation over the scored samples alone: [1, 3, 4], [0, 2], [5, 5, 6]
    alone = compute_advantages(torch.tensor([1.0, 3, 4, 0, 2, 5, 5, 6]), torch.tensor([0, 0, 0, 1, 1, 2, 2, 2]),
                               estimator=estimator)
    assert torch.allclose(batch.advantages[ok], alone, atol=1e-6)
    assert batch.advantages[~ok].abs().sum() == 0  # no policy gradient from a failure
    assert batch.loss_mask[~ok].sum() == 0 and batch.loss_mask[ok].bool().all()  # nor loss tokens to dilute a mean


def test_a_group_with_fewer_than_two_scored_samples_has_no_spread():
    scored = scored_groups(["x1", "boom", "nan", "huge", "x1", "x2", "boom", "nan"])
    keep = dynamic_sampling_keep(scored.rewards, scored.rollouts.group_ids, scored=scored.scored)
    # group 0 has one score left (its placeholders 0 would have faked a spread), group 1 has 1 and 2
    assert keep.tolist() == [False] * 4 + [True] * 4


@pytest.mark.slow
def test_a_short_run_with_a_reward_hanging_on_some_samples_finishes_and_reports_the_timeouts(nano_dir, tmp_path):
    reward = tmp_path / "hangs.py"
    reward.write_text(textwrap.dedent("""
        import time

        def hangs(prompts, completions, **fields):
            if any(sum(map(ord, c)) % 4 == 0 for c in completions):  # about a quarter of the samples
                time.sleep(60)
            return [0.1 * (len(c) % 3) for c in completions]
    """))
    out = tmp_path / "run"
    assert main(["train", "--model", nano_dir, "--out", str(out), "max_steps=2", "eval_every=0",
                 f"rewards=[task,{reward}:hangs]", "reward_timeout_s=0.1", "prompts_per_step=4", "group_size=4",
                 "max_new_tokens=10", "progress=false", "loggers=[]", "micro_batch_size=8"]) == 0
    records = [r for r in read_metrics(out) if r["step"] > 0]
    assert len(records) == 2
    assert sum(r["reward/timeouts"] for r in records) > 0
    assert sum(r["reward/hangs/timeouts"] for r in records if "reward/hangs/timeouts" in r) > 0
    assert all(0 < r["reward/failed_frac"] < 1 for r in records if r["reward/timeouts"])
