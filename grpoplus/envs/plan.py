"""How a run plays its environments: the factory, the limits and the tokenizer, decided once from the config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from grpoplus.containers import Rollouts, SamplingParams
from grpoplus.envs.episodes import EpisodeLimits, run_episodes


def row_of(example) -> dict:
    """A task example as the data row an environment is made from: ``prompt``, ``answer`` and its extra fields."""
    return {"prompt": example.prompt, "answer": example.answer, **example.fields}


@dataclass(frozen=True, kw_only=True)
class EpisodePlan:
    """Multi-turn collection: each response is a trajectory played in its own environment."""

    factory: Callable[..., Any]
    limits: EpisodeLimits
    tokenizer: Any
    chat: bool = True  # a row's prompt goes through the chat template when the tokenizer has one
    warned: set = field(default_factory=set, compare=False, repr=False)  # environment failures said on stderr

    def run(self, engine, examples: list, params: SamplingParams, prompt_index: list[int],
            generator: torch.Generator | None) -> tuple[Rollouts, dict[str, float]]:
        return run_episodes(engine, self.tokenizer, self.factory, [row_of(ex) for ex in examples], params,
                            self.limits, generator, prompt_index, chat=self.chat, warned=self.warned)
