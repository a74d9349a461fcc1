"""Reward scoring on Ray: each rollout batch is scored by a Ray task.

The task builds the reward pipeline once per Ray worker process (the same components,
``data.reward_workers`` pool and ``data.reward_timeout_s`` as in one process) and scores
with the same :class:`~grpoplus.collect.scoring.Scorer`, so the rewards and their metrics are those
one process computes; scoring runs off the driver, beside the rollout workers.
"""

from __future__ import annotations

import ray

from grpoplus.containers import Rollouts, ScoredGroups
from grpoplus.distributed.ray_cluster import wait

_SCORERS: dict[str, object] = {}  # per Ray worker process: spec key -> Scorer


@ray.remote(max_retries=0)
def score(key: str, spec: tuple, rollouts: Rollouts) -> tuple[ScoredGroups, dict[str, float]]:
    from grpoplus.collect.scoring import Scorer
    from grpoplus.rewards import RewardPipeline

    if key not in _SCORERS:
        components, examples, workers, timeout_s = spec
        _SCORERS[key] = Scorer(RewardPipeline(components, workers=workers, timeout_s=timeout_s), examples)
    return _SCORERS[key](rollouts)


class RayScorer:
    """The scorer contract (``scorer(rollouts) -> (ScoredGroups, metrics)``, ``close``) over Ray tasks."""

    def __init__(self, components: list, examples: list, workers: int | str, reward_timeout_s: float,
                 timeout_s: float):
        self._spec = ray.put((components, examples, workers, reward_timeout_s))
        self._key = self._spec.hex()
        self.timeout_s = timeout_s

    def __call__(self, rollouts: Rollouts) -> tuple[ScoredGroups, dict[str, float]]:
        return wait(score.remote(self._key, self._spec, rollouts), self.timeout_s, "reward scoring (a Ray task)",
                    f"scoring {len(rollouts.texts)} responses")

    def close(self) -> None:
        """The tasks' processes belong to Ray; they end with it."""
