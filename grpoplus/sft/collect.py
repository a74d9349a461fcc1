"""A supervised stage's batches, in the form the learner takes rollouts: each demonstration a group of one, its
prompt left-padded, its response right-padded, its observation tokens masked out of the loss (``model_mask``), as a
multi-turn rollout's environment tokens are. The learner's supervised objective (``UpdatePlan.objective = sft``)
trains on the ``model_mask`` tokens alone."""

from __future__ import annotations

import time

import torch

from grpoplus.containers import Collected, Rollouts, ScoredGroups
from grpoplus.data.order import PromptSampler
from grpoplus.sft.demos import Demo


def demo_rollouts(demos: list[Demo], pad_id: int, prompt_index: list[int] | None = None) -> Rollouts:
    """The demonstrations as one batch of rollouts (one group each; ``logp_roll`` zero: nothing was sampled)."""
    n = len(demos)
    width_p = max(len(d.prompt) for d in demos)
    width_t = max(1, max(len(d.response) for d in demos))
    prompt_ids = torch.full((n, width_p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, width_p), dtype=torch.long)
    response_ids = torch.full((n, width_t), pad_id, dtype=torch.long)
    response_mask = torch.zeros((n, width_t))
    model_mask = torch.zeros((n, width_t))
    for i, d in enumerate(demos):
        p, t = len(d.prompt), len(d.response)
        prompt_ids[i, width_p - p:] = torch.tensor(d.prompt, dtype=torch.long)
        prompt_mask[i, width_p - p:] = 1
        if t:
            response_ids[i, :t] = torch.tensor(d.response, dtype=torch.long)
            response_mask[i, :t] = 1.0
            model_mask[i, :t] = torch.tensor(d.trained, dtype=torch.float32)
    return Rollouts(prompt_ids, prompt_mask, response_ids, response_mask, torch.zeros((n, width_t)),
                    finished=torch.ones(n, dtype=torch.bool), group_ids=torch.arange(n), texts=[""] * n,
                    prompt_index=list(range(n)) if prompt_index is None else prompt_index, model_mask=model_mask,
                    vision=[d.vision for d in demos] if any(d.vision is not None for d in demos) else None)


def demo_batch(demos: list[Demo], pad_id: int, prompt_index: list[int] | None = None) -> ScoredGroups:
    """The demonstrations as scored groups (reward 1, verdict correct: a demonstration is what to imitate)."""
    n = len(demos)
    return ScoredGroups(demo_rollouts(demos, pad_id, prompt_index), torch.ones(n), torch.ones(n, dtype=torch.bool), {})


class DemoCollector:
    """Each step's ``per_step`` demonstrations, in an epoch-wise shuffled order (its position is checkpointed, so a
    resumed stage draws what the uninterrupted one would have)."""

    def __init__(self, demos: list[Demo], per_step: int, pad_id: int, seed: int, constants: dict | None = None):
        self.demos, self.per_step, self.pad_id = demos, per_step, pad_id
        self.sampler = PromptSampler(len(demos), seed)
        self.constants = dict(constants or {})  # facts of the demonstrations logged at every step

    def next(self, step: int) -> Collected:
        started = time.perf_counter()
        picked = self.sampler.next(self.per_step)
        batch = demo_batch([self.demos[i] for i in picked], self.pad_id, picked)
        r = batch.rollouts
        trained = r.sampled_mask.sum(1)
        metrics = {"sft/demos": float(len(picked)), "sft/trained_tokens": float(trained.sum()),
                   "sft/tokens": float(r.prompt_mask.sum() + r.response_mask.sum()),
                   "sft/epoch": self.sampler.epoch + self.sampler.pos / len(self.demos),
                   "length/mean": float(trained.mean()), "time/rollout_s": time.perf_counter() - started,
                   **self.constants}
        return Collected(batch, [batch], metrics, sampled=False)

    def position(self) -> dict:
        return {"sampler": self.sampler.state()}

    def load(self, state: dict) -> None:
        self.sampler.load(state["sampler"])

    def close(self) -> None:
        """Nothing runs in the background."""


def held_out_loss(model, demos: list[Demo], pad_id: int, plan, batch: int = 64) -> float:
    """The mean negative log-likelihood per demonstrated token of ``demos`` under ``model`` (no gradient), in batches
    of ``batch`` demonstrations; ``plan``: the learner's (micro-batches, precision; its temperature is 1 here)."""
    from grpoplus.learner.prepare import learner_logprobs

    total = count = 0.0
    for start in range(0, len(demos), batch):
        r = demo_rollouts(demos[start:start + batch], pad_id)
        logp, _ = learner_logprobs(model, r, plan, with_entropy=False)
        mask = r.sampled_mask
        total += float(-(logp * mask).sum())
        count += float(mask.sum())
    return total / max(count, 1.0)
