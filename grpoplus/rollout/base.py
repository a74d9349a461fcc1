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
    """G responses for each of B prompts; N = B * G rows, groups contiguous.

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
