"""Routing capture and replay for Hugging Face mixture-of-experts models (ALGORITHMS.md section 8).

An MoE layer sends every token to the ``top_k`` experts with the largest router
probability. A tiny change of weights or numerics can flip that choice, and then the
token's output jumps: the log-prob ratio of a policy-gradient step mixes the change of
policy with a change of experts. Routing replay removes the jump by fixing the choice:

- **R2**: record the learner's choice while computing ``logp_old``
  (:func:`record_routing`) and force it in every later forward of the batch
  (:func:`replay_routing`);
- **R3**: record the rollout engine's choice (:func:`rollout_routing` for the in-process
  engine) and force it in the learner.

A routing tensor is ``[B, S, L, k]`` integer: for row ``b``, input column ``s`` and MoE
layer ``l`` (MoE layers counted in model order), the ``k`` experts of that token, aligned
with the columns of the forward's ``input_ids``. The value :data:`NATURAL` (all ``k``
slots) lets a token keep the model's own choice (padding, or tokens an engine never
forwarded).

Under replay each token uses exactly the replayed experts, and its gate weights are the
router's softmax probabilities of those experts, renormalised as the architecture
renormalises its top-k weights (``norm_topk_prob``; Mixtral always): with
renormalisation that is the softmax of the router logits restricted to the replayed
experts. The weights stay a function of the router logits, so the router keeps learning.

Mechanism: forward hooks on the router modules of one model instance (and a pre-hook on
its transformer body to learn each forward's ``[B, S]``); nothing in transformers is patched, and the
hooks are removed when the ``with`` block ends, also on an exception.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Iterator

import torch

NATURAL = -1
"""Replayed expert value meaning "this token keeps the model's own choice" (on all ``k`` slots)."""

ROUTING_DTYPE = torch.int16
"""Storage dtype of recorded routings: expert ids up to 32767 and :data:`NATURAL`, 1/4 of int64."""

RENORMALISES = {
    # router class name -> does it renormalise its top-k probabilities to sum to 1?
    "Qwen3MoeTopKRouter": lambda router: bool(router.norm_topk_prob),
    "Qwen3NextTopKRouter": lambda router: bool(router.norm_topk_prob),
    "Qwen3_5MoeTopKRouter": lambda router: True,
    "Qwen2MoeTopKRouter": lambda router: bool(router.norm_topk_prob),
    "OlmoeTopKRouter": lambda router: bool(router.norm_topk_prob),
    "MixtralTopKRouter": lambda router: True,
}
"""Routers whose forward returns ``(logits [n, E], top-k weights [n, k], top-k ids [n, k])``
after ``softmax -> top-k -> optional renormalisation``: the ones replay supports."""


@dataclass(frozen=True)
class RoutingSpec:
    """The routing shape of a model: ``num_layers`` MoE layers of ``num_experts``, top-``top_k``."""

    num_layers: int
    num_experts: int
    top_k: int


def moe_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The supported router modules of ``model``, in layer order.

    Raises ``ValueError`` for a model without one (a dense model, or an unsupported MoE).
    """
    routers = [m for m in model.modules() if type(m).__name__ in RENORMALISES]
    if not routers:
        raise ValueError(f"{type(model).__name__} has no mixture-of-experts router that routing replay supports "
                         f"({', '.join(RENORMALISES)}); routing replay needs an MoE model such as --model tiny-moe")
    return routers


def routing_spec(model: torch.nn.Module) -> RoutingSpec:
    """``RoutingSpec`` of ``model`` (``ValueError`` for a model without supported MoE layers)."""
    return _spec(moe_routers(model))


def _spec(routers: list[torch.nn.Module]) -> RoutingSpec:
    return RoutingSpec(num_layers=len(routers), num_experts=routers[0].num_experts, top_k=routers[0].top_k)


