"""Entropy bonus coefficient: constant, or adapted toward a target entropy (Skywork-OR1).

The bonus itself is ``-c * agg(H)`` in ``policy_loss`` (``entropy=`` the token entropy with
its gradient, ``entropy_coef=`` the coefficient this object says). Adaptive control
(He et al. 2025, Skywork Open Reasoner 1 Technical Report, arXiv:2505.22312, "adaptive
entropy control"; TRL ``use_adaptive_entropy``): after each optimizer step, with ``e`` the
token-mean entropy the step measured,

    c <- min(c + delta, c_max)  if e <= target
    c <- max(c - delta, c_min)  otherwise

and the coefficient applied is ``c`` only while the last measured entropy is at or below
the target, else 0 (so the bonus engages when entropy falls to the target, and backs off
when it has recovered). Before the first measurement the applied coefficient is 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class EntropyControl:
    """The entropy coefficient of a run; ``state_dict``/``load_state_dict`` for checkpoints.

    Call :attr:`applied_coef` for ``policy_loss(..., entropy_coef=...)`` in every micro-batch
    of an optimizer step, and :meth:`update` once after the step with the step's token-mean
    entropy (the ``loss/entropy`` metric accumulated over the step's micro-batches).
    """

    coef: float
    adaptive: bool = False
    target: float = 0.2
    delta: float = 0.005
    coef_min: float = 0.0
    coef_max: float = 1.0
    last_entropy: float = math.inf

    @classmethod
    def from_config(cls, cfg) -> "EntropyControl":
        """From ``AlgoConfig``'s ``entropy_*`` fields."""
        return cls(coef=cfg.entropy_coef, adaptive=cfg.entropy_adaptive, target=cfg.entropy_target,
                   delta=cfg.entropy_coef_delta, coef_min=cfg.entropy_coef_min, coef_max=cfg.entropy_coef_max)

    @property
    def applied_coef(self) -> float:
        """The coefficient of the bonus for the next optimizer step."""
        if not self.adaptive:
            return self.coef
        return self.coef if self.last_entropy <= self.target else 0.0

    def update(self, entropy: float) -> None:
        """Adapt ``coef`` to the entropy measured by the step just taken (no-op when not adaptive)."""
        if not self.adaptive:
            return
        if not math.isfinite(entropy):
            raise ValueError(f"EntropyControl.update needs a finite entropy, got {entropy}")
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.coef_max)
        else:
            self.coef = max(self.coef - self.delta, self.coef_min)
        self.last_entropy = entropy

    def metrics(self) -> dict[str, float]:
        return {"entropy/coef": self.coef, "entropy/applied_coef": self.applied_coef}

    def state_dict(self) -> dict[str, float]:
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.coef = float(state["coef"])
        self.last_entropy = float(state["last_entropy"])
