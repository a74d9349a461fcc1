"""A teacher model in the learner's process (ALGORITHMS.md section 11), placed like the reference policy."""

from __future__ import annotations

import torch

from grpoplus.containers import Rollouts
from grpoplus.learner.distill import response_logits
from grpoplus.learner.logprobs import CHUNK_ELEMENTS

LOGIT_ELEMENTS = 4 * CHUNK_ELEMENTS  # float32 logits held at once while scoring (256 MiB)


class LocalTeacher:
    """A frozen causal LM: its log-prob of each token the student sampled, in the student's context, and
    whether that token is its own first choice. Rows are scored a few at a time, so that at most
    :data:`LOGIT_ELEMENTS` logits exist at once. Log-probs are the teacher's own distribution (temperature 1)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model.eval().requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def token_logprobs(self, rollouts: Rollouts) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp_T [N, T] float32, top1 [N, T] bool) on the CPU, zero / False on padding."""
        r, device = rollouts, self.device
        N, T = r.response_ids.shape
        logp, top1 = torch.zeros(N, T), torch.zeros(N, T, dtype=torch.bool)
        vocab = self.model.get_output_embeddings().weight.shape[0]
        step = max(1, LOGIT_ELEMENTS // max(1, T * vocab))
        for i in range(0, N, step):
            rows = slice(i, i + step)
            tokens, mask = r.response_ids[rows].to(device), r.response_mask[rows].to(device)
            logits, t1 = response_logits(self.model, r.prompt_ids[rows].to(device), r.prompt_mask[rows].to(device),
                                         tokens, mask)
            if logits is None:
                continue
            log_p = logits.float().log_softmax(-1)
            on = mask[:, :t1].bool()
            logp[rows, :t1] = torch.where(on, log_p.gather(-1, tokens[:, :t1, None]).squeeze(-1), 0.0).cpu()
            top1[rows, :t1] = (on & (log_p.argmax(-1) == tokens[:, :t1])).cpu()
        return logp, top1
