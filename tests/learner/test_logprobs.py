"""response_logprobs: right positions, memory chunking changes nothing, gradient is exact."""

import pytest
import torch

import grpoplus.learner.logprobs as logprobs_mod
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer


@pytest.fixture
def setup():
    """A nano model and a hand-made batch: 3 left-padded prompts, right-padded responses of lengths 4, 2, 0."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=1)
    with torch.no_grad():  # sharper attention, so a wrong position or mask shows above 1e-5
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(6.0)
            layer.self_attn.k_proj.weight.mul_(6.0)
    enc = tok(["12+3=", "7=", "100-9="], padding=True, return_tensors="pt")
    responses = ["15<", "8", ""]
    T = 4
    response_ids = torch.full((3, T), tok.pad_token_id)
    response_mask = torch.zeros(3, T)
    for i, text in enumerate(responses):
        ids = tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if text else [])
        response_ids[i, : len(ids)] = torch.tensor(ids)
        response_mask[i, : len(ids)] = 1
    yield model, enc["input_ids"], enc["attention_mask"], response_ids, response_mask
    torch.set_num_threads(threads)


def reference_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature):
    """Row by row, no padding at all: log_softmax(logits / T) of the unpadded sequence, gathered."""
    rows = []
    for i in range(prompt_ids.shape[0]):
        prompt = prompt_ids[i][prompt_mask[i].bool()]
        n = int(response_mask[i].sum())
        seq = torch.cat([prompt, response_ids[i, :n]])[None]
        logp_all = (model(seq).logits[0, len(prompt) - 1: len(prompt) - 1 + n] / temperature).log_softmax(-1)
        row = logp_all.gather(-1, response_ids[i, :n, None]).squeeze(-1)
        rows.append(torch.cat([row, row.new_zeros(response_ids.shape[1] - n)]))
    return torch.stack(rows)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_equals_unpadded_row_by_row_computation(setup, temperature):
    model, *batch = setup
    logp, entropy = response_logprobs(model, *batch, temperature=temperature, with_entropy=True)
    expected = reference_logprobs(model, *batch, temperature)
    torch.testing.assert_close(logp, expected, atol=1e-5, rtol=0)
    assert logp[2].eq(0).all() and logp[1, 2:].eq(0).all()  # zero where response_mask is 0
    assert entropy.shape == logp.shape and (entropy[0] > 0).all()


def test_entropy_matches_definition(setup):
    model, prompt_ids, prompt_mask, response_ids, response_mask = setup
    _, entropy = response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask,
                                   temperature=0.8, with_entropy=True)
    # Row 0: prompt "<bos>12+3=" (6 tokens, 1 pad column); the logit at column 6 + t - 1 predicts token t.
    seq = torch.cat([prompt_ids[0, 1:], response_ids[0]])[None]
    with torch.no_grad():
        probs = (model(seq).logits[0, 5:9] / 0.8).softmax(-1)
    torch.testing.assert_close(entropy[0], -(probs * probs.log()).sum(-1), atol=1e-5, rtol=0)


def test_chunked_and_micro_batched_equal_unchunked(setup, monkeypatch):
    model, *batch = setup
    whole, ent_whole = response_logprobs(model, *batch, temperature=0.7, with_entropy=True)
    monkeypatch.setattr(logprobs_mod, "CHUNK_ELEMENTS", 1)  # one row per softmax chunk
    chunked, ent_chunked = response_logprobs(model, *batch, temperature=0.7, with_entropy=True)
    micro, _ = response_logprobs(model, *batch, temperature=0.7, micro_batch_size=1)
    torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent_chunked, ent_whole, atol=1e-6, rtol=0)
    torch.testing.assert_close(micro, whole, atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk_elements", [1, 1 << 24])
def test_gradient_matches_plain_log_softmax(setup, monkeypatch, chunk_elements):
    # (h) The chunked custom backward gives the same parameter gradient as autograd through
    # log_softmax(logits / T).gather(...) on the full [N, T, V] tensor.
    model, prompt_ids, prompt_mask, response_ids, response_mask = setup
    monkeypatch.setattr(logprobs_mod, "CHUNK_ELEMENTS", chunk_elements)
    weights = torch.randn(response_mask.shape)  # an arbitrary upstream gradient

    def grads(logp):
        model.zero_grad()
        (logp * weights).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    ours = grads(response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=0.7)[0])
    input_ids = torch.cat([prompt_ids, response_ids], 1)
    mask = torch.cat([prompt_mask, response_mask.long()], 1)
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    P, T = prompt_ids.shape[1], response_ids.shape[1]
    plain = (logits[:, P - 1: P + T - 1] / 0.7).log_softmax(-1).gather(-1, response_ids[..., None]).squeeze(-1)
    expected = grads(plain * response_mask)
    for g, e in zip(ours, expected):
        torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-4)
    assert any(g.abs().sum() > 0 for g in ours)


def test_mismatched_shapes_are_rejected(setup):
    model, prompt_ids, prompt_mask, response_ids, response_mask = setup
    with pytest.raises(ValueError, match="equal shapes"):
        response_logprobs(model, prompt_ids, prompt_mask[:, 1:], response_ids, response_mask)
    with pytest.raises(ValueError, match="rows"):
        response_logprobs(model, prompt_ids[:2], prompt_mask[:2], response_ids, response_mask)
    with pytest.raises(ValueError, match="temperature"):
        response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=0)
