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
    weights = torch.randn(response_mask.shape, generator=torch.Generator().manual_seed(0))  # any upstream grad

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


@pytest.mark.parametrize("saved_bytes", [0, 1 << 30])  # softmax recomputed in backward / kept from the forward
@pytest.mark.parametrize("chunk_elements", [1, 7 * 11, 1 << 24])  # one row, 7 rows (a ragged last chunk), all
def test_chunked_head_gradient_equals_autograd_in_float64(monkeypatch, chunk_elements, saved_bytes):
    # The head path's custom backward, d hidden = dz W and d W = dz^T h with
    # dz = g (onehot - softmax(z)) / T, equals autograd through the full [M, V] log_softmax.
    monkeypatch.setattr(logprobs_mod, "CHUNK_ELEMENTS", chunk_elements)
    monkeypatch.setattr(logprobs_mod, "SAVED_SOFTMAX_BYTES", saved_bytes)
    gen = torch.Generator().manual_seed(0)
    M, H, V, T = 23, 5, 11, 0.7
    hidden = torch.randn(M, H, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(V, H, dtype=torch.float64, generator=gen, requires_grad=True)
    tokens = torch.randint(0, V, (M,), generator=gen)
    upstream = torch.randn(M, dtype=torch.float64, generator=gen)

    logp, entropy = logprobs_mod.ChunkedHeadLogProb.apply(hidden, weight, tokens, T, True)
    ours = torch.autograd.grad((logp * upstream).sum(), (hidden, weight))
    logp_all = (hidden @ weight.T / T).log_softmax(-1)  # [M, V], the plain computation
    plain = logp_all.gather(-1, tokens[:, None]).squeeze(-1)
    expected = torch.autograd.grad((plain * upstream).sum(), (hidden, weight))
    torch.testing.assert_close(logp, plain, atol=1e-12, rtol=0)
    torch.testing.assert_close(entropy, -(logp_all.exp() * logp_all).sum(-1), atol=1e-12, rtol=0)
    for g, e in zip(ours, expected):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=1e-10)
    assert torch.autograd.gradcheck(lambda h, w: logprobs_mod.ChunkedHeadLogProb.apply(h, w, tokens, T, False)[0],
                                    (hidden, weight))


def test_kept_softmax_survives_a_second_backward(monkeypatch):
    # The kept softmax is consumed in place by the first backward; a second one (retain_graph) recomputes it.
    monkeypatch.setattr(logprobs_mod, "CHUNK_ELEMENTS", 3 * 11)
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(8, 5, generator=gen, requires_grad=True)
    weight = torch.randn(11, 5, generator=gen, requires_grad=True)
    tokens = torch.randint(0, 11, (8,), generator=gen)
    logp, _ = logprobs_mod.ChunkedHeadLogProb.apply(hidden, weight, tokens, 0.9, False)
    first = torch.autograd.grad(logp.sum(), (hidden, weight), retain_graph=True)
    second = torch.autograd.grad(logp.sum(), (hidden, weight))
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def _largest_tensor(fn) -> int:
    """Elements of the largest tensor any aten op creates while ``fn()`` runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    Largest.numel = max(Largest.numel, t.numel())
            return out

    with Largest():
        fn()
    return Largest.numel


@pytest.mark.parametrize("hook", [False, True])
def test_peak_tensor_does_not_grow_with_vocab_times_tokens(monkeypatch, hook):
    # A large-vocabulary toy (V = 20000, H = 8): past the kept softmax's budget the head path's largest tensor is
    # the [V, H] head gradient or one [chunk, V] block, the same for 16 or 64 response tokens per row; the logits
    # path (taken when a hook sits on the head) holds [N, T, V] logits.
    from transformers import LlamaForCausalLM

    from grpoplus.models.tiny import tiny_config

    monkeypatch.setattr(logprobs_mod, "CHUNK_ELEMENTS", 4 * 20000)  # 4 tokens per chunk
    monkeypatch.setattr(logprobs_mod, "SAVED_SOFTMAX_BYTES", 8 * 20000 * 4)  # 8 tokens' softmax: both runs exceed it
    model = LlamaForCausalLM(tiny_config(20000, size="nano", hidden_size=8, num_attention_heads=2,
                                         num_key_value_heads=2, intermediate_size=16))
    if hook:
        model.lm_head.register_forward_hook(lambda mod, inp, out: out)
    gen = torch.Generator().manual_seed(0)

    def largest(T: int) -> int:
        N = 4
        ids = torch.randint(0, 20000, (N, 3 + T), generator=gen)
        masks = torch.ones(N, 3, dtype=torch.long), torch.ones(N, T)
        run = lambda: response_logprobs(model, ids[:, :3], masks[0], ids[:, 3:], masks[1],  # noqa: E731
                                        with_entropy=True)[0].sum().backward()
        return _largest_tensor(run)

    short, long = largest(16), largest(64)
    if hook:
        assert long >= 4 * 64 * 20000  # the test can see [N, T, V] logits when they exist
    else:
        assert short == long <= max(20000 * 8, 4 * 20000)


def test_head_with_a_bias_takes_the_logits_path(setup):
    # A head the chunked path cannot compute (a bias) falls back to the model's own logits,
    # and the result still equals the unpadded row-by-row reference.
    model, *batch = setup
    assert logprobs_mod.chunked_head(model) is model.lm_head
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.normal_()
    model.lm_head = head
    assert logprobs_mod.chunked_head(model) is None
    logp, _ = response_logprobs(model, *batch, temperature=0.9)
    torch.testing.assert_close(logp, reference_logprobs(model, *batch, 0.9), atol=1e-5, rtol=0)
