"""Loss aggregation, from ``L_{i,t}`` to one scalar (ALGORITHMS.md section 3).

Registry signature (``AGGREGATIONS``)::

    fn(loss: Tensor[N, T], mask: Tensor[N, T] float, norm: LossNorm) -> Tensor[]

The denominators come from ``norm`` and count the whole optimizer step's batch, so that
with gradient accumulation the sum of the micro-batch losses equals the loss of the
un-split batch (and so do the gradients). A fully masked response adds nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from torch import Tensor

from grpoplus.algo._util import row_count, row_sum
from grpoplus.algo.registries import AGGREGATIONS


@dataclass
class LossNorm:
    """Global denominators of one optimizer step (the whole mini-batch, all ranks).

    ``tokens``: unmasked tokens after all masks; ``seqs``: responses N; ``active_seqs``:
    responses N' with at least one unmasked token; ``max_len``: L_max (Dr. GRPO's constant).
    ``metrics``: the mask corrections' statistics, measured when the norm was computed
    (``prepare_loss``); ``policy_loss`` reports them with each micro-batch.
    ``selected``: [N, T] bool token selection of a loss that needs one (Clip-Cov, KL-Cov),
    made once over the whole mini-batch; hand a micro-batch ``norm.rows(idx)``.
    """

    tokens: float
    seqs: float
    active_seqs: float
    max_len: float
    metrics: dict[str, float] = field(default_factory=dict)
    selected: Tensor | None = None

    def rows(self, idx: Tensor | slice) -> "LossNorm":
        """The norm for a micro-batch of rows ``idx`` (index tensor or slice): same denominators, its rows of ``selected``."""
        if self.selected is None:
            return self
        idx = idx if isinstance(idx, slice) else idx.to(self.selected.device)
        return dataclasses.replace(self, selected=self.selected[idx])

    @classmethod
    def from_mask(cls, mask: Tensor, max_len: int) -> "LossNorm":
        """Denominators of a batch from its final loss mask [N, T]."""
        mask = mask.bool()
        return cls(
            tokens=float(mask.sum()),
            seqs=float(mask.shape[0]),
            active_seqs=float(mask.any(dim=-1).sum()),
            max_len=float(max_len),
        )


AggregationFn = Callable[[Tensor, Tensor, LossNorm], Tensor]


@AGGREGATIONS.register("token_mean")
def token_mean(loss: Tensor, mask: Tensor, norm: LossNorm) -> Tensor:
    """``sum_{i,t} m L / sum_{i,t} m``. DAPO (arXiv:2503.14476), eq. 8 (token-level loss)."""
    return (loss * mask).sum() / max(norm.tokens, 1.0)


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(loss: Tensor, mask: Tensor, norm: LossNorm) -> Tensor:
    """``(1/N') sum_i (1/|o_i|) sum_t m L``. DeepSeekMath (arXiv:2402.03300), eq. 3."""
    per_seq = row_sum(loss, mask) / row_count(mask).clamp(min=1).to(loss.dtype)  # [N]
    return per_seq.sum() / max(norm.active_seqs, 1.0)


@AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(loss: Tensor, mask: Tensor, norm: LossNorm) -> Tensor:
    """``(1/(N L_max)) sum_{i,t} m L``, a constant denominator. Dr. GRPO (arXiv:2503.20783), eq. 6."""
    return (loss * mask).sum() / max(norm.seqs * norm.max_len, 1.0)


@AGGREGATIONS.register("seq_mean_token_sum")
def seq_mean_token_sum(loss: Tensor, mask: Tensor, norm: LossNorm) -> Tensor:
    """``(1/N') sum_i sum_t m L``."""
    return (loss * mask).sum() / max(norm.active_seqs, 1.0)


def sequence_mean(seq_loss: Tensor, mask: Tensor, norm: LossNorm) -> Tensor:
    """Aggregation of a per-response loss [N] (e.g. GMPO): ``(1/N') sum_{i active} L_i``."""
    active = mask.bool().any(dim=-1).to(seq_loss.dtype)  # [N]
    return (seq_loss * active).sum() / max(norm.active_seqs, 1.0)
