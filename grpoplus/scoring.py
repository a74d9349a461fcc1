"""Reward scoring: rollouts -> scored groups, through the reward pipeline.

The pipeline's weighted total is the trained reward: shaping such as DAPO's soft overlong
punishment is one of its components (added by the build layer), so the logged
``reward/mean`` is exactly what the advantages are computed from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpoplus.containers import Rollouts, ScoredGroups
from grpoplus.tasks.base import is_correct, reward_fields


@dataclass
class Scorer:
    """Scores rollouts of ``examples`` with ``pipeline``; ``correct_key`` names the verifier component. A multi-turn
    trajectory's reward adds its environment's return (component ``env``)."""

    pipeline: object  # grpoplus.rewards.RewardPipeline
    examples: list
    correct_key: str = "task"

    def __call__(self, rollouts: Rollouts) -> tuple[ScoredGroups, dict[str, float]]:
        """Returns the scored groups and the reward pipeline's metrics."""
        per_row = [self.examples[rollouts.prompt_index[g]] for g in rollouts.group_ids.tolist()]
        fields = reward_fields(per_row)
        fields.update(completion_length=rollouts.lengths.tolist(), finished=rollouts.finished.tolist())
        result = self.pipeline([ex.prompt for ex in per_row], rollouts.texts, fields)
        correct = torch.tensor([is_correct(c) for c in result.components[self.correct_key]], dtype=torch.bool)
        rewards = torch.tensor(result.total, dtype=torch.float32)
        components, metrics = result.components, result.metrics
        returns = rollouts.env_returns
        if returns is not None:  # R_i = the environment's return + the pipeline's rewards (ALGORITHMS.md section 12)
            rewards = rewards + returns
            components = dict(components, env=returns.tolist())
            metrics = dict(metrics, **{"reward/mean": float(rewards.mean())})
        return ScoredGroups(rollouts, rewards, correct, components), metrics

    def close(self) -> None:
        self.pipeline.close()