def check_routing(routing: torch.Tensor, spec: RoutingSpec) -> None:
    """Reject a routing that cannot be replayed on a model of ``spec``, naming the problem."""
    if not isinstance(routing, torch.Tensor) or routing.dtype.is_floating_point or routing.dtype == torch.bool:
        raise ValueError(f"routing must be an integer tensor [B, S, L, k], got {type(routing).__name__} "
                         f"{getattr(routing, 'dtype', '')}")
    if routing.dim() != 4:
        raise ValueError(f"routing must have 4 dims [B, S, L, k], got shape {tuple(routing.shape)}")
    if routing.shape[2] != spec.num_layers:
        raise ValueError(f"routing has {routing.shape[2]} layers (dim 2) but the model has {spec.num_layers} MoE layers")
    if routing.shape[3] != spec.top_k:
        raise ValueError(f"routing has k={routing.shape[3]} experts per token (dim 3) but the model routes each token "
                         f"to top_k={spec.top_k}")
    if routing.numel() == 0:
        return
    if int(routing.max()) >= spec.num_experts or int(routing.min()) < NATURAL:
        raise ValueError(f"routing holds expert ids in [{int(routing.min())}, {int(routing.max())}]; valid ids are "
                         f"0..{spec.num_experts - 1} (num_experts={spec.num_experts}) and {NATURAL} for 'natural'")
    natural = routing == NATURAL
    if not torch.equal(natural.any(-1), natural.all(-1)):
        raise ValueError(f"routing marks some but not all k slots of a token {NATURAL}; mark all k or none")
    ordered = routing.sort(-1).values
    if bool(((ordered[..., 1:] == ordered[..., :-1]) & ~natural[..., 1:]).any()):
        raise ValueError("routing repeats an expert among the k choices of a token; top-k experts are distinct")


def transformer_body(model: torch.nn.Module) -> torch.nn.Module:
    """The body (``get_decoder()``) of a causal LM, which every forward runs, whether the model is
    called whole or its body alone (the learner's chunked-head path); ``model`` itself otherwise."""
    get_decoder = getattr(model, "get_decoder", None)
    return get_decoder() if callable(get_decoder) else model


