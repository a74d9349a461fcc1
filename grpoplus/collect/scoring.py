"""Reward scoring: rollouts -> scored groups, through the reward pipeline.

A response a reward failed on, or a trajectory its environment broke (raised, timed out or answered malformed:
``signals.ENV_FAULTS``), has no score (``ScoredGroups.scored``): it is left out of its group's statistics and of
the loss. The pipeline's weighted total is the trained reward: shaping such as DAPO's soft overlong
punishment is one of its components (added by the build layer), so the logged
``reward/mean`` is exactly what the advantages are computed from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from grpoplus.containers import Rollouts, ScoredGroups
from grpoplus.metrics.signals import ENV_FAULTS
from grpoplus.tasks.base import is_correct, reward_fields


@dataclass
class Scorer:
    """Scores rollouts of ``examples`` with ``pipeline``; ``correct_key`` names the verifier component. A multi-turn
    trajectory's reward adds its environment's return (component ``env``). With a process reward model (``prm``,
    data.prm) a single-turn response's steps are scored: they become its ``turn_rewards`` / ``turn_ends``, the step
    rewards of ``algo.turn_credit``, and their sum is added to its reward (component ``prm``), as an environment's."""

    pipeline: object  # grpoplus.rewards.RewardPipeline
    examples: list
    correct_key: str = "task"
    prm: object | None = None  # grpoplus.rewards.prm.ProcessRewardModel
    tokenizer: object | None = None  # the policy's tokenizer: the PRM cuts steps on the sampled ids with it

    def __call__(self, rollouts: Rollouts) -> tuple[ScoredGroups, dict[str, float]]:
        """Returns the scored groups and the reward pipeline's metrics."""
        per_row = [self.examples[rollouts.prompt_index[g]] for g in rollouts.group_ids.tolist()]
        fields = reward_fields(per_row)
        fields.update(completion_length=rollouts.lengths.tolist(), finished=rollouts.finished.tolist())
        result = self.pipeline([ex.prompt for ex in per_row], rollouts.texts, fields)
        correct = torch.tensor([is_correct(c) for c in result.components[self.correct_key]], dtype=torch.bool)
        rewards = torch.tensor(result.total, dtype=torch.float32)
        scored = torch.tensor(result.scored, dtype=torch.bool)
        if rollouts.end_reasons is not None:  # a trajectory its environment broke has no score either
            scored &= torch.tensor([reason not in ENV_FAULTS for reason in rollouts.end_reasons], dtype=torch.bool)
        components, metrics = result.components, result.metrics
        if self.prm is not None:
            rollouts, prm_metrics = process_rewards(self.prm, self.tokenizer, rollouts, [ex.prompt for ex in per_row])
            metrics = dict(metrics, **prm_metrics)
        returns = rollouts.env_returns
        if returns is not None:  # R_i = the environment's return + the pipeline's rewards (ALGORITHMS.md section 12)
            rewards = rewards + returns
            components = dict(components, **{"env" if self.prm is None else "prm": returns.tolist()})
            if scored.any():  # over the scored responses, as the pipeline's
                metrics = dict(metrics, **{"reward/mean": float(rewards[scored].mean())})
        return ScoredGroups(rollouts, rewards, correct, components, None if scored.all() else scored), metrics

    def close(self) -> None:
        self.pipeline.close()


def process_rewards(prm, tokenizer, rollouts: Rollouts, prompts: list[str]) -> tuple[Rollouts, dict[str, float]]:
    """``rollouts`` with the PRM's step rewards and step ends as their turn rewards and turn ends, and the
    ``prm/*`` metrics."""
    if rollouts.turn_rewards is not None:
        raise ValueError("data.prm scores the steps of single-turn responses, but these rollouts are multi-turn")
    step_rewards, step_ends = prm.score(prompts, rollouts.response_lists(), tokenizer)
    flat = [x for steps in step_rewards for x in steps]
    metrics = {"prm/steps_mean": sum(map(len, step_ends)) / max(1, len(step_ends)),
               "prm/step_reward_mean": sum(flat) / max(1, len(flat))}
    return dataclasses.replace(rollouts, turn_rewards=step_rewards, turn_ends=step_ends), metrics
