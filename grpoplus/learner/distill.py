"""The learner's forwards for on-policy distillation (ALGORITHMS.md section 11) that need whole logits.

:func:`response_logits` is the logits of one forward over ``cat(prompt, response)`` at the positions that
predict the response tokens, with the log-prob forward's trimming and position convention
(:func:`~grpoplus.learner.logprobs.trimmed_inputs`), so a teacher scores exactly the context the student
sampled in. :func:`distill_forward` is the training forward of a run with ``algo.distill_loss``: the policy's
log-probs and the per-token divergence to the teacher come from one forward of each model. It holds
[rows x response tokens x vocabulary] logits with their graph: memory grows with the vocabulary, which is
why ``algo.lambda_opd`` (one log-prob per token from the teacher) is the cheaper way to distil.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grpoplus.algo.distill import DISTILL_LOSSES
from grpoplus.learner.logprobs import TokenLogProb, trimmed_inputs
from grpoplus.models.lora import compute_module


def response_logits(model: torch.nn.Module, prompt_ids, prompt_mask, response_ids, response_mask
                    ) -> tuple[torch.Tensor | None, int]:
    """(logits [n, t1, V] predicting response tokens ``0 .. t1-1``, t1); (None, 0) when no row has a response token.
    Differentiable when called with grad."""
    input_ids, attention_mask, position_ids, _, t1 = trimmed_inputs(prompt_ids, prompt_mask, response_ids,
                                                                    response_mask)
    if t1 == 0:
        return None, 0
    logits = compute_module(model)(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   use_cache=False, logits_to_keep=t1 + 1).logits[:, :-1]
    return logits, t1


def distill_forward(model: torch.nn.Module, teacher: torch.nn.Module, prompt_ids, prompt_mask, response_ids,
                    response_mask, *, temperature: float, loss: str, beta: float, with_entropy: bool = False):
    """(logp [n, T], entropy [n, T] or None, divergence [n, T]), all with their gradient through the policy, zero
    on padding: the policy's log-probs of its tokens and ``DISTILL_LOSSES[loss]`` between the policy's and the
    teacher's next-token distributions, both logits divided by ``temperature`` (as TRL's generalized_jsd_loss)."""
    n, T = response_ids.shape
    logits, t1 = response_logits(model, prompt_ids, prompt_mask, response_ids, response_mask)
    if logits is None:
        zeros = response_mask.new_zeros(n, T, dtype=torch.float32)
        return zeros, zeros.clone() if with_entropy else None, zeros.clone()
    with torch.no_grad():
        teacher_logits, _ = response_logits(teacher, prompt_ids, prompt_mask, response_ids, response_mask)
    mask = response_mask[:, :t1].float()
    logp = TokenLogProb.apply(logits, response_ids[:, :t1], temperature) * mask
    student = logits.float() / temperature
    width = min(student.shape[-1], teacher_logits.shape[-1])  # rows past the tokenizer's are padding, never a token
    divergence = DISTILL_LOSSES.get(loss)(student[..., :width], teacher_logits[..., :width].float() / temperature,
                                          beta=beta) * mask
    entropy = None
    if with_entropy:
        log_p = student.log_softmax(-1)
        entropy = -(log_p.exp() * log_p).sum(-1) * mask
    pad = (0, T - t1)
    return F.pad(logp, pad), None if entropy is None else F.pad(entropy, pad), F.pad(divergence, pad)
