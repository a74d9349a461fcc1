"""From prompts to a :class:`TrainBatch`: rollout, rewards, filters, log-probs, advantages.

The order follows ALGORITHMS.md: rewards (plus soft overlong shaping) -> group filters
(dynamic sampling with refill, or zero-variance filtering) -> learner log-probs (old,
reference) -> KL in reward -> advantages (GFPO on the kept responses) -> loss-mask filters
(overlong filtering, high-entropy mask). Every stage reports its metrics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from grpoplus import algo as A
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.learner.update import TrainBatch
from grpoplus.rollout.base import Rollouts, SamplingParams, concat_rollouts, select_rows
from grpoplus.tasks.base import is_correct, reward_fields


@dataclass
class ScoredRollouts:
    rollouts: Rollouts
    rewards: torch.Tensor  # [N] float32 total reward (after shaping)
    correct: torch.Tensor  # [N] bool, task verifier says right
    components: dict[str, list]  # name -> [N] per-component rewards


class PromptSampler:
    """Deterministic epoch-wise shuffled order over the training prompts; its state is two ints."""

    def __init__(self, size: int, seed: int):
        if size == 0:
            raise ValueError("the training split holds no prompts")
        self.size, self.seed, self.epoch, self.pos = size, seed, 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.size, generator=gen).tolist()

    def next(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos == self.size:
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._permutation()
            out.append(self._order[self.pos])
            self.pos += 1
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._permutation()


def score(rollouts: Rollouts, examples: list, rewards_fn, algo: A.AlgoConfig,
          correct_key: str) -> tuple[ScoredRollouts, dict[str, float]]:
    """Reward every response; add DAPO soft overlong punishment when switched on.

    Returns the scored rollouts and the reward pipeline's metrics."""
    per_row = [examples[rollouts.prompt_index[g]] for g in rollouts.group_ids.tolist()]
    fields = reward_fields(per_row)
    fields.update(completion_length=rollouts.lengths.tolist(), finished=rollouts.finished.tolist())
    result = rewards_fn([ex.prompt for ex in per_row], rollouts.texts, fields)
    rewards = torch.tensor(result.total, dtype=torch.float32)
    if algo.overlong_shaping:
        rewards = rewards + A.soft_overlong_penalty(rollouts.lengths, algo.max_len, algo.overlong_cache)
    correct = torch.tensor([is_correct(c) for c in result.components[correct_key]], dtype=torch.bool)
    return ScoredRollouts(rollouts, rewards, correct, result.components), result.metrics


def select_scored(s: ScoredRollouts, rows: torch.Tensor) -> ScoredRollouts:
    return ScoredRollouts(select_rows(s.rollouts, rows), s.rewards[rows], s.correct[rows],
                          {k: [v[i] for i in rows.tolist()] for k, v in s.components.items()})


def collect(engine, sampler: PromptSampler, examples: list, rewards_fn, algo: A.AlgoConfig,
            params: SamplingParams, prompts_per_step: int, generator: torch.Generator, pad_id: int,
            correct_key: str) -> tuple[ScoredRollouts, list[ScoredRollouts], dict]:
    """Sample and score groups; with dynamic sampling drop all-equal groups and refill until
    ``prompts_per_step`` groups are kept or ``max_sampling_rounds`` rounds are spent.

    Returns (batch to train on, every scored round for metrics, stage metrics)."""
    filtering = algo.dynamic_sampling or algo.zero_variance_filter
    max_rounds = algo.max_sampling_rounds if algo.dynamic_sampling else 1
    kept, drawn, rounds, times, reward_metrics = [], [], 0, {"rollout": 0.0, "reward": 0.0}, []
    n_kept = 0
    while rounds < max_rounds and (rounds == 0 or n_kept < prompts_per_step):
        rounds += 1
        idx = sampler.next(prompts_per_step)
        t0 = time.perf_counter()
        rollouts = engine.generate([examples[i].prompt for i in idx], params, prompt_index=idx, generator=generator)
        t1 = time.perf_counter()
        scored, round_metrics = score(rollouts, examples, rewards_fn, algo, correct_key)
        reward_metrics.append(round_metrics)
        times["rollout"] += t1 - t0
        times["reward"] += time.perf_counter() - t1
        drawn.append(scored)
        if filtering:
            keep_rows = torch.nonzero(~A.zero_variance_groups(scored.rewards, rollouts.group_ids)).squeeze(1)
            scored = select_scored(scored, keep_rows) if len(keep_rows) else None
        if scored is not None:
            kept.append(scored)
            n_kept += len(scored.rollouts.prompt_index)
    batch = _merge(kept, pad_id, prompts_per_step)
    groups_drawn = rounds * prompts_per_step
    metrics = combine_rounds(reward_metrics)
    metrics.update({"sampling/rounds": float(rounds), "sampling/groups_drawn": float(groups_drawn),
                    "sampling/groups_kept": float(len(batch.rollouts.prompt_index) if batch else 0),
                    "sampling/kept_frac": (len(batch.rollouts.prompt_index) if batch else 0) / groups_drawn,
                    "time/rollout_s": times["rollout"], "time/reward_s": times["reward"]})
    return batch, drawn, metrics


