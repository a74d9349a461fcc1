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
import warnings
from dataclasses import dataclass

import torch

from grpoplus.algo import AGGREGATIONS, AlgoConfig, EntropyControl, policy_loss, prepare_loss
from grpoplus.containers import TrainBatch, UpdateResult
from grpoplus.learner.activation_checkpointing import checkpointed_layers
from grpoplus.learner.compiling import compiled_graphs, compiled_layers
from grpoplus.learner.distill import distill_forward
from grpoplus.learner.entropy import response_logprobs_and_entropy
from grpoplus.learner.hooks import ONE_PROCESS, UpdateHooks
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.learner.microbatch import split_micro_batches
from grpoplus.learner.packing import packing_pays, padding_metrics
from grpoplus.learner.precision import autocast
from grpoplus.learner.prepare import LearnerPlan, estimated_sharing, forward_sharing
from grpoplus.learner.replay import LearnerRouting, RoutingTally, input_mask
from grpoplus.learner.trimming import trimmed_backward
from grpoplus.metrics.step import finite, reduce_metrics
from grpoplus.models.device import compute_device
from grpoplus.models.vision import vision_of

LOSS_KEYS = ("loss/policy", "loss/distill", "loss/nll", "loss/total")  # micro-batch parts of one globally normalised loss: add up


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
        return split_micro_batches(lengths, plan.micro_batch_tokens, packed=plan.packing is True)
    return list(torch.arange(len(batch.group_ids)).split(plan.micro_batch_size))


@dataclass
class StepContext:
    """What every micro-batch of one optimizer step shares: the model and how it is updated, the step's entropy
    coefficient, the routing tally of an MoE policy, the learner ranks' hooks and the teacher of ``algo.distill_loss``."""

    model: torch.nn.Module
    algo: AlgoConfig
    plan: LearnerPlan
    hooks: UpdateHooks = ONE_PROCESS
    entropy_coef: float | None = None
    tally: RoutingTally | None = None
    teacher: torch.nn.Module | None = None

    @property
    def fused(self) -> bool:
        """pi_old is this forward's own (detached) log-probs."""
        return self.plan.logp_old_from_forward

    @property
    def measures_entropy(self) -> bool:
        """The forward measures the entropy for the step's metrics (pi_old from it; a supervised stage needs none)."""
        return self.fused and self.plan.objective != "sft"


@dataclass
class MicroBatch:
    """One forward/backward's rows ``idx`` of the mini-batch, their loss mask and norm, ``scale`` (0 for a rank's
    stand-in, whose loss only keeps the collectives in step) and whether its forward packs."""

    rows: TrainBatch
    idx: torch.Tensor
    loss_mask: torch.Tensor
    norm: object
    scale: float = 1.0
    packed: bool = False  # its rows forwarded as one sequence of their real tokens (grpoplus.learner.packing)


@dataclass
class Forward:
    """What a training forward gives the loss terms."""

    logp: torch.Tensor
    entropy: torch.Tensor | None
    divergence: torch.Tensor | None = None  # [n, T] per-token divergence from the teacher (algo.distill_loss)


