"""The learner's update: mini-batches, micro-batches with exact normalisation, and safe steps.

One rollout batch gives ``algo.updates_per_batch`` optimizer steps (ALGORITHMS.md
section 7). Each optimizer step accumulates gradients over micro-batches; the loss
denominators are those of the whole mini-batch (section 3), so the accumulated gradient
equals the un-split one. A step whose loss or gradient is not finite is skipped and
counted: the weights and the optimizer state are left untouched.
"""

from __future__ import annotations

import math

import torch

from grpoplus.algo import AlgoConfig, policy_loss, prepare_loss
from grpoplus.containers import TrainBatch, UpdateResult
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.learner.prepare import LearnerPlan
from grpoplus.metrics.step import finite, reduce_metrics

LOSS_KEYS = ("loss/policy", "loss/total")  # micro-batch parts of one globally normalised loss: they add up


def minibatch_rows(group_ids: torch.Tensor, num_minibatches: int) -> list[torch.Tensor]:
    """Split rows into ``num_minibatches`` parts along group boundaries (groups stay whole)."""
    groups = torch.unique(group_ids)
    return [torch.nonzero(torch.isin(group_ids, part)).squeeze(1)
            for part in torch.tensor_split(groups, num_minibatches) if len(part)]


def optimizer_step(model, optimizer, batch: TrainBatch, algo: AlgoConfig, plan: LearnerPlan, group=None
                   ) -> tuple[dict[str, float], bool, torch.Tensor | None]:
    """Accumulate the mini-batch's gradient over micro-batches and step.

    With a data-parallel ``group`` (grpoplus.distributed.group.RankGroup) every rank holds the whole
    mini-batch and its global mask and norm, takes its share of whole micro-batches, and the
    gradients are summed over the ranks before clipping: the step one process would make.
    Returns (metrics, stepped, entropy [N, T] when pi_old comes from this forward, else None)."""
    fused = plan.logp_old_from_forward
    if fused != (batch.logp_old is None):
        raise ValueError(f"learner plan takes logp_old from {plan.logp_old!r} but the batch "
                         f"{'lacks' if batch.logp_old is None else 'carries'} logp_old")
    loss_mask, norm = prepare_loss(batch.loss_mask, batch.logp_old, batch.logp_roll, batch.advantages, algo)
    optimizer.zero_grad(set_to_none=True)
    micro = list(torch.arange(len(batch.group_ids)).split(plan.micro_batch_size))
    parts = [_micro_step(model, batch.rows(idx), loss_mask[idx], norm, algo, plan, fused)
             for idx in (micro if group is None else group.share(micro))]
    params = [p for p in model.parameters() if p.requires_grad]
    if group is not None:
        parts = group.gather(parts)  # every rank's micro-batches, in the order one process runs them
        group.all_reduce_gradients(params)
    losses = {key: sum((part[2][key] for part in parts), 0.0) for key in LOSS_KEYS}
    grad_norm = torch.nn.utils.clip_grad_norm_(params, plan.max_grad_norm, error_if_nonfinite=False).item()
    stepped = math.isfinite(losses["loss/total"]) and math.isfinite(grad_norm)
    if stepped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    out = reduce_metrics((metrics, weight) for metrics, weight, _, _ in parts)
    out.update(losses)
    out["optim/grad_norm"] = grad_norm
    return out, stepped, torch.cat([part[3] for part in parts]) if fused else None


def _micro_step(model, mb: TrainBatch, loss_mask: torch.Tensor, norm, algo: AlgoConfig, plan: LearnerPlan,
                fused: bool) -> tuple[dict[str, float], float, dict[str, float], torch.Tensor | None]:
    """Forward and backward of one micro-batch. Returns (metrics, weight, its part of the loss, entropy [n, T])."""
    logp, entropy = response_logprobs(model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask,
                                      temperature=plan.temperature, with_entropy=fused)
    logp_old = logp.detach() if fused else mb.logp_old  # same weights: exactly pi_old
    loss, metrics = policy_loss(logp, logp_old, mb.advantages, loss_mask, algo,
                                logp_roll=mb.logp_roll, logp_ref=mb.logp_ref, norm=norm)
    loss.backward()
    losses = {key: metrics.pop(key, 0.0) for key in LOSS_KEYS}
    return metrics, max(metrics.get("loss/active_tokens", 0.0), 1e-9), losses, entropy


def update_policy(model, optimizer, scheduler, batch: TrainBatch, algo: AlgoConfig, plan: LearnerPlan,
                  group=None) -> UpdateResult:
    """All optimizer steps for one rollout batch; the entropy comes back when the training forward
    measured it (pi_old from the forward: one update, so each row is seen once). ``group``: the
    data-parallel learner ranks (every rank calls this with the same batch), or None."""
    batch = batch.to(next(model.parameters()).device)
    model.train()
    parts, skipped, entropy = [], 0, None
    for _ in range(algo.num_iterations):
        for rows in minibatch_rows(batch.group_ids, algo.num_minibatches):
            metrics, stepped, entropy = optimizer_step(model, optimizer, batch.rows(rows), algo, plan, group)
            skipped += not stepped
            scheduler.step()
            parts.append((finite(metrics), 1.0))
    model.eval()
    out = reduce_metrics(parts)
    out["optim/skipped_updates"] = float(skipped)
    out["optim/lr"] = optimizer.param_groups[0]["lr"]
    return UpdateResult(out, None if entropy is None else entropy.cpu())
