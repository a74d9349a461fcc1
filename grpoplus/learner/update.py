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

from grpoplus.algo import AGGREGATIONS, AlgoConfig, EntropyControl, policy_loss, prepare_loss
from grpoplus.containers import TrainBatch, UpdateResult
from grpoplus.learner.checkpointing import checkpointed_layers
from grpoplus.learner.distill import distill_forward
from grpoplus.learner.entropy import response_logprobs_and_entropy
from grpoplus.learner.hooks import ONE_PROCESS, UpdateHooks
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.learner.microbatch import plan_micro_batches
from grpoplus.learner.precision import autocast
from grpoplus.learner.prepare import LearnerPlan, forward_sharing
from grpoplus.learner.replay import LearnerRouting, RoutingTally, input_mask
from grpoplus.learner.trimming import trimmed_backward
from grpoplus.metrics.step import finite, reduce_metrics
from grpoplus.models.device import compute_device

LOSS_KEYS = ("loss/policy", "loss/distill", "loss/total")  # micro-batch parts of one globally normalised loss: add up


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


def optimizer_step(model, optimizer, batch: TrainBatch, algo: AlgoConfig, plan: LearnerPlan, *,
                   entropy_coef: float | None = None, generator: torch.Generator | None = None,
                   hooks: UpdateHooks = ONE_PROCESS, teacher: torch.nn.Module | None = None
                   ) -> tuple[dict[str, float], bool, torch.Tensor | None]:
    """Accumulate the mini-batch's gradient over micro-batches and step.

    ``entropy_coef``: the entropy bonus's coefficient for this step (``EntropyControl.applied_coef``;
    the forward then also takes the entropy with its gradient when ``algo.entropy_bonus``).
    ``generator``: Clip-Cov's random token subset, seeded per optimizer step by the caller.
    ``hooks``: the placement's (grpoplus.distributed.placement): with several learner ranks every rank
    holds the whole mini-batch and its global mask and norm, takes its share of whole micro-batches, and
    the gradients are summed over the ranks before clipping: the step one process would make.
    ``teacher``: the teacher model of ``algo.distill_loss`` (its divergence is added to the loss).
    Returns (metrics, stepped, entropy [N, T] when pi_old comes from this forward, else None)."""
    fused = plan.logp_old_from_forward
    if fused != (batch.logp_old is None):
        raise ValueError(f"learner plan takes logp_old from {plan.logp_old!r} but the batch "
                         f"{'lacks' if batch.logp_old is None else 'carries'} logp_old")
    loss_mask, norm = prepare_loss(batch.loss_mask, batch.logp_old, batch.logp_roll, batch.advantages, algo,
                                   generator=generator)
    tally = None if plan.routing_spec is None else RoutingTally(plan.routing_spec)
    optimizer.zero_grad(set_to_none=True)
    mine, standins = hooks.share(micro_batches(batch, plan))
    runs = [(idx, 1.0) for idx in mine] + [(idx, 0.0) for idx in standins]
    parts = []
    for i, (idx, scale) in enumerate(runs):
        with hooks.backward_scope(last=i == len(runs) - 1):
            part = _micro_step(model, batch.rows(idx), idx, loss_mask[idx], norm.rows(idx), algo, plan, fused,
                               entropy_coef, tally, hooks, scale, teacher)
        if scale:
            parts.append(part)
    parts, tally = hooks.gather(parts, tally)
    params = [p for p in model.parameters() if p.requires_grad]
    losses = {key: sum((part[2][key] for part in parts), 0.0) for key in LOSS_KEYS}
    if algo.distill_loss == "off":
        del losses["loss/distill"]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, plan.max_grad_norm, error_if_nonfinite=False).item()
    stepped = math.isfinite(losses["loss/total"]) and math.isfinite(grad_norm)
    if stepped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    out = reduce_metrics((metrics, weight) for metrics, weight, *_ in parts)
    out.update(losses)
    out.update(tally.metrics() if tally is not None else {})
    out["optim/grad_norm"] = grad_norm
    return out, stepped, _entropy(parts, batch.response_mask) if fused else None


def _micro_step(model, mb: TrainBatch, idx: torch.Tensor, loss_mask: torch.Tensor, norm, algo: AlgoConfig,
                plan: LearnerPlan, fused: bool, entropy_coef: float | None, tally: RoutingTally | None,
                hooks: UpdateHooks, scale: float = 1.0, teacher: torch.nn.Module | None = None) -> tuple:
    """Forward and backward of the micro-batch of rows ``idx`` (its loss times ``scale``: 0 for a rank's
    stand-in). Returns (metrics, weight, its part of the loss, idx, entropy [n, T] when pi_old
    comes from this forward, else None)."""
    if algo.distill_loss != "off":
        logp, entropy, divergence = _distill_forward(model, teacher, mb, plan, hooks, algo, fused)
    else:
        logp, entropy = _forward(model, mb, plan, hooks, with_entropy=fused, entropy_grad=algo.entropy_bonus,
                                 routing=training_routing(model, mb, plan, tally if scale else None))
    logp_old = logp.detach() if fused else mb.logp_old  # same weights: exactly pi_old
    loss, metrics = policy_loss(logp, logp_old, mb.advantages, loss_mask, algo,
                                logp_roll=mb.logp_roll, logp_ref=mb.logp_ref, norm=norm,
                                entropy=entropy if algo.entropy_bonus else None, entropy_coef=entropy_coef)
    if algo.distill_loss != "off":  # section 11: the divergence aggregated like the policy term
        m = loss_mask.to(divergence.dtype)
        distill = algo.distill_coef * AGGREGATIONS.get(algo.aggregation)(divergence * m, m, norm)
        loss = loss + distill
        metrics["loss/distill"] = float(distill.detach())
        metrics["loss/total"] += metrics["loss/distill"]
    (loss * scale if scale != 1.0 else loss).backward()
    losses = {key: metrics.pop(key, 0.0) for key in LOSS_KEYS}
    weight = max(metrics.get("loss/active_tokens", 0.0), 1e-9)
    return metrics, weight, losses, idx, entropy.detach() if fused else None