def optimizer_step(model, optimizer, batch: TrainBatch, algo: AlgoConfig, plan: LearnerPlan, *,
                   entropy_coef: float | None = None, generator: torch.Generator | None = None,
                   hooks: UpdateHooks = ONE_PROCESS, teacher: torch.nn.Module | None = None
                   ) -> tuple[dict[str, float], bool, "ForwardRows | None"]:
    """Accumulate the mini-batch's gradient over micro-batches and step.

    ``entropy_coef``: the entropy bonus's coefficient for this step (``EntropyControl.applied_coef``;
    the forward then also takes the entropy with its gradient when ``algo.entropy_bonus``).
    ``generator``: Clip-Cov's random token subset, seeded per optimizer step by the caller.
    ``hooks``: the learner ranks' (grpoplus.distributed.rank_hooks): with several learner ranks every rank
    holds the whole mini-batch and its global mask and norm, takes its share of whole micro-batches, and
    the gradients are summed over the ranks before clipping: the step one process would make.
    ``teacher``: the teacher model of ``algo.distill_loss`` (its divergence is a term of the loss).
    Returns (metrics, stepped, the forward's entropy and log-probs when pi_old comes from this forward, else None)."""
    ctx = StepContext(model, algo, plan, hooks, entropy_coef,
                      None if plan.routing_spec is None else RoutingTally(plan.routing_spec), teacher)
    if ctx.fused != (batch.logp_old is None):
        raise ValueError(f"learner plan takes logp_old from {plan.logp_old!r} but the batch "
                         f"{'lacks' if batch.logp_old is None else 'carries'} logp_old")
    loss_mask, norm = prepare_loss(batch.loss_mask, batch.logp_old, batch.logp_roll, batch.advantages, algo,
                                   generator=generator)
    optimizer.zero_grad(set_to_none=True)
    planned = micro_batches(batch, plan)
    packed = _packed(ctx, batch, planned)
    mine, standins = hooks.share(list(zip(planned, packed)))
    runs = [(*run, 1.0) for run in mine] + [(*run, 0.0) for run in standins]
    parts = []
    for i, (idx, pack, scale) in enumerate(runs):
        with hooks.backward_scope(last=i == len(runs) - 1):
            part = _micro_step(ctx, MicroBatch(batch.rows(idx), idx, loss_mask[idx], norm.rows(idx), scale, pack))
        if scale:
            parts.append(part)
    parts, tally = hooks.gather(parts, ctx.tally)
    params = [p for p in model.parameters() if p.requires_grad]
    losses = {key: sum((part[2][key] for part in parts), 0.0) for key in LOSS_KEYS}
    if algo.distill_loss == "off":
        del losses["loss/distill"]
    del losses["loss/policy" if plan.objective == "sft" else "loss/nll"]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, plan.max_grad_norm, error_if_nonfinite=False).item()
    stepped = math.isfinite(losses["loss/total"]) and math.isfinite(grad_norm)
    if stepped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    out = reduce_metrics((metrics, weight) for metrics, weight, *_ in parts)
    out.update(losses)
    out.update(padding_metrics(batch.prompt_mask, batch.response_mask, planned, packed))
    out.update(tally.metrics() if tally is not None else {})
    out["optim/grad_norm"] = grad_norm
    if not ctx.measures_entropy:
        return out, stepped, None
    return out, stepped, ForwardRows(_rows(parts, 4, batch.response_mask), _rows(parts, 5, batch.response_mask))


def _packed(ctx: StepContext, batch: TrainBatch, planned: list[torch.Tensor]) -> list[bool]:
    """Whether each micro-batch's forward packs, decided once here and handed to it: the plan's answer, or under
    ``learner.packing=auto`` one answer for the whole optimizer step (:func:`~grpoplus.learner.packing.packing_pays`
    over its micro-batches, with prompts shared where the plain head path shares them, as one process would), the
    same on every learner rank, which all hold the whole mini-batch."""
    plan = ctx.plan
    if plan.packing != "auto":
        return [bool(plan.packing)] * len(planned)
    share = estimated_sharing(plan) and not ctx.algo.entropy_bonus  # the entropy-bonus forward shares no prompt
    pays = packing_pays(ctx.model, batch.prompt_ids, batch.prompt_mask, batch.response_mask, share, planned,
                        plan.packed_attention)
    return [pays] * len(planned)


def _micro_step(ctx: StepContext, mb: MicroBatch) -> tuple:
    """Forward and backward of one micro-batch: the loss is the sum of its terms (:func:`loss_terms`). Returns
    (metrics, weight, its part of the loss, idx, and when pi_old comes from this forward its entropy [n, T] and
    log-probs [n, T], else None and None)."""
    out = _forward(ctx, mb)
    loss, metrics = None, {}
    for term in loss_terms(ctx.algo, ctx.plan):
        part, part_metrics = term(ctx, mb, out)
        loss = part if loss is None else loss + part
        total = metrics.get("loss/total", 0.0) + part_metrics.pop("loss/total", 0.0)
        metrics.update(part_metrics)
        metrics["loss/total"] = total
    (loss * mb.scale if mb.scale != 1.0 else loss).backward()
    losses = {key: metrics.pop(key, 0.0) for key in LOSS_KEYS}
    weight = max(metrics.get("loss/active_tokens", 0.0), 1e-9)
    if not ctx.measures_entropy:
        return metrics, weight, losses, mb.idx, None, None
    return metrics, weight, losses, mb.idx, out.entropy.detach(), out.logp.detach()


