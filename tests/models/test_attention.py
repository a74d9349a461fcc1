"""Grouped key/value heads on a CPU: no copy per query head, the same outputs and gradients."""

import inspect

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations import sdpa_attention

from grpoplus.models import attention
from grpoplus.models.attention import use_cpu_gqa


def _gqa_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, attn_implementation="sdpa")
    return LlamaForCausalLM(config)


def _loss_and_grads(model):
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding: the mask the SDPA path gets is not None
    model.zero_grad()
    logits = model(input_ids=ids, attention_mask=mask).logits
    loss = (logits[mask.bool()].log_softmax(-1)[:, 3]).sum()
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.fixture
def counted_copies(monkeypatch):
    # transformers' own decision for the test (a model loaded earlier in the process installed grpoplus's), restored after
    monkeypatch.setattr(sdpa_attention, "use_gqa_in_sdpa", attention._ORIGINAL)
    calls = []
    original = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda x, n: calls.append(n) or original(x, n))
    return calls


def test_cpu_gqa_drops_the_copies_and_keeps_outputs_and_gradients(counted_copies):
    model = _gqa_model()
    logits, grads = _loss_and_grads(model)
    assert counted_copies, "transformers' own path copies the heads under a mask (else this test proves nothing)"
    counted_copies.clear()
    use_cpu_gqa()
    gqa_logits, gqa_grads = _loss_and_grads(model)
    assert counted_copies == []
    torch.testing.assert_close(gqa_logits, logits, rtol=0, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(gqa_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_other_devices_keep_transformers_decision(counted_copies):
    original = attention._ORIGINAL
    use_cpu_gqa()
    key = torch.empty(1, 2, 5, 8, device="meta")
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool, device="meta")
    # transformers 5.6 (the oldest allowed) decides from (mask, key), later ones from (mask, key, value)
    args = (mask, key, key)[:len(inspect.signature(original).parameters)]
    assert sdpa_attention.use_gqa_in_sdpa(*args) is original(*args)
    cpu_key = torch.empty(1, 2, 5, 8)
    assert sdpa_attention.use_gqa_in_sdpa(mask, cpu_key, cpu_key) is True
    assert sdpa_attention.use_gqa_in_sdpa(mask, cpu_key) is True  # as transformers 5.6 calls it
