"""Routing replay in the learner (ALGORITHMS.md section 8): which expert routing each of the
learner's forwards uses, and how often the router's own choice differs from it.

``algo.routing_replay``:

- ``off``: every forward routes naturally; the natural routing is compared with the
  sampler's (the engine's recorded routing) to measure the mismatch;
- ``r2`` (the Routing Replay of GSPO, Zheng et al. 2025, arXiv:2507.18071): the ``logp_old``
  pass records the learner's natural routing, and every training forward of the batch
  replays it;
- ``r3`` (Rollout Routing Replay, Ma et al. 2025, arXiv:2510.11370): every learner forward,
  the ``logp_old`` pass included, replays the rollout engine's routing.

A :class:`LearnerRouting` is handed to :func:`grpoplus.learner.logprobs.response_logprobs`
as ``routing=``; it wraps each forward in :func:`replay_routing` or :func:`record_routing`
and counts what the router would have chosen in a :class:`RoutingTally`. The reference
policy's forward is never replayed: it is another network with its own routing.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from grpoplus.models.routing import (
    NATURAL,
    RENORMALISES,
    ROUTING_DTYPE,
    RoutingSpec,
    expert_load,
    record_routing,
    replay_routing,
    routing_mismatch,
    routing_spec,
)

REPLAY_MODES = ("off", "r2", "r3")


def moe_spec(model: torch.nn.Module) -> RoutingSpec | None:
    """The routing shape of ``model``, or None for a model without an MoE router replay supports (dense)."""
    if not any(type(m).__name__ in RENORMALISES for m in model.modules()):
        return None
    return routing_spec(model)


def check_replay(mode: str, model: torch.nn.Module) -> RoutingSpec | None:
    """``moe_spec(model)``; ``ValueError`` when routing replay is asked of a model without MoE routers."""
    spec = moe_spec(model)
    if mode != "off" and spec is None:
        raise ValueError(f"algo.routing_replay={mode} needs a mixture-of-experts policy, but {type(model).__name__} "
                         f"has no MoE router that replay supports ({', '.join(RENORMALISES)}): use an MoE model "
                         "(--model tiny-moe) or algo.routing_replay=off")
    return spec


def check_replay_source(mode: str, logp_old: str) -> None:
    """Refuse a replay without its routing: R2 records the learner's routing in the ``logp_old`` recompute pass, so
    pi_old cannot come from the sampler (``rollout``) or the training forward (``forward``, a plan's). The one
    statement of this refusal, for :class:`~grpoplus.learner.prepare.LearnerPlan` and the config rule
    ``routing_replay`` (``logp_old``: learner.logp_old, auto | recompute | rollout)."""
    if mode not in REPLAY_MODES:
        raise ValueError(f"algo.routing_replay={mode!r} is not one of {', '.join(REPLAY_MODES)}")
    if mode == "r2" and logp_old in ("rollout", "forward"):
        source = "from the sampler" if logp_old == "rollout" else "from the training forward"
        raise ValueError(f"algo.routing_replay=r2 records the learner's routing while it computes logp_old, but "
                         f"learner.logp_old={logp_old} takes pi_old {source}: set learner.logp_old=auto, or "
                         "replay the sampler's routing with algo.routing_replay=r3")


def check_replay_checkpointing(mode: str, gradient_checkpointing: bool) -> None:
    """Refuse gradient checkpointing under routing replay: a layer recomputed in the backward runs outside the replay.
    The one statement of this refusal, for :class:`~grpoplus.learner.prepare.LearnerPlan` and the config rule
    ``checkpointing_without_replay``."""
    if gradient_checkpointing and mode != "off":
        raise ValueError(f"learner.gradient_checkpointing recomputes layers in the backward, where "
                         f"algo.routing_replay={mode} no longer holds the router's choices: turn one of them off")


def input_mask(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[N, P], [N, T] -> [N, P + T] long: the real tokens of ``cat(prompt, response)``, whose routing counts."""
    return torch.cat([prompt_mask.long(), response_mask.long()], 1)


class RoutingTally:
    """Counts over the learner's forwards of one optimizer step (or pass), reduced once to metrics.

    ``differ[l] / counted[l]`` is the share of real token-layer choices whose natural top-k
    set differs from the reference routing; ``slots[l, e]`` counts routed token-slots per
    expert of the natural routing (the ``f_i`` of the Switch Transformer balance loss).
    """

    def __init__(self, spec: RoutingSpec):
        self.spec = spec
        self.differ = torch.zeros(spec.num_layers, dtype=torch.float64)
        self.counted = torch.zeros(spec.num_layers, dtype=torch.float64)
        self.slots = torch.zeros(spec.num_layers, spec.num_experts, dtype=torch.float64)

    @torch.no_grad()
    def add(self, natural: torch.Tensor, reference: torch.Tensor | None, mask: torch.Tensor) -> None:
        """natural, reference: [B, S, L, k] (reference None: load only); mask: [B, S] real tokens."""
        tokens = float(mask.sum())
        self.slots += expert_load(natural, mask, self.spec.num_experts).double().cpu() * tokens * self.spec.top_k
        if reference is None:
            return
        per_layer, _ = routing_mismatch(natural, reference, mask)  # fractions of the counted tokens [L]
        counted = (mask.bool()[:, :, None] & (reference[..., 0] != NATURAL)).sum((0, 1)).double().cpu()  # [L]
        self.differ += per_layer.double().cpu() * counted
        self.counted += counted

    def add_counts(self, other: "RoutingTally") -> None:
        """Add ``other``'s counts (another data-parallel rank's micro-batches of the same step)."""
        self.differ += other.differ
        self.counted += other.counted
        self.slots += other.slots

    def metrics(self) -> dict[str, float]:
        """``moe/routing_mismatch`` (and ``/layer<l>``) when a reference was counted; ``moe/load_max_frac``:
        the largest share of routed token-slots any one expert received, worst layer (balanced = 1 / E)."""
        out = {}
        if self.counted.sum() > 0:
            out["moe/routing_mismatch"] = float(self.differ.sum() / self.counted.sum())
            per_layer = self.differ / self.counted.clamp(min=1)
            out.update({f"moe/routing_mismatch/layer{layer}": float(v) for layer, v in enumerate(per_layer)})
        if self.slots.sum() > 0:
            out["moe/load_max_frac"] = float((self.slots / self.slots.sum(1, keepdim=True).clamp(min=1)).max())
        return out


class LearnerRouting:
    """The routing of one learner call over ``N`` rows: passed to ``response_logprobs(routing=...)``.

    Args:
        model: the MoE policy.
        routing: [N, S, L, k] routing aligned with ``cat(prompt_ids, response_ids)``: replayed when
            ``replay``, else only compared with; None: nothing to replay or compare with.
        mask: [N, S] the attention mask of ``cat(prompt, response)`` (which tokens count).
        replay: force ``routing`` in every forward (R2's and R3's training forwards, R3's logp_old pass).
        tally: where each forward's mismatch and expert load are counted (None: not measured).
        record: keep the natural routing of every forward in ``.natural`` (R2's logp_old pass).
    """

    def __init__(self, model: torch.nn.Module, routing: torch.Tensor | None, mask: torch.Tensor, *,
                 replay: bool = False, tally: RoutingTally | None = None, record: bool = False):
        if replay and routing is None:
            raise ValueError("routing replay needs a routing to replay, got None")
        self.model, self.routing, self.mask, self.replay, self.tally = model, routing, mask, replay, tally
        spec = routing_spec(model)
        self.natural = torch.full((*mask.shape, spec.num_layers, spec.top_k), NATURAL,
                                  dtype=ROUTING_DTYPE) if record else None  # [N, S, L, k] on the CPU

    @contextmanager
    def __call__(self, rows: slice, cols: slice, keep: torch.Tensor | None = None) -> Iterator[None]:
        """Wrap the one forward of ``rows`` whose input is the columns ``cols`` of ``cat(prompt, response)``;
        ``keep`` [n, c] bool: a packed forward's input, those columns' real tokens row after row
        (:mod:`grpoplus.learner.packing`)."""
        target = None if self.routing is None else self.routing[rows, cols]
        mask = self.mask[rows, cols]
        if keep is not None:  # [n, c, ...] -> [1, S, ...]: the packed sequence's tokens
            target = None if target is None else target[keep.to(target.device)][None]
            mask = mask[keep.to(mask.device)][None]
        with replay_routing(self.model, target) if self.replay else record_routing(self.model) as record:
            yield
        natural = record.routing
        if self.tally is not None:
            self.tally.add(natural, target, mask)
        if self.natural is not None:
            real = mask.bool()[:, :, None, None].cpu()
            natural = torch.where(real, natural.cpu(), NATURAL)
            if keep is None:
                self.natural[rows, cols] = natural
            else:
                self.natural[rows, cols][keep.cpu()] = natural[0]