def policy_term(ctx: StepContext, mb: MicroBatch, out: Forward) -> tuple[torch.Tensor, dict]:
    """The policy loss of ``algo`` (ALGORITHMS.md sections 2-6), with its KL and entropy parts."""
    algo, rows = ctx.algo, mb.rows
    logp_old = out.logp.detach() if ctx.fused else rows.logp_old  # same weights: exactly pi_old
    return policy_loss(out.logp, logp_old, rows.advantages, mb.loss_mask, algo, logp_roll=rows.logp_roll,
                       logp_ref=rows.logp_ref, norm=mb.norm, entropy=out.entropy if algo.entropy_bonus else None,
                       entropy_coef=ctx.entropy_coef)


def distill_term(ctx: StepContext, mb: MicroBatch, out: Forward) -> tuple[torch.Tensor, dict]:
    """Section 11: the divergence from the teacher, aggregated like the policy term, times ``algo.distill_coef``."""
    algo = ctx.algo
    m = mb.loss_mask.to(out.divergence.dtype)
    distill = algo.distill_coef * AGGREGATIONS.get(algo.aggregation)(out.divergence * m, m, mb.norm)
    value = float(distill.detach())
    return distill, {"loss/distill": value, "loss/total": value}


def sft_term(ctx: StepContext, mb: MicroBatch, out: Forward) -> tuple[torch.Tensor, dict]:
    """A supervised stage's loss: the demonstrated tokens' negative log-likelihood, aggregated as ``algo.aggregation``
    with the mini-batch's denominators (token_mean: the mean over every demonstrated token of the batch, whatever
    the micro-batches)."""
    m = mb.loss_mask.to(out.logp.dtype)
    nll = AGGREGATIONS.get(ctx.algo.aggregation)(-out.logp * m, m, mb.norm)
    value = float(nll.detach())
    return nll, {"loss/nll": value, "loss/total": value, "loss/active_tokens": float(m.sum())}


def loss_terms(algo: AlgoConfig, plan: LearnerPlan | None = None) -> tuple:
    """The terms whose sum is the training loss: a supervised stage's negative log-likelihood; else the policy's,
    and the teacher's with ``algo.distill_loss``."""
    if plan is not None and plan.objective == "sft":
        return (sft_term,)
    return (policy_term,) if algo.distill_loss == "off" else (policy_term, distill_term)


@dataclass
class ForwardRows:
    """What the training forwards of a mini-batch measured when they are pi_old's: per row and token."""

    entropy: torch.Tensor  # [N, T]
    logp: torch.Tensor  # [N, T] pi_old log-probs of the sampled tokens


def _rows(parts: list, column: int, response_mask: torch.Tensor) -> torch.Tensor:
    """[N, T] of the mini-batch, put together from column ``column`` ([n, T]) of its micro-batches' results."""
    whole = torch.zeros(response_mask.shape, device=response_mask.device)
    for part in parts:
        whole[part[3].to(whole.device)] = part[column].to(whole.device, whole.dtype)
    return whole