def _forward_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """The ``input_ids`` [B, S] (or ``inputs_embeds`` [B, S, H]) of a causal-LM forward call."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    return kwargs["inputs_embeds"] if ids is None else ids


class RoutingRecord:
    """The top-k expert ids each forward chose, filled by :func:`record_routing` / :func:`replay_routing`."""

    def __init__(self, num_layers: int):
        self.num_layers = num_layers
        self._shapes: list[tuple[int, int]] = []
        self._layers: list[list[torch.Tensor | None]] = []

    def _start(self, module, args, kwargs) -> None:
        ids = _forward_input(args, kwargs)
        self._shapes.append((int(ids.shape[0]), int(ids.shape[1])))
        self._layers.append([None] * self.num_layers)

    def _store(self, layer: int, index: torch.Tensor) -> None:
        # Assigned, not appended: a gradient-checkpointing recompute overwrites the same entry.
        self._layers[-1][layer] = index.detach().to(ROUTING_DTYPE)

    @property
    def forwards(self) -> list[torch.Tensor]:
        """One ``[B, S, L, k]`` routing per forward run inside the ``with`` block, in call order."""
        out = []
        for (b, s), layers in zip(self._shapes, self._layers):
            if any(x is None for x in layers):
                raise ValueError("a forward did not reach every MoE layer; cannot assemble its routing")
            out.append(torch.stack(layers, 1).view(b, s, self.num_layers, -1))
        return out

    @property
    def routing(self) -> torch.Tensor:
        """The ``[B, S, L, k]`` routing of the one forward run inside the ``with`` block."""
        if len(self._shapes) != 1:
            raise ValueError(f"{len(self._shapes)} forwards ran inside the block; .routing needs exactly one "
                             "(use .forwards for several)")
        return self.forwards[0]


def _record_hook(record: RoutingRecord, layer: int, module, args, output) -> None:
    record._store(layer, output[2])


@contextmanager
def record_routing(model: torch.nn.Module) -> Iterator[RoutingRecord]:
    """Record the top-k experts of every token at every MoE layer of the forwards run inside the block.

    >>> with record_routing(model) as record:          # doctest: +SKIP
    ...     model(input_ids=ids, attention_mask=mask, position_ids=pos)
    >>> record.routing.shape                           # doctest: +SKIP
    torch.Size([B, S, L, k])

    Works with and without grad; the model's outputs are untouched. Call ``model`` or its
    transformer body (a pre-hook on the body learns each forward's ``[B, S]``). Raises ``ValueError`` for a
    model without supported MoE routers.
    """
    routers = moe_routers(model)
    record = RoutingRecord(len(routers))
    handles = [transformer_body(model).register_forward_pre_hook(record._start, with_kwargs=True)]
    try:
        handles += [r.register_forward_hook(partial(_record_hook, record, layer)) for layer, r in enumerate(routers)]
        yield record
    finally:
        for handle in handles:
            handle.remove()


class _Replay:
    """Hook state of one :func:`replay_routing` block: the forced ids and the natural ones seen."""

    def __init__(self, routing: torch.Tensor, num_layers: int):
        self.routing = routing
        self.record = RoutingRecord(num_layers)
        self._flat: torch.Tensor | None = None

    def start(self, module, args, kwargs) -> None:
        ids = _forward_input(args, kwargs)
        if tuple(ids.shape[:2]) != tuple(self.routing.shape[:2]):
            raise ValueError(f"replayed routing covers [B, S] = {list(self.routing.shape[:2])} but the forward's input "
                             f"is {list(ids.shape[:2])}; pass a routing aligned with the input columns")
        self.record._start(module, args, kwargs)
        if self._flat is None:  # [B*S, L, k] int64 on the model's device, converted once per block
            self._flat = self.routing.to(device=ids.device, dtype=torch.long).flatten(0, 1)

    def router_hook(self, layer: int, renormalise: bool, module, args, output):
        logits, weights, natural = output  # [n, E], [n, k], [n, k]
        self.record._store(layer, natural)
        forced = self._flat[:, layer]  # [n, k]
        index = torch.where(forced == NATURAL, natural, forced)
        # The router's own arithmetic with the top-k ids replaced: softmax in float32, the
        # probabilities of the chosen experts, then the architecture's renormalisation.
        chosen = torch.softmax(logits.float(), dim=-1).gather(-1, index)  # [n, k]
        if renormalise:
            chosen = chosen / chosen.sum(dim=-1, keepdim=True)
        return logits, chosen.to(weights.dtype), index


@contextmanager
def replay_routing(model: torch.nn.Module, routing: torch.Tensor) -> Iterator[RoutingRecord]:
    """Force ``routing`` [B, S, L, k] in every forward run inside the block; yields the natural choices.

    Each token uses exactly its replayed experts (its own choice where the routing is
    :data:`NATURAL`); the gate weights are the router's probabilities of those experts,
    renormalised as the architecture does, so gradients reach the router weights. Replaying
    a forward's own recorded routing with the same weights and inputs gives bit-identical
    outputs (the weights are the same floats, gathered instead of taken from top-k).

    The yielded :class:`RoutingRecord` holds what the router would have chosen (its
    ``.routing``), for :func:`routing_mismatch`. Raises ``ValueError`` for a model without
    supported MoE routers, a routing of the wrong layer count, ``k`` or expert ids (on
    entry), and a forward whose ``[B, S]`` differs from the routing's (on that forward).
    """
    routers = moe_routers(model)
    spec = _spec(routers)
    check_routing(routing, spec)
    replay = _Replay(routing, spec.num_layers)
    handles = [transformer_body(model).register_forward_pre_hook(replay.start, with_kwargs=True)]
    try:
        handles += [r.register_forward_hook(partial(replay.router_hook, layer, RENORMALISES[type(r).__name__](r)))
                    for layer, r in enumerate(routers)]
        yield replay.record
    finally:
        for handle in handles:
            handle.remove()


def _counted(routing: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, S, L] bool: token is real (``mask``) and its routing is not :data:`NATURAL`."""
    return mask.bool()[:, :, None] & (routing[..., 0] != NATURAL)


@torch.no_grad()
def routing_mismatch(natural: torch.Tensor, replayed: torch.Tensor, mask: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Share of token-layer choices whose natural top-k *set* differs from the replayed one.

    Args:
        natural, replayed: [B, S, L, k] routings (the order within the k slots is ignored).
        mask: [B, S], 1 on the tokens that count (the attention mask, or the response mask).

    Returns:
        ``(per_layer [L], overall [])`` float32 fractions over the counted tokens (tokens
        replayed as :data:`NATURAL` are not counted); 0 when nothing is counted.
    """
    differs = (natural.sort(-1).values != replayed.to(natural.dtype).sort(-1).values).any(-1)  # [B, S, L]
    counted = _counted(replayed, mask)  # [B, S, L]
    hits, total = (differs & counted).sum((0, 1)).float(), counted.sum((0, 1)).float()  # [L], [L]
    return hits / total.clamp(min=1), hits.sum() / total.sum().clamp(min=1)


@torch.no_grad()
def expert_load(routing: torch.Tensor, mask: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Share of the routed token-slots that go to each expert: [B, S, L, k], [B, S] -> [L, E] float32.

    Each counted token contributes ``k`` slots, so every row sums to 1 (0 when no token is
    counted) and a perfectly balanced layer has ``1 / E`` everywhere. This is the ``f_i`` of
    the Switch Transformer load-balancing loss (Fedus et al., 2021, eq. 4) for top-k routing.
    """
    num_layers, k = routing.shape[2], routing.shape[3]
    counted = _counted(routing, mask)[..., None].expand(-1, -1, -1, k)  # [B, S, L, k]
    layer = torch.arange(num_layers, device=routing.device).view(1, 1, num_layers, 1)
    keys = (layer * num_experts + routing.long())[counted]  # flat (layer, expert) id of every counted slot
    counts = torch.bincount(keys, minlength=num_layers * num_experts).view(num_layers, num_experts).float()
    return counts / counts.sum(1, keepdim=True).clamp(min=1)


def routing_metrics(natural: torch.Tensor, replayed: torch.Tensor, mask: torch.Tensor, num_experts: int
                    ) -> dict[str, torch.Tensor]:
    """Detached routing metrics of one replayed forward, named for the metrics writer.

    ``routing/mismatch`` (and ``routing/mismatch_layer{l}``): :func:`routing_mismatch`;
    ``routing/load_max``: the busiest expert's load times ``E``, worst layer (1 = balanced,
    ``E / k`` = every token on the same ``k`` experts), of the router's natural choice.
    """
    per_layer, overall = routing_mismatch(natural, replayed, mask)
    metrics = {"routing/mismatch": overall}
    metrics.update({f"routing/mismatch_layer{layer}": value for layer, value in enumerate(per_layer)})
    metrics["routing/load_max"] = expert_load(natural, mask, num_experts).max() * num_experts
    return metrics


@torch.no_grad()
def rollout_routing(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                    response_ids: torch.Tensor, response_mask: torch.Tensor, *,
                    micro_batch_size: int | None = None) -> torch.Tensor:
    """The engine model's routing of sampled rollouts, by one teacher-forced forward (R3).

    Args:
        prompt_ids, prompt_mask: [N, P] left-padded prompts.
        response_ids, response_mask: [N, T] right-padded responses.
        micro_batch_size: forward at most this many rows at a time.

    Returns:
        [N, P + T, L, k] ``ROUTING_DTYPE`` routing aligned with ``cat(prompt_ids, response_ids)``.

    Why this is the routing the sampler used: in a causal model a token's router input
    depends only on the tokens up to it, and the teacher-forced forward gives every token
    the same ids, attention mask and position ids (``cumsum(mask) - 1``, as the decode
    loop) as it had while sampling. The KV-cached decode computes the same sums in other
    shapes, so router logits agree to float rounding and a choice differs only where two
    experts' probabilities are that close (a near-tie). The last response token was never
    fed back while sampling; its routing here is the one the learner would use anyway.
    """
    if prompt_ids.shape != prompt_mask.shape or response_ids.shape != response_mask.shape:
        raise ValueError(f"ids and masks must have equal shapes: prompt {tuple(prompt_ids.shape)} vs "
                         f"{tuple(prompt_mask.shape)}, response {tuple(response_ids.shape)} vs "
                         f"{tuple(response_mask.shape)}")
    input_ids = torch.cat([prompt_ids, response_ids], 1)  # [N, P + T]
    attention_mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], 1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)  # the engine's convention
    step = micro_batch_size or input_ids.shape[0]
    was_training = model.training
    model.eval()
    parts = []
    try:
        for i in range(0, input_ids.shape[0], step):
            with record_routing(model) as record:
                model(input_ids=input_ids[i:i + step], attention_mask=attention_mask[i:i + step],
                      position_ids=position_ids[i:i + step], logits_to_keep=1)
            parts.append(record.routing)
    finally:
        model.train(was_training)
    return torch.cat(parts)


def pad_routing(routing: torch.Tensor, prompt_width: int, new_prompt_width: int, new_response_width: int
                ) -> torch.Tensor:
    """Re-pad an [N, P + T, L, k] rollout routing to [N, P' + T', L, k] with :data:`NATURAL`.

    The prompt part (the first ``prompt_width`` columns) is left-padded to
    ``new_prompt_width`` and the response part right-padded to ``new_response_width``, as
    when rollout batches of different widths are concatenated.
    """
    prompt, response = routing[:, :prompt_width], routing[:, prompt_width:]
    if new_prompt_width < prompt.shape[1] or new_response_width < response.shape[1]:
        raise ValueError(f"cannot pad routing of widths ({prompt.shape[1]}, {response.shape[1]}) down to "
                         f"({new_prompt_width}, {new_response_width})")
    pad = (0, 0, 0, 0)  # the L and k dims are never padded
    prompt = torch.nn.functional.pad(prompt, pad + (new_prompt_width - prompt.shape[1], 0), value=NATURAL)
    response = torch.nn.functional.pad(response, pad + (0, new_response_width - response.shape[1]), value=NATURAL)
    return torch.cat([prompt, response], 1)
