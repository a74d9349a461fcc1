"""The decode cache: written in place, compacted correctly, and exact with grouped-query attention."""

import pytest
import torch
from transformers import LlamaForCausalLM, MistralConfig, MistralForCausalLM
from transformers.cache_utils import DynamicLayer
from transformers.integrations import sdpa_attention

from grpoplus.learner.logprobs import response_logprobs_from_rollouts
from grpoplus.models import attention
from grpoplus.models.tiny import tiny_config
from grpoplus.rollout import HFEngine, SamplingParams
from grpoplus.rollout.decode_ops import PreallocatedLayer, packed_linears


def _kv(gen, rows, length):
    return torch.randn(rows, 2, length, 3, generator=gen), torch.randn(rows, 2, length, 3, generator=gen)


def test_layer_writes_in_place_and_equals_a_growing_cache():
    gen = torch.Generator().manual_seed(0)
    ours, theirs = PreallocatedLayer(torch.zeros(4, 2, 10, 3), torch.zeros(4, 2, 10, 3), 0), DynamicLayer()
    pointers = [buf.data_ptr() for buf in ours.buffers]
    for length in (5, 1, 1):  # a prefill, then two decode steps
        k, v = _kv(gen, 4, length)
        for got, want in zip(ours.update(k, v), theirs.update(k, v)):
            assert torch.equal(got, want)
    ours.batch_select_indices(torch.tensor([3, 1]))  # rows 3 and 1 move to the front, in that order
    theirs.batch_select_indices(torch.tensor([3, 1]))
    k, v = _kv(gen, 2, 1)
    for got, want in zip(ours.update(k, v), theirs.update(k, v)):
        assert torch.equal(got, want)
    assert ours.get_seq_length() == 8 and [buf.data_ptr() for buf in ours.buffers] == pointers
    assert ours.keys.data_ptr() == pointers[0]  # a view of the buffer, not a copy
    with pytest.raises(ValueError, match="KV cache full"):
        ours.update(*_kv(gen, 2, 3))


def _check_logp_roll(model, tok, prompts, favour_eos):
    favour_eos(model, 3.0)  # rows end at different steps: slots are dropped and the cache compacted
    r = HFEngine(model, tok).generate(prompts, SamplingParams(n=4, max_new_tokens=12),
                                      generator=torch.Generator().manual_seed(1))
    assert 0 < r.finished.sum() < len(r.finished)
    logp, _ = response_logprobs_from_rollouts(model, r)
    torch.testing.assert_close(logp, r.logp_roll, atol=1e-5, rtol=0)


def test_grouped_query_attention_decode_copies_no_heads_and_equals_the_learner(tok, prompts, favour_eos, monkeypatch):
    # 4 query heads share 2 key/value heads: decoding hands the 2 heads to SDPA (enable_gqa) without expanding them
    # per query head (grpoplus.models.attention.use_cpu_gqa, which a run's process setup installs); with sharpened
    # attention any slip shows above 1e-5.
    monkeypatch.setattr(sdpa_attention, "use_gqa_in_sdpa", attention._ORIGINAL)  # transformers' own, restored after
    attention.use_cpu_gqa()
    copies, original = [], sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda x, n: copies.append(n) or original(x, n))
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(len(tok), size="nano", num_attention_heads=4, num_key_value_heads=2))
    assert model.model.layers[0].self_attn.num_key_value_groups == 2
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(6.0)
            layer.self_attn.k_proj.weight.mul_(6.0)
    _check_logp_roll(model, tok, prompts, favour_eos)
    assert copies == [], len(copies)


def test_sliding_window_model_keeps_its_own_cache_and_is_exact(tok, prompts, favour_eos):
    # Sliding-window layers are not preallocated (the fallback keeps transformers' cache);
    # a window of 4 is shorter than the sequences, so the window is exercised.
    torch.manual_seed(0)
    config = MistralConfig(**tiny_config(len(tok), size="nano").to_dict())
    config.sliding_window = 4
    model = MistralForCausalLM(config)
    _check_logp_roll(model, tok, prompts, favour_eos)


def test_packed_linears_give_the_plain_results_and_are_restored(model, tok, prompts, favour_eos):
    # Inside the block every fp32 linear layer multiplies 4-row inputs by a packed weight; the
    # logits equal the plain ones, a hook on the head still runs, and the layers are plain after.
    enc = tok(prompts, padding=True, return_tensors="pt")
    favour_eos(model, 5.0)
    with torch.inference_mode():
        step = {"input_ids": enc["input_ids"][:, -1:], "attention_mask": enc["attention_mask"][:, -1:]}
        plain = model(**step).logits
        with packed_linears(model, rows=4):
            if torch.backends.mkldnn.is_available():
                assert "forward" in vars(model.lm_head)
            packed = model(**step).logits
            other_rows = model(**enc).logits  # 4 x P rows, other than the 4 it was reordered for
    assert not any("forward" in vars(m) for m in model.modules())
    torch.testing.assert_close(packed, plain, atol=1e-6, rtol=0)
    assert (packed[..., tok.eos_token_id] > 4.0).all()  # the hook's bonus is there
    torch.testing.assert_close(other_rows, model(**enc).logits, atol=1e-6, rtol=0)
