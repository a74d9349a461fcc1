"""Parameters kept frozen while the rest of the policy trains (``learner.freeze``): no gradient, no optimizer state."""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def matches(name: str, pattern: str) -> bool:
    """A parameter's full name matches a glob over it (``model.layers.[0-3].*``) or contains the pattern as whole
    dotted parts (``embed_tokens``, ``layers.0``)."""
    return fnmatch.fnmatchcase(name, pattern) or f".{pattern}." in f".{name}."


def freeze(model: torch.nn.Module, patterns: tuple[str, ...] | list[str]) -> int:
    """Freeze every parameter a pattern matches; returns how many elements were frozen. A pattern that matches no
    parameter is refused in one line naming the model's top-level modules (a typo must not train everything)."""
    frozen = 0
    for pattern in patterns:
        hits = [p for name, p in model.named_parameters() if matches(name, pattern)]
        if not hits:
            names = sorted({".".join(name.split(".")[:-1][:2]) for name, _ in model.named_parameters()})
            raise ValueError(f"learner.freeze: {pattern!r} matches no parameter of the policy, whose modules include "
                             f"{', '.join(names[:8])}: name a dotted part (embed_tokens, lm_head, layers.0) or a glob "
                             "over the full name (model.layers.[0-3].*)")
        for p in hits:
            if p.requires_grad:
                frozen += p.numel()
            p.requires_grad_(False)
    if patterns and not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"learner.freeze={list(patterns)} freezes every parameter of the policy: nothing would train; "
                         "name fewer")
    return frozen
