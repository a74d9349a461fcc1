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

The two passes use caches whose ``update`` is a pure function of its inputs (the prompt pass
returns its keys and values and keeps them; the response pass returns ``cat(prompt's, new)``
and keeps nothing), so a decoder layer recomputed in backward (``learner.gradient_checkpointing``)
sees exactly what its forward saw.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from grpoplus.models.kv_cache import cache_kwargs


def shared_prompt_hidden(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         position_ids: torch.Tensor, prompt_len: int, t1: int, always: bool = False,
                         prompt_inputs=None) -> torch.Tensor | None:
    """Last hidden states at the positions that predict the response tokens, prompts computed once.

    Args:
        model: a transformers causal LM whose body is ``model.model``.
        input_ids, attention_mask, position_ids: [n, prompt_len + t1] the row-by-row forward's inputs
            (left-padded prompts, then right-padded responses).
        prompt_len: the prompt columns; t1: the response columns (>= 1).
        always: both passes even when every row's prompt is its own (the same body passes whatever the rows).
        prompt_inputs: a vision-language model's: ``prompt_inputs(rows)`` gives the prompt pass's inputs beyond the
            ids for those rows (their images, per-token values over the prompt columns); ``position_ids`` may then
            be Qwen's three rows ([3, n, L]). The response pass reads text only (a response with images does not
            share its prompt: the caller's choice).

    Returns:
        [n, t1, H] hidden states at columns ``prompt_len - 1 .. prompt_len + t1 - 2``, or None when no
        two rows share a prompt or the model's cache cannot be shared.
    """
    prompts = torch.cat([input_ids[:, :prompt_len], attention_mask[:, :prompt_len].to(input_ids.dtype)], 1)
    unique, inverse = torch.unique(prompts, dim=0, return_inverse=True)  # [u, 2P], [n]
    if (len(unique) == len(prompts) and not always) or prompt_len == 0:
        return None
    cache = DynamicCache(config=model.config)
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    cache.layers = [_PromptLayer() for _ in cache.layers]
    first = torch.full((len(unique),), len(prompts), dtype=torch.long, device=inverse.device).scatter_reduce_(
        0, inverse, torch.arange(len(prompts), device=inverse.device), "amin")  # [u] a row holding each distinct prompt
    body = model.model
    extra = prompt_inputs(first) if prompt_inputs is not None else {}
    head_in = body(input_ids=input_ids[first, :prompt_len], attention_mask=attention_mask[first, :prompt_len],
                   position_ids=position_ids[..., first, :prompt_len], **cache_kwargs(body, cache), **extra,
                   use_cache=True).last_hidden_state[inverse, -1:]  # [n, 1, H]: predicts response token 0
    if t1 == 1:
        return head_in
    rows = DynamicCache(config=model.config)  # each row: its prompt's keys and values (a differentiable gather)
    rows.layers = [_RowLayer(layer.keys[inverse], layer.values[inverse]) for layer in cache.layers]
    cols = slice(prompt_len, prompt_len + t1 - 1)
    rest = body(input_ids=input_ids[:, cols], attention_mask=attention_mask[:, :prompt_len + t1 - 1],
                position_ids=position_ids[..., cols], **cache_kwargs(body, rows), use_cache=True).last_hidden_state
    return torch.cat([head_in, rest], 1)  # [n, t1, H]


class _PromptLayer(DynamicLayer):
    """The prompt pass's cache layer: keeps the keys and values it is given and returns them unchanged."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = key_states, value_states  # [u, kv heads, P, d]; a recompute sets the same values
        return key_states, value_states


class _RowLayer(DynamicLayer):
    """The response pass's cache layer: every row's prompt keys and values, prepended to the new ones, never grown."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values  # [n, kv heads, P, d]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        return torch.cat([self.keys, key_states], -2), torch.cat([self.values, value_states], -2)
