"""The rollout-engine contract and the container it returns.

Engines (in-process Hugging Face now; vLLM later) all return :class:`Rollouts`, which
records for every sampled token the log-prob under the distribution it was actually
sampled from (``logp_roll``), so the learner can measure and correct the mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from grpoplus.registry import Registry


@dataclass(frozen=True)
class SamplingParams:
    n: int = 8  # responses per prompt (the group size G)
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    greedy: bool = False  # temperature 0: argmax decoding, logp_roll of the argmax token at temperature 1


@dataclass
class Rollouts:
    """G responses for each of B prompts; N = B * G rows, groups contiguous. Tensors on the CPU.

    Prompts are left-padded to P columns, responses right-padded to T columns, so that
    ``torch.cat([prompt_ids, response_ids], 1)`` is the learner's input.
    """

    prompt_ids: torch.Tensor  # [N, P] long, left-padded with the pad id
    prompt_mask: torch.Tensor  # [N, P] long, 1 on real prompt tokens
    response_ids: torch.Tensor  # [N, T] long, right-padded with the pad id
    response_mask: torch.Tensor  # [N, T] float, 1 on sampled tokens (EOS included when sampled)
    logp_roll: torch.Tensor  # [N, T] float32, sampler log-prob of each sampled token (0 on padding)
    finished: torch.Tensor  # [N] bool, True when the response ended with EOS (False: cut by the length limit)
    group_ids: torch.Tensor  # [N] long, index of the prompt in this batch
    texts: list[str]  # [N] decoded responses (special tokens stripped)
    prompt_index: list[int]  # [B] caller-given ids of the prompts (e.g. data positions)

    @property
    def lengths(self) -> torch.Tensor:  # [N] long
        return self.response_mask.sum(1).long()


class RolloutEngine(Protocol):
    def generate(self, prompts: list[str], params: SamplingParams, prompt_index: list[int] | None = None,
                 generator: torch.Generator | None = None) -> Rollouts:
        """Sample ``params.n`` responses for every prompt."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load the learner's current weights (a no-op when the engine shares the learner's module)."""


# name -> factory(model, tokenizer, **kwargs) -> RolloutEngine
ENGINES: Registry = Registry("rollout engine")


def select_rows(rollouts: Rollouts, rows: torch.Tensor) -> Rollouts:
    """The rollouts of the given row indices (whole groups expected), group ids renumbered 0..B'-1."""
    rows = rows.long()
    old_groups = rollouts.group_ids[rows]
    uniq, new_groups = torch.unique(old_groups, return_inverse=True)
    return Rollouts(
        prompt_ids=rollouts.prompt_ids[rows],
        prompt_mask=rollouts.prompt_mask[rows],
        response_ids=rollouts.response_ids[rows],
        response_mask=rollouts.response_mask[rows],
        logp_roll=rollouts.logp_roll[rows],
        finished=rollouts.finished[rows],
        group_ids=new_groups,
        texts=[rollouts.texts[i] for i in rows.tolist()],
        prompt_index=[rollouts.prompt_index[g] for g in uniq.tolist()],
    )


def concat_rollouts(parts: list[Rollouts], pad_id: int) -> Rollouts:
    """Stack several rollout batches (e.g. dynamic-sampling rounds): prompts re-left-padded,
    responses re-right-padded to the widest part, group ids offset so groups stay distinct."""
    if len(parts) == 1:
        return parts[0]
    width_p = max(p.prompt_ids.shape[1] for p in parts)
    width_t = max(p.response_ids.shape[1] for p in parts)

    def pad(x: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
        extra = width - x.shape[1]
        return torch.nn.functional.pad(x, (extra, 0) if left else (0, extra), value=value)

    offsets, total = [], 0
    for p in parts:
        offsets.append(total)
        total += len(p.prompt_index)
    return Rollouts(
        prompt_ids=torch.cat([pad(p.prompt_ids, width_p, pad_id, True) for p in parts]),
        prompt_mask=torch.cat([pad(p.prompt_mask, width_p, 0, True) for p in parts]),
        response_ids=torch.cat([pad(p.response_ids, width_t, pad_id, False) for p in parts]),
        response_mask=torch.cat([pad(p.response_mask, width_t, 0.0, False) for p in parts]),
        logp_roll=torch.cat([pad(p.logp_roll, width_t, 0.0, False) for p in parts]),
        finished=torch.cat([p.finished for p in parts]),
        group_ids=torch.cat([p.group_ids + off for p, off in zip(parts, offsets)]),
        texts=[t for p in parts for t in p.texts],
        prompt_index=[i for p in parts for i in p.prompt_index],
    )
