"""Data order: which training prompts each rollout batch draws."""

from __future__ import annotations

import torch


class PromptSampler:
    """Deterministic epoch-wise shuffled order over the training prompts; its state is two ints."""

    def __init__(self, size: int, seed: int):
        if size == 0:
            raise ValueError("the training split holds no prompts")
        self.size, self.seed, self.epoch, self.pos = size, seed, 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.size, generator=gen).tolist()

    def next(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos == self.size:
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._permutation()
            out.append(self._order[self.pos])
            self.pos += 1
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._permutation()
