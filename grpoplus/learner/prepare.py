"""Learner preparation: scored groups -> :class:`TrainBatch`.

In the order of ALGORITHMS.md: the learner's forwards that must precede the update
(``logp_old`` and entropy when something needs them first, ``logp_ref`` when ``beta > 0``),
KL in the reward, advantages (over GFPO's kept responses), then the loss-mask filters
(overlong filtering, the high-entropy mask). Where ``pi_old`` comes from is decided once,
by :func:`logp_old_mode`, and carried in the :class:`LearnerPlan`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpoplus import algo as A
from grpoplus.containers import Rollouts, ScoredGroups, TrainBatch
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.models.lora import adapters_off

LOGP_OLD_MODES = ("forward", "recompute", "rollout")


@dataclass(frozen=True)
class LearnerPlan:
    """How the learner prepares and updates, decided once from the config."""

    temperature: float  # the sampling temperature: logp is taken under softmax(logits / temperature)
    micro_batch_size: int  # responses per forward/backward
    max_grad_norm: float
    logp_old: str  # one of LOGP_OLD_MODES
    micro_batch_tokens: int = 0  # > 0: micro-batches by (rows x padded width) token budget instead of row count
    reference_adapters_off: bool = False  # logp_ref from the policy with its LoRA adapters off (no reference copy)

    @property
    def logp_old_from_forward(self) -> bool:
        return self.logp_old == "forward"


def logp_old_mode(algo: A.AlgoConfig, source: str, uses_reference: bool) -> str:
    """Where pi_old's log-probs come from.

    ``source`` is the config's choice: ``rollout`` (the sampler's logp_roll), ``recompute`` (a
    separate no-grad learner pass) or ``auto``: the training forward's own detached log-probs
    (``forward``) when they are exactly pi_old - one update per batch, so the weights are still
    pi_old - and nothing needs them before the update (a correction, the entropy mask, a loss's
    token selection, KL in the reward); otherwise ``recompute``.
    """
    if source in ("rollout", "recompute"):
        return source
    needed_before = bool(algo.corrections) or algo.entropy_mask_rho < 1.0 or A.needs_token_selection(algo) or (
        uses_reference and algo.kl_placement == "in_reward")
    return "forward" if algo.updates_per_batch == 1 and not needed_before else "recompute"


@torch.no_grad()
def learner_logprobs(model, rollouts: Rollouts, plan: LearnerPlan, with_entropy: bool):
    """No-grad log-probs [N, T] (and entropy) of the rollouts under ``model``, returned on the CPU."""
    device = next(model.parameters()).device
    logp, entropy = response_logprobs(model, rollouts.prompt_ids.to(device), rollouts.prompt_mask.to(device),
                                      rollouts.response_ids.to(device), rollouts.response_mask.to(device),
                                      temperature=plan.temperature, with_entropy=with_entropy,
                                      micro_batch_size=plan.micro_batch_size)
    return logp.cpu(), None if entropy is None else entropy.cpu()


def prepare(scored: ScoredGroups, model, ref_model, algo: A.AlgoConfig, plan: LearnerPlan
            ) -> tuple[TrainBatch, torch.Tensor | None, dict[str, float]]:
    """Returns (batch, entropy [N, T] when measured here - None when the update measures it, metrics)."""
    r = scored.rollouts
    mask = r.response_mask.float()
    logp_old = entropy = logp_ref = None
    if plan.logp_old == "recompute" or algo.entropy_mask_rho < 1.0:  # the entropy mask needs entropy first
        logp_old, entropy = learner_logprobs(model, r, plan, with_entropy=True)
    if plan.logp_old == "rollout":
        logp_old = r.logp_roll.clone()
    if ref_model is not None:
        logp_ref, _ = learner_logprobs(ref_model, r, plan, with_entropy=False)
    elif plan.reference_adapters_off:
        with adapters_off(model):
            logp_ref, _ = learner_logprobs(model, r, plan, with_entropy=False)
    rewards, metrics = scored.rewards, {}
    if logp_ref is not None and algo.kl_placement == "in_reward":  # logp_old is recomputed (logp_old_mode)
        rewards = A.kl_in_reward(rewards, logp_old, logp_ref, mask, algo.beta)
        metrics["reward/kl_penalty_mean"] = float((scored.rewards - rewards).mean())
    keep = A.gfpo_select(rewards, r.lengths, r.group_ids, algo.gfpo_keep, algo.gfpo_metric) if algo.gfpo_keep else None
    advantages = A.compute_advantages(rewards, r.group_ids, estimator=algo.adv_estimator, eps=algo.adv_eps, keep=keep)
    loss_mask = mask if keep is None else mask * keep.unsqueeze(1).float()
    if algo.overlong_filter:
        loss_mask = A.overlong_filter_mask(loss_mask, r.finished)
        metrics["filter/overlong_frac"] = float((~r.finished).float().mean())
    if algo.entropy_mask_rho < 1.0:
        loss_mask = A.high_entropy_mask(entropy, loss_mask, algo.entropy_mask_rho)
    metrics["filter/active_token_frac"] = float(loss_mask.sum() / mask.sum().clamp(min=1))
    batch = TrainBatch(r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask, loss_mask, advantages,
                       r.logp_roll, logp_old, logp_ref, r.group_ids, routing=r.routing)
    return batch, entropy, metrics
