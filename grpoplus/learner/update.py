"""The learner's update: mini-batches, micro-batches with exact normalisation, and safe steps.

One rollout batch gives ``algo.updates_per_batch`` optimizer steps (ALGORITHMS.md
section 7). Each optimizer step accumulates gradients over micro-batches; the loss
denominators are those of the whole mini-batch (section 3), so the accumulated gradient
equals the un-split one. A step whose loss or gradient is not finite is skipped and
counted: the weights and the optimizer state are left untouched. For an MoE policy every
training forward replays the batch's routing (R2, R3) or routes naturally and is measured
against the sampler's (off): ``moe/*`` metrics, :mod:`grpoplus.learner.replay`.
"""

from __future__ import annotations

import math

import torch

from grpoplus.algo import AlgoConfig, policy_loss, prepare_loss
from grpoplus.containers import TrainBatch, UpdateResult
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.learner.microbatch import plan_micro_batches
from grpoplus.learner.prepare import LearnerPlan
from grpoplus.learner.replay import LearnerRouting, RoutingTally, input_mask
from grpoplus.metrics.step import finite, reduce_metrics

LOSS_KEYS = ("loss/policy", "loss/total")  # micro-batch parts of one globally normalised loss: they add up


def minibatch_rows(group_ids: torch.Tensor, num_minibatches: int) -> list[torch.Tensor]:
    """Split rows into ``num_minibatches`` parts along group boundaries (groups stay whole)."""
    groups = torch.unique(group_ids)
    return [torch.nonzero(torch.isin(group_ids, part)).squeeze(1)
            for part in torch.tensor_split(groups, num_minibatches) if len(part)]


def micro_batches(batch: TrainBatch, plan: LearnerPlan) -> list[torch.Tensor]:
    """Row indices of each forward/backward: by token budget (rows of similar length together,
    little padding computed) or ``micro_batch_size`` rows in order."""
    if plan.micro_batch_tokens:
        lengths = torch.stack([batch.prompt_mask.sum(1), batch.response_mask.sum(1)], 1).long().cpu()
        return plan_micro_batches(lengths, plan.micro_batch_tokens)
    return list(torch.arange(len(batch.group_ids)).split(plan.micro_batch_size))


def optimizer_step(model, optimizer, batch: TrainBatch, algo: AlgoConfig, plan: LearnerPlan
                   ) -> tuple[dict[str, float], bool, torch.Tensor | None]:
    """Accumulate the mini-batch's gradient over micro-batches and step.

    Returns (metrics, stepped, entropy [N, T] when pi_old comes from this forward, else None)."""
    fused = plan.logp_old_from_forward
    if fused != (batch.logp_old is None):
        raise ValueError(f"learner plan takes logp_old from {plan.logp_old!r} but the batch "
                         f"{'lacks' if batch.logp_old is None else 'carries'} logp_old")
    loss_mask, norm = prepare_loss(batch.loss_mask, batch.logp_old, batch.logp_roll, batch.advantages, algo)
    parts, losses = [], dict.fromkeys(LOSS_KEYS, 0.0)
    entropy = torch.zeros(batch.response_mask.shape, device=batch.response_mask.device) if fused else None
    tally = None if plan.routing_spec is None else RoutingTally(plan.routing_spec)
    optimizer.zero_grad(set_to_none=True)
    for idx in micro_batches(batch, plan):
        mb = batch.rows(idx)
        logp, mb_entropy = response_logprobs(model, mb.prompt_ids, mb.prompt_mask, mb.response_ids,
                                             mb.response_mask, temperature=plan.temperature, with_entropy=fused,
                                             routing=training_routing(model, mb, plan, tally))
        logp_old = logp.detach() if fused else mb.logp_old  # same weights: exactly pi_old
        if fused:
            entropy[idx.to(entropy.device)] = mb_entropy.to(entropy.dtype)
        loss, metrics = policy_loss(logp, logp_old, mb.advantages, loss_mask[idx], algo,
                                    logp_roll=mb.logp_roll, logp_ref=mb.logp_ref, norm=norm)
        loss.backward()
        for key in LOSS_KEYS:
            losses[key] += metrics.pop(key, 0.0)
        parts.append((metrics, max(metrics.get("loss/active_tokens", 0.0), 1e-9)))
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, plan.max_grad_norm, error_if_nonfinite=False).item()
    stepped = math.isfinite(losses["loss/total"]) and math.isfinite(grad_norm)
    if stepped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    out = reduce_metrics(parts)
    out.update(losses)
    out.update(tally.metrics() if tally is not None else {})
    out["optim/grad_norm"] = grad_norm
    return out, stepped, entropy


def training_routing(model, batch: TrainBatch, plan: LearnerPlan, tally: RoutingTally | None
                     ) -> LearnerRouting | None:
    """MoE routing of a training forward (ALGORITHMS.md section 8): R2 and R3 replay the batch's routing
    (the learner's recorded one, the sampler's); off routes naturally and is measured against the
    sampler's. None for a dense policy."""
    if plan.routing_spec is None:
        return None
    return LearnerRouting(model, batch.routing, input_mask(batch.prompt_mask, batch.response_mask),
                          replay=plan.routing_replay != "off", tally=tally)


def update_policy(model, optimizer, scheduler, batch: TrainBatch, algo: AlgoConfig, plan: LearnerPlan
                  ) -> UpdateResult:
    """All optimizer steps for one rollout batch; the entropy comes back when the training forward
    measured it (pi_old from the forward: one update, so each row is seen once)."""
    batch = batch.to(next(model.parameters()).device)
    model.train()
    parts, skipped, entropy = [], 0, None
    for _ in range(algo.num_iterations):
        for rows in minibatch_rows(batch.group_ids, algo.num_minibatches):
            metrics, stepped, entropy = optimizer_step(model, optimizer, batch.rows(rows), algo, plan)
            if not parts and "moe/routing_mismatch" in metrics:  # the first step: the weights are still pi_old
                metrics["moe/routing_mismatch_first"] = metrics["moe/routing_mismatch"]
            skipped += not stepped
            scheduler.step()
            parts.append((finite(metrics), 1.0))
    model.eval()
    out = reduce_metrics(parts)
    out["optim/skipped_updates"] = float(skipped)
    out["optim/lr"] = optimizer.param_groups[0]["lr"]
    return UpdateResult(out, None if entropy is None else entropy.cpu())
