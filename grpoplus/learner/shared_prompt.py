"""The learner's forward with each distinct prompt computed once (``learner.share_prompts``).

A GRPO batch holds G responses per prompt, so a forward over ``cat(prompt, response)`` row
by row computes every prompt G times, forward and backward. Here the body runs twice: once
over the distinct prompts of the micro-batch (keeping their keys and values), then over the
responses of every row, attending to its prompt's keys and values gathered per row. The
gather is differentiable, so the gradient of every response reaches its prompt's forward
and, summed over the group, the weights: the same gradient as the row-by-row forward (float
summation order aside; tests/learner/test_shared_prompt.py compares them).

It applies to models whose transformers cache is a plain growing key/value cache on every
layer (no sliding window), and not under MoE routing replay (whose hooks see one forward per
call); elsewhere :func:`shared_prompt_hidden` returns None and the caller runs the
row-by-row forward.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def shared_prompt_hidden(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         position_ids: torch.Tensor, prompt_len: int, t1: int) -> torch.Tensor | None:
    """Last hidden states at the positions that predict the response tokens, prompts computed once.

    Args:
        model: a transformers causal LM whose body is ``model.model``.
        input_ids, attention_mask, position_ids: [n, prompt_len + t1] the row-by-row forward's inputs
            (left-padded prompts, then right-padded responses).
        prompt_len: the prompt columns; t1: the response columns (>= 1).

    Returns:
        [n, t1, H] hidden states at columns ``prompt_len - 1 .. prompt_len + t1 - 2``, or None when no
        two rows share a prompt or the model's cache cannot be shared.
    """
    prompts = torch.cat([input_ids[:, :prompt_len], attention_mask[:, :prompt_len].to(input_ids.dtype)], 1)
    unique, inverse = torch.unique(prompts, dim=0, return_inverse=True)  # [u, 2P], [n]
    if len(unique) == len(prompts) or prompt_len == 0:
        return None
    cache = DynamicCache(config=model.config)
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    first = torch.full((len(unique),), len(prompts), dtype=torch.long).scatter_reduce_(
        0, inverse, torch.arange(len(prompts)), "amin")  # [u] a row holding each distinct prompt
    body = model.model
    head_in = body(input_ids=input_ids[first, :prompt_len], attention_mask=attention_mask[first, :prompt_len],
                   position_ids=position_ids[first, :prompt_len], past_key_values=cache,
                   use_cache=True).last_hidden_state[inverse, -1:]  # [n, 1, H]: predicts response token 0
    if t1 == 1:
        return head_in
    for layer in cache.layers:  # every row gets its prompt's keys and values (autograd gathers the gradient)
        layer.keys, layer.values = layer.keys[inverse], layer.values[inverse]
    cols = slice(prompt_len, prompt_len + t1 - 1)
    rest = body(input_ids=input_ids[:, cols], attention_mask=attention_mask[:, :prompt_len + t1 - 1],
                position_ids=position_ids[:, cols], past_key_values=cache, use_cache=True).last_hidden_state
    return torch.cat([head_in, rest], 1)  # [n, t1, H]