def _entropy(parts: list, response_mask: torch.Tensor) -> torch.Tensor:
    """[N, T] entropy of the mini-batch, put together from its micro-batches' rows."""
    entropy = torch.zeros(response_mask.shape, device=response_mask.device)
    for *_, idx, part in parts:
        entropy[idx.to(entropy.device)] = part.to(entropy.device, entropy.dtype)
    return entropy


def _forward(model, mb: TrainBatch, plan: LearnerPlan, hooks: UpdateHooks, with_entropy: bool, entropy_grad: bool,
             routing):
    """(logp with grad, entropy): the entropy with its gradient for the bonus, without it for
    metrics only (``with_entropy``), else None."""
    share = forward_sharing(plan)
    with checkpointed_layers(model, plan.gradient_checkpointing), trimmed_backward(model, plan.trim_every), \
            autocast(plan.precision, mb.prompt_ids.device):
        if entropy_grad:
            return hooks.forward(response_logprobs_and_entropy, model, mb.prompt_ids, mb.prompt_mask,
                                 mb.response_ids, mb.response_mask, temperature=plan.temperature, routing=routing)
        return hooks.forward(response_logprobs, model, mb.prompt_ids, mb.prompt_mask, mb.response_ids,
                             mb.response_mask, temperature=plan.temperature, with_entropy=with_entropy,
                             routing=routing, share_prompts=share)


def _distill_forward(model, teacher, mb: TrainBatch, plan: LearnerPlan, hooks: UpdateHooks, algo: AlgoConfig,
                     fused: bool):
    """(logp, entropy or None, divergence [n, T]) of a run with ``algo.distill_loss``: one forward of the policy and
    one of the teacher (grpoplus.learner.distill)."""
    if teacher is None:
        raise ValueError(f"algo.distill_loss={algo.distill_loss} needs the teacher model in the update (learner.teacher)")
    with checkpointed_layers(model, plan.gradient_checkpointing), autocast(plan.precision, mb.prompt_ids.device):
        return hooks.forward(distill_forward, model, teacher, mb.prompt_ids, mb.prompt_mask, mb.response_ids,
                             mb.response_mask, temperature=plan.temperature, loss=algo.distill_loss,
                             beta=algo.gjsd_beta, with_entropy=fused or algo.entropy_bonus)


def clip_cov_generator(seed: int, optimizer_step: int) -> torch.Generator:
    """The generator of one optimizer step's random token selection (Clip-Cov): seeded by the run
    seed and the step's index, so a resumed run draws what the uninterrupted one drew."""
    return torch.Generator().manual_seed(seed * 1_000_003 + optimizer_step)


def training_routing(model, batch: TrainBatch, plan: LearnerPlan, tally: RoutingTally | None
                     ) -> LearnerRouting | None:
    """MoE routing of a training forward (ALGORITHMS.md section 8): R2 and R3 replay the batch's routing
    (the learner's recorded one, the sampler's); off routes naturally and is measured against the
    sampler's. None for a dense policy."""
    if plan.routing_spec is None:
        return None
    return LearnerRouting(model, batch.routing, input_mask(batch.prompt_mask, batch.response_mask),
                          replay=plan.routing_replay != "off", tally=tally)


def update_policy(model, optimizer, scheduler, batch: TrainBatch, algo: AlgoConfig, plan: LearnerPlan,
                  entropy_control: EntropyControl | None = None, first_step: int = 0,
                  hooks: UpdateHooks = ONE_PROCESS, teacher: torch.nn.Module | None = None) -> UpdateResult:
    """All optimizer steps for one rollout batch; the entropy comes back when the training forward
    measured it (pi_old from the forward: one update, so each row is seen once).

    ``entropy_control`` gives each step's bonus coefficient and is updated after each step with
    the entropy the step measured (``algo.entropy_bonus``); ``first_step`` is the run-wide index
    of this batch's first optimizer step (seeds Clip-Cov's selection). ``hooks``: the placement's (every
    learner rank calls this with the same batch)."""
    batch = batch.to(compute_device(model))
    control = entropy_control if entropy_control is not None else EntropyControl.from_config(algo)
    model.train()
    parts, skipped, entropy, k = [], 0, None, first_step
    for _ in range(algo.num_iterations):
        for rows in minibatch_rows(batch.group_ids, algo.num_minibatches):
            metrics, stepped, entropy = optimizer_step(model, optimizer, batch.rows(rows), algo, plan,
                                                       entropy_coef=control.applied_coef,
                                                       generator=clip_cov_generator(plan.seed, k), hooks=hooks,
                                                       teacher=teacher)
            if not parts and "moe/routing_mismatch" in metrics:  # the first step: the weights are still pi_old
                metrics["moe/routing_mismatch_first"] = metrics["moe/routing_mismatch"]
            skipped += not stepped
            k += 1
            scheduler.step()
            if algo.entropy_bonus and stepped and math.isfinite(metrics.get("loss/entropy", math.nan)):
                control.update(metrics["loss/entropy"])
            parts.append((finite(metrics), 1.0))
    model.eval()
    out = reduce_metrics(parts)
    out["optim/skipped_updates"] = float(skipped)
    out["optim/lr"] = optimizer.param_groups[0]["lr"]
    if algo.entropy_bonus:
        out.update(control.metrics())
    return UpdateResult(out, None if entropy is None else entropy.cpu())
