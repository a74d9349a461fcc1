"""The KV cache goes to a model's forward under the keyword its transformers release names it by."""

import warnings

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpoplus.models.kv_cache import cache_kwargs
from grpoplus.rollout.hf import prefill

SMALL = dict(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


class _Renamed(torch.nn.Module):
    def forward(self, input_ids, cache=None, use_cache=None):
        return input_ids


class _Old(torch.nn.Module):
    def forward(self, input_ids, past_key_values=None, use_cache=None):
        return input_ids


class _Wrapper(torch.nn.Module):
    def forward(self, *args, **kwargs):
        return args


def test_the_keyword_follows_the_forward_signature():
    cache = object()
    assert cache_kwargs(_Renamed(), cache) == {"cache": cache}
    assert cache_kwargs(_Old(), cache) == {"past_key_values": cache}
    assert cache_kwargs(_Wrapper(), cache) == {"past_key_values": cache}  # **kwargs: the name every release takes


def test_a_cached_prefill_matches_the_plain_forward_without_a_deprecation_warning():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMALL)).eval()
    ids = torch.randint(1, 40, (2, 5))
    mask = torch.ones_like(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        with torch.no_grad():
            state = prefill(model, ids, mask, torch.tensor([1, 1]), capacity=8)
            plain = model(input_ids=ids, attention_mask=mask).logits[:, -1]
            # the cache is filled: one more token through it equals the forward over the 6 tokens
            nxt = torch.full((2, 1), 3)
            step = model(input_ids=nxt, attention_mask=torch.ones(2, 6, dtype=torch.long), position_ids=state.batch.next_pos,
                         **cache_kwargs(model, state.batch.cache), use_cache=True).logits[:, -1]
            full = model(input_ids=torch.cat([ids, nxt], 1)).logits[:, -1]
    assert torch.allclose(state.logits, plain, atol=1e-5)
    assert torch.allclose(step, full, atol=1e-5)