COUNT_SUFFIXES = ("errors", "timeouts", "nonfinite")


def combine_rounds(per_round: list[dict[str, float]]) -> dict[str, float]:
    """One step's reward-pipeline metrics from its sampling rounds: counts add up, the rest average."""
    out = {}
    for key in per_round[0]:
        values = [m[key] for m in per_round if key in m]
        out[key] = sum(values) if key.endswith(COUNT_SUFFIXES) else sum(values) / len(values)
    return out


def _merge(parts: list[ScoredRollouts], pad_id: int, max_groups: int) -> ScoredRollouts | None:
    if not parts:
        return None
    merged = ScoredRollouts(concat_rollouts([p.rollouts for p in parts], pad_id),
                            torch.cat([p.rewards for p in parts]), torch.cat([p.correct for p in parts]),
                            {k: [v for p in parts for v in p.components[k]] for k in parts[0].components})
    if len(merged.rollouts.prompt_index) > max_groups:  # DAPO keeps exactly B groups
        merged = select_scored(merged, torch.nonzero(merged.rollouts.group_ids < max_groups).squeeze(1))
    return merged


@torch.no_grad()
def learner_logprobs(model, rollouts: Rollouts, temperature: float, micro_batch_size: int, with_entropy: bool):
    """No-grad log-probs (and entropy) of the rollouts under ``model``, returned on the CPU."""
    device = next(model.parameters()).device
    logp, entropy = response_logprobs(model, rollouts.prompt_ids.to(device), rollouts.prompt_mask.to(device),
                                      rollouts.response_ids.to(device), rollouts.response_mask.to(device),
                                      temperature=temperature, with_entropy=with_entropy,
                                      micro_batch_size=micro_batch_size)
    return logp.cpu(), None if entropy is None else entropy.cpu()


def logp_old_from_update(algo: A.AlgoConfig, source: str, uses_reference: bool) -> bool:
    """True when pi_old's log-probs can be the training forward's own (detached): one update per
    batch (so the weights are still pi_old) and nothing needs them before the update."""
    needed_before = bool(algo.corrections) or algo.entropy_mask_rho < 1.0 or (
        uses_reference and algo.kl_placement == "in_reward")
    return source == "auto" and algo.num_iterations * algo.num_minibatches == 1 and not needed_before


def build_train_batch(scored: ScoredRollouts, model, ref_model, algo: A.AlgoConfig, *, temperature: float,
                      micro_batch_size: int, logp_old_source: str) -> tuple[TrainBatch, dict, torch.Tensor | None]:
    """Learner-side preparation: logp_old / entropy / logp_ref, advantages and loss-mask filters.

    Returns (batch, metrics, entropy [N, T] or None when the update will measure it)."""
    r = scored.rollouts
    mask = r.response_mask.float()
    logp_old = entropy = None
    if logp_old_source == "rollout":
        logp_old = r.logp_roll.clone()
    elif not logp_old_from_update(algo, logp_old_source, ref_model is not None):
        logp_old, entropy = learner_logprobs(model, r, temperature, micro_batch_size, with_entropy=True)
    logp_ref = None
    if ref_model is not None:
        logp_ref, _ = learner_logprobs(ref_model, r, temperature, micro_batch_size, with_entropy=False)
    rewards = scored.rewards
    metrics: dict[str, float] = {}
    if logp_ref is not None and algo.kl_placement == "in_reward":  # logp_old was recomputed (see above)
        rewards = A.kl_in_reward(rewards, logp_old, logp_ref, mask, algo.beta)
    advantages, loss_mask = _advantages(rewards, r, algo, mask)
    if algo.overlong_filter:
        loss_mask = A.overlong_filter_mask(loss_mask, r.finished)
        metrics["filter/overlong_frac"] = float((~r.finished).float().mean())
    if algo.entropy_mask_rho < 1.0:
        loss_mask = A.high_entropy_mask(entropy, loss_mask, algo.entropy_mask_rho)
    metrics["filter/active_token_frac"] = float(loss_mask.sum() / mask.sum().clamp(min=1))
    batch = TrainBatch(r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask, loss_mask, advantages,
                       r.logp_roll, logp_old, logp_ref, r.group_ids)
    return batch, metrics, entropy


def _advantages(rewards: torch.Tensor, r: Rollouts, algo: A.AlgoConfig, mask: torch.Tensor):
    if algo.gfpo_keep:
        keep = A.gfpo_select(rewards, r.lengths, r.group_ids, algo.gfpo_keep, algo.gfpo_metric)
        advantages = torch.zeros_like(rewards)
        advantages[keep] = A.compute_advantages(rewards[keep], r.group_ids[keep], estimator=algo.adv_estimator,
                                                eps=algo.adv_eps)
        return advantages, mask * keep.unsqueeze(1).float()
    return A.compute_advantages(rewards, r.group_ids, estimator=algo.adv_estimator, eps=algo.adv_eps), mask