def _forward(ctx: StepContext, mb: MicroBatch) -> Forward:
    """The micro-batch's training forward: logp with grad, and the entropy with its gradient for the bonus, without
    it for metrics only (pi_old from this forward), else None; with ``algo.distill_loss`` the teacher's forward
    too (:func:`grpoplus.learner.distill.distill_forward`)."""
    algo, plan, rows, hooks = ctx.algo, ctx.plan, mb.rows, ctx.hooks
    args = (rows.prompt_ids, rows.prompt_mask, rows.response_ids, rows.response_mask)
    if algo.distill_loss != "off":
        if ctx.teacher is None:
            raise ValueError(f"algo.distill_loss={algo.distill_loss} needs the teacher model in the update "
                             "(learner.teacher)")
        with compiled_layers(ctx.model, plan.compile), checkpointed_layers(ctx.model, plan.gradient_checkpointing), \
                autocast(plan.precision, args[0].device):
            return Forward(*hooks.forward(distill_forward, ctx.model, ctx.teacher, *args, temperature=plan.temperature,
                                          loss=algo.distill_loss, beta=algo.gjsd_beta,
                                          with_entropy=ctx.fused or algo.entropy_bonus))
    routing = training_routing(ctx.model, rows, plan, ctx.tally if mb.scale else None)
    with compiled_layers(ctx.model, plan.compile), checkpointed_layers(ctx.model, plan.gradient_checkpointing), \
            trimmed_backward(ctx.model, plan.trim_every), \
            autocast(plan.precision, args[0].device):
        if algo.entropy_bonus:
            return Forward(*hooks.forward(response_logprobs_and_entropy, ctx.model, *args,
                                          temperature=plan.temperature, routing=routing, packing=mb.packed,
                                          packed_attention=plan.packed_attention))
        return Forward(*hooks.forward(response_logprobs, ctx.model, *args, temperature=plan.temperature,
                                      with_entropy=ctx.measures_entropy, routing=routing,
                                      share_prompts=forward_sharing(plan), packing=mb.packed,
                                      packed_attention=plan.packed_attention, **vision_of(rows.vision)))


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


def count_step(scheduler) -> None:
    """One optimizer step on the schedule, taken or skipped (a skipped step counts: the schedule follows the run's
    steps). torch warns when a run's first steps were skipped ("lr_scheduler.step() before optimizer.step()"): the
    order is intended here, so that warning is not shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
        scheduler.step()


def update_policy(model, optimizer, scheduler, batch: TrainBatch, algo: AlgoConfig, plan: LearnerPlan,
                  entropy_control: EntropyControl | None = None, first_step: int = 0,
                  hooks: UpdateHooks = ONE_PROCESS, teacher: torch.nn.Module | None = None) -> UpdateResult:
    """All optimizer steps for one rollout batch; the entropy comes back when the training forward
    measured it (pi_old from the forward: one update, so each row is seen once).

    ``entropy_control`` gives each step's bonus coefficient and is updated after each step with
    the entropy the step measured (``algo.entropy_bonus``); ``first_step`` is the run-wide index
    of this batch's first optimizer step (seeds Clip-Cov's selection). ``hooks``: the learner ranks' (every
    learner rank calls this with the same batch)."""
    batch = batch.to(compute_device(model))
    control = entropy_control if entropy_control is not None else EntropyControl.from_config(algo)
    if not bool(batch.response_mask.any()):  # every trajectory ended before the model sampled (environment errors)
        for _ in range(algo.updates_per_batch):
            count_step(scheduler)
        return UpdateResult({"optim/skipped_updates": float(algo.updates_per_batch), "optim/empty_batch": 1.0,
                             "optim/lr": optimizer.param_groups[0]["lr"]}, None)
    model.train()
    parts, skipped, measured, k = [], 0, None, first_step
    for _ in range(algo.num_iterations):
        for rows in minibatch_rows(batch.group_ids, algo.num_minibatches):
            metrics, stepped, measured = optimizer_step(model, optimizer, batch.rows(rows), algo, plan,
                                                       entropy_coef=control.applied_coef,
                                                       generator=clip_cov_generator(plan.seed, k), hooks=hooks,
                                                       teacher=teacher)
            if not parts and "moe/routing_mismatch" in metrics:  # the first step: the weights are still pi_old
                metrics["moe/routing_mismatch_first"] = metrics["moe/routing_mismatch"]
            skipped += not stepped
            k += 1
            count_step(scheduler)
            if algo.entropy_bonus and stepped and math.isfinite(metrics.get("loss/entropy", math.nan)):
                control.update(metrics["loss/entropy"])
            parts.append((finite(metrics), 1.0))
    model.eval()
    out = reduce_metrics(parts)
    out["optim/skipped_updates"] = float(skipped)
    out["optim/lr"] = optimizer.param_groups[0]["lr"]
    if plan.compile != "off":
        out["learner/compiled_graphs"] = float(compiled_graphs())
    if algo.entropy_bonus:
        out.update(control.metrics())
    if measured is None:
        return UpdateResult(out, None)
    return UpdateResult(out, measured.entropy.cpu(), logp=measured.logp.cpu())
