"""The learner's update: mini-batches, micro-batches with exact normalisation, and safe steps.

One rollout batch gives ``num_iterations x num_minibatches`` optimizer steps
(ALGORITHMS.md section 7). Each optimizer step accumulates gradients over micro-batches;
the loss denominators are those of the whole mini-batch (section 3), so the accumulated
gradient equals the un-split one. A step whose loss or gradient is not finite is skipped
and counted: the weights and the optimizer state are left untouched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grpoplus.algo import AlgoConfig, policy_loss, prepare_loss
from grpoplus.learner.logprobs import response_logprobs


@dataclass
class TrainBatch:
    """Everything the learner needs for one rollout batch (N responses)."""

    prompt_ids: torch.Tensor  # [N, P]
    prompt_mask: torch.Tensor  # [N, P]
    response_ids: torch.Tensor  # [N, T]
    response_mask: torch.Tensor  # [N, T] tokens present (attention)
    loss_mask: torch.Tensor  # [N, T] tokens that carry loss (after filters)
    advantages: torch.Tensor  # [N] or [N, T]
    logp_roll: torch.Tensor  # [N, T]
    logp_old: torch.Tensor | None  # [N, T]; None: take it from the training forward (on-policy, one update)
    logp_ref: torch.Tensor | None  # [N, T]
    group_ids: torch.Tensor  # [N]

    def rows(self, idx: torch.Tensor) -> "TrainBatch":
        return self._map(lambda x: x[idx.to(x.device)])

    def to(self, device: torch.device) -> "TrainBatch":
        return self._map(lambda x: x.to(device))

    def _map(self, fn) -> "TrainBatch":
        return TrainBatch(*(None if (x := getattr(self, f)) is None else fn(x) for f in self.__dataclass_fields__))


class MetricAccumulator:
    """Combines per-micro-batch metric dicts: ``*_max`` by max, ``*_min`` by min, the rest by a
    weighted mean (weight = the micro-batch's active tokens)."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.extremes: dict[str, float] = {}

    def add(self, metrics: dict[str, float], weight: float) -> None:
        for key, value in metrics.items():
            if key.endswith("_max"):
                self.extremes[key] = max(self.extremes.get(key, -math.inf), value)
            elif key.endswith("_min"):
                self.extremes[key] = min(self.extremes.get(key, math.inf), value)
            else:
                self.sums[key] = self.sums.get(key, 0.0) + value * weight
                self.weights[key] = self.weights.get(key, 0.0) + weight

    def result(self) -> dict[str, float]:
        out = {k: self.sums[k] / self.weights[k] for k in self.sums if self.weights[k] > 0}
        out.update(self.extremes)
        return out


def minibatch_rows(group_ids: torch.Tensor, num_minibatches: int) -> list[torch.Tensor]:
    """Split rows into ``num_minibatches`` parts along group boundaries (groups stay whole)."""
    groups = torch.unique(group_ids)
    return [torch.nonzero(torch.isin(group_ids, part)).squeeze(1)
            for part in torch.tensor_split(groups, num_minibatches) if len(part)]


def optimizer_step(model, optimizer, batch: TrainBatch, algo: AlgoConfig, *, temperature: float,
                   micro_batch_size: int, max_grad_norm: float
                   ) -> tuple[dict[str, float], bool, torch.Tensor | None]:
    """Accumulate the mini-batch's gradient over micro-batches and step.

    Returns (metrics, stepped, entropy [N, T] when ``batch.logp_old`` is None, else None)."""
    fused = batch.logp_old is None  # then no correction is on: prepare_loss does not read logp_old
    loss_mask, norm = prepare_loss(batch.loss_mask, batch.logp_roll if fused else batch.logp_old, batch.logp_roll,
                                   batch.advantages, algo)
    acc = MetricAccumulator()
    total_loss = policy_part = 0.0
    entropies = []
    optimizer.zero_grad(set_to_none=True)
    for idx in torch.arange(len(batch.group_ids)).split(micro_batch_size):
        mb = batch.rows(idx)
        logp, entropy = response_logprobs(model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask,
                                          temperature=temperature, with_entropy=fused)
        logp_old = logp.detach() if fused else mb.logp_old  # same weights: exactly pi_old
        entropies.append(entropy)
        loss, metrics = policy_loss(logp, logp_old, mb.advantages, loss_mask[idx], algo,
                                    logp_roll=mb.logp_roll, logp_ref=mb.logp_ref, norm=norm)
        loss.backward()
        total_loss += loss.item()  # micro-batch losses are globally normalised: they add up
        policy_part += metrics.get("loss/policy", 0.0)
        acc.add({k: v for k, v in metrics.items() if k not in ("loss/policy", "loss/total")},
                weight=max(metrics.get("loss/active_tokens", 0.0), 1e-9))
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm, error_if_nonfinite=False).item()
    stepped = math.isfinite(total_loss) and math.isfinite(grad_norm)
    if stepped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    out = acc.result()
    out.update({"loss/total": total_loss, "loss/policy": policy_part, "optim/grad_norm": grad_norm})
    return out, stepped, torch.cat(entropies) if fused else None


def update_policy(model, optimizer, scheduler, batch: TrainBatch, algo: AlgoConfig, *, temperature: float,
                  micro_batch_size: int, max_grad_norm: float) -> tuple[dict[str, float], torch.Tensor | None]:
    """All optimizer steps for one rollout batch.

    Returns the step's learner metrics, and the token entropy [N, T] when it came from the
    training forward (``batch.logp_old`` None: one update, so each row is seen once)."""
    if batch.logp_old is None and algo.num_iterations * algo.num_minibatches != 1:
        raise ValueError("logp_old may come from the training forward only with one update per batch")
    batch = batch.to(next(model.parameters()).device)
    model.train()
    acc = MetricAccumulator()
    skipped = 0
    entropy = None
    for _ in range(algo.num_iterations):
        for rows in minibatch_rows(batch.group_ids, algo.num_minibatches):
            metrics, stepped, entropy = optimizer_step(model, optimizer, batch.rows(rows), algo,
                                                       temperature=temperature, micro_batch_size=micro_batch_size,
                                                       max_grad_norm=max_grad_norm)
            skipped += not stepped
            scheduler.step()
            acc.add({k: v for k, v in metrics.items() if math.isfinite(v)}, weight=1.0)
    model.eval()
    out = acc.result()
    out["optim/skipped_updates"] = float(skipped)
    out["optim/lr"] = optimizer.param_groups[0]["lr"]
    return out, None if entropy is None else entropy.cpu()


def build_optimizer(model, *, lr: float, weight_decay: float, betas: tuple[float, float], warmup_steps: int,
                    schedule: str, total_steps: int):
    """AdamW with linear warm-up then constant / cosine / linear decay (per optimizer step)."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                                  weight_decay=weight_decay, betas=betas, foreach=True)  # fewer small kernels

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if schedule == "linear":
            return 1.0 - progress
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
