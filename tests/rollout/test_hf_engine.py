"""The HF rollout engine: logp_roll is the sampler's true log-prob, padding and cache are right."""

import pytest
import torch

from grpoplus.learner.logprobs import response_logprobs_from_rollouts
from grpoplus.rollout import ENGINES, EngineOptions, HFEngine, SamplingParams
from grpoplus.rollout.sampling import top_p_filter


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_registered_as_hf():
    assert ENGINES.get("hf") is HFEngine


def test_rollout_layout(model, tok, prompts):
    r = HFEngine(model, tok).generate(prompts, SamplingParams(n=3, max_new_tokens=6), prompt_index=[10, 11, 12, 13],
                                      generator=seeded(0))
    assert r.prompt_ids.shape[0] == r.response_ids.shape[0] == 12
    assert r.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert r.prompt_index == [10, 11, 12, 13]
    # Left padding, and the tokenizer's own <bos> on every prompt: "9=" is <bos> 9 = after 4 pads.
    longest = len("100-1=") + 1
    assert r.prompt_ids.shape[1] == longest
    assert r.prompt_mask[9].tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert r.prompt_ids[9, 4].item() == tok.bos_token_id
    assert (r.prompt_ids[9, :4] == tok.pad_token_id).all()
    # Groups are contiguous copies of their prompt.
    assert torch.equal(r.prompt_ids[0], r.prompt_ids[2])
    assert r.logp_roll.dtype == torch.float32 and r.response_mask.dtype == torch.float32
    # Sampled under inference_mode, but returned as ordinary tensors: the learner uses them with grad.
    assert not any(t.is_inference() for t in (r.prompt_ids, r.response_ids, r.response_mask, r.logp_roll))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logp_roll_equals_learner_full_forward(model, tok, prompts, favour_eos, temperature):
    # (a) With top_p = 1 and fp32 the sampler's own log-probs (KV cache, left padding) equal
    # the learner's single full forward over cat(prompt, response), to 1e-5.
    favour_eos(model, 3.0 * temperature)  # responses of different lengths, so right padding is exercised too
    params = SamplingParams(n=4, temperature=temperature, max_new_tokens=12)
    r = HFEngine(model, tok).generate(prompts, params, generator=seeded(1))
    assert 0 < r.finished.sum() < len(r.finished)
    logp, _ = response_logprobs_from_rollouts(model, r, temperature=temperature)
    torch.testing.assert_close(logp, r.logp_roll, atol=1e-5, rtol=0)
    assert (r.logp_roll[r.response_mask == 0] == 0).all()


def test_top_p_logp_is_renormalised_nucleus_prob(model, tok, prompts):
    # (b) Under top_p < 1 logp_roll is log(p_tok / sum of the nucleus), the nucleus being the
    # smallest most-likely-first set with mass >= top_p; recomputed here row by row.
    temperature, top_p = 1.3, 0.3
    r = HFEngine(model, tok).generate(prompts[:2], SamplingParams(n=2, temperature=temperature, top_p=top_p,
                                                                  max_new_tokens=5), generator=seeded(2))
    for i in range(r.response_ids.shape[0]):
        prompt = r.prompt_ids[i][r.prompt_mask[i].bool()].tolist()
        for t in range(r.response_ids.shape[1]):
            ids = torch.tensor([prompt + r.response_ids[i, :t].tolist()])
            with torch.no_grad():
                probs = (model(ids).logits[0, -1] / temperature).softmax(-1).double()
            nucleus, mass = [], 0.0
            for j in probs.argsort(descending=True).tolist():
                nucleus.append(j)
                mass += probs[j].item()
                if mass >= top_p:
                    break
            token = r.response_ids[i, t].item()
            assert token in nucleus
            expected = torch.log(probs[token] / probs[nucleus].sum()).item()
            assert abs(r.logp_roll[i, t].item() - expected) < 1e-5


def test_top_p_filter_keeps_smallest_set_reaching_top_p():
    # probs 0.5, 0.3, 0.2: top_p 0.8 keeps {0.5, 0.3} (mass 0.8 >= 0.8), renormalised 5/8, 3/8.
    logp = torch.tensor([[0.3, 0.5, 0.2]]).log()
    out = top_p_filter(logp, 0.8).exp()
    torch.testing.assert_close(out, torch.tensor([[3 / 8, 5 / 8, 0.0]]))
    # top_p 0.4 keeps only the argmax.
    torch.testing.assert_close(top_p_filter(logp, 0.4).exp(), torch.tensor([[0.0, 1.0, 0.0]]))


def test_output_independent_of_batch_neighbours(model, tok, prompts):
    # (c) Greedy output of a prompt is the same alone and next to longer / shorter prompts.
    engine = HFEngine(model, tok)
    params = SamplingParams(n=1, greedy=True, max_new_tokens=8)
    together = engine.generate(prompts, params)
    for i, prompt in enumerate(prompts):
        alone = engine.generate([prompt], params)
        assert together.texts[i] == alone.texts[0]
        width = alone.response_ids.shape[1]
        assert torch.equal(together.response_ids[i, :width], alone.response_ids[0])
        torch.testing.assert_close(together.logp_roll[i, :width], alone.logp_roll[0], atol=1e-5, rtol=0)


def test_greedy_equals_model_generate(model, tok, prompts, favour_eos):
    # (d) Same tokens as transformers' own greedy generate (which stops at EOS and pads after it).
    favour_eos(model, 4.5)
    r = HFEngine(model, tok).generate(prompts, SamplingParams(n=1, greedy=True, max_new_tokens=10))
    enc = tok(prompts, padding=True, return_tensors="pt")
    ref = model.generate(**enc, do_sample=False, max_new_tokens=10)[:, enc["input_ids"].shape[1]:]
    ours = torch.where(r.response_mask.bool(), r.response_ids, tok.pad_token_id)
    width = max(ref.shape[1], ours.shape[1])
    pad = lambda x: torch.nn.functional.pad(x, (0, width - x.shape[1]), value=tok.pad_token_id)  # noqa: E731
    assert torch.equal(pad(ours), pad(ref))
    assert r.finished.any()  # the comparison covered EOS handling


def test_eos_ends_response_and_cut_rows_are_unfinished(model, tok, prompts, favour_eos):
    # (e) EOS is the last response token (mask 1); later columns are padding with mask 0 and logp 0;
    # rows without EOS fill all max_new_tokens columns and have finished False.
    favour_eos(model, 3.0)
    r = HFEngine(model, tok).generate(prompts, SamplingParams(n=8, max_new_tokens=10), generator=seeded(3))
    eos = tok.eos_token_id
    assert r.finished.any() and not r.finished.all()
    for i in range(len(r.texts)):
        n = r.lengths[i].item()
        assert r.response_mask[i, :n].eq(1).all() and r.response_mask[i, n:].eq(0).all()
        assert r.logp_roll[i, n:].eq(0).all() and r.response_ids[i, n:].eq(tok.pad_token_id).all()
        if r.finished[i]:
            assert r.response_ids[i, n - 1].item() == eos
            assert (r.response_ids[i, : n - 1] != eos).all()
            assert "<eos>" not in r.texts[i]
        else:
            assert n == 10 and (r.response_ids[i] != eos).all()
        assert r.texts[i] == tok.decode(r.response_ids[i, :n], skip_special_tokens=True)


def test_loop_stops_when_every_row_has_ended(model, tok, prompts, favour_eos):
    favour_eos(model, 50.0)  # EOS is (almost surely) the first token of every row
    r = HFEngine(model, tok).generate(prompts, SamplingParams(n=2, max_new_tokens=16), generator=seeded(4))
    assert r.response_ids.shape[1] == 1 and r.finished.all() and r.texts == [""] * 8


def test_length_limit_cuts_rows(model, tok, prompts):
    r = HFEngine(model, tok).generate(prompts, SamplingParams(n=2, max_new_tokens=3, greedy=True))
    assert r.response_ids.shape[1] == 3 and not r.finished.any() and r.lengths.tolist() == [3] * 8


def test_same_seed_same_rollouts(model, tok, prompts):
    # (f) Every random draw goes through the given generator.
    engine = HFEngine(model, tok)
    params = SamplingParams(n=3, temperature=1.0, top_p=0.9, max_new_tokens=8)
    a = engine.generate(prompts, params, generator=seeded(5))
    b = engine.generate(prompts, params, generator=seeded(5))
    c = engine.generate(prompts, params, generator=seeded(6))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logp_roll, b.logp_roll)
    assert not torch.equal(a.response_ids, c.response_ids)


def test_max_batch_size_chunks_give_the_same_rollouts(model, tok, prompts, favour_eos):
    favour_eos(model, 3.0)
    params = SamplingParams(n=3, greedy=True, max_new_tokens=8)
    whole = HFEngine(model, tok).generate(prompts, params)
    chunked = HFEngine(model, tok, EngineOptions(max_num_seqs=5)).generate(prompts, params)
    assert torch.equal(whole.response_ids, chunked.response_ids)
    assert torch.equal(whole.finished, chunked.finished)
    torch.testing.assert_close(whole.logp_roll, chunked.logp_roll, atol=1e-5, rtol=0)


def test_packed_weights_unless_told_not_to_and_the_same_rollouts(model, tok, prompts, favour_eos, monkeypatch):
    import grpoplus.rollout.hf as hf

    favour_eos(model, 3.0)
    packs, prefilled_packed = [], []
    real, real_prefill = hf.packed_linears, hf.prefill
    monkeypatch.setattr(hf, "packed_linears", lambda m, rows, dtype, **kw: packs.append(rows) or real(m, rows, dtype, **kw))
    monkeypatch.setattr(hf, "prefill", lambda m, *a: prefilled_packed.append("forward" in vars(m.lm_head))
                        or real_prefill(m, *a))
    params = SamplingParams(n=3, greedy=True, max_new_tokens=8)
    plain = HFEngine(model, tok, EngineOptions(extra={"pack_weights": False})).generate(prompts, params)
    assert packs == [] and prefilled_packed == [False]
    packed = HFEngine(model, tok).generate(prompts, params)
    assert packs == [12]
    assert prefilled_packed[1:] == [torch.backends.mkldnn.is_available()]  # the prompts' prefill too
    assert torch.equal(plain.response_ids, packed.response_ids)
    torch.testing.assert_close(plain.logp_roll, packed.logp_roll, atol=1e-5, rtol=0)


@pytest.mark.parametrize("extra, message", [({"gpu_memory_utilization": 0.5}, "takes only pack_weights"),
                                            ({"pack_weights": "yes"}, "must be true or false")])
def test_engine_kwargs_the_hf_engine_cannot_honour_are_refused(model, tok, extra, message):
    with pytest.raises(ValueError, match=message):
        HFEngine(model, tok, EngineOptions(extra=extra))


def test_fp32_engine_shares_the_learner_and_restores_its_mode(model, tok, prompts):
    engine = HFEngine(model, tok)
    assert engine.model is model
    model.train()
    engine.generate(prompts, SamplingParams(n=1, max_new_tokens=2), generator=seeded(0))
    assert model.training


@pytest.mark.parametrize("pack", [True, False])
def test_a_bf16_engine_samples_in_bf16_close_to_the_bf16_learner(model, tok, prompts, pack):
    # learner.precision=bf16_mixed: the engine decodes under bf16 autocast (on bf16 reordered weights when
    # packing), sharing the float32 master weights; its logp_roll is near the learner's bf16 forward, and the
    # gap to the float32 forward is the bf16 rounding the mismatch metrics show.
    from grpoplus.learner.precision import autocast

    engine = HFEngine(model, tok, EngineOptions(dtype=torch.bfloat16, extra={"pack_weights": pack}))
    assert engine.model is model
    r = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=8), generator=seeded(3))
    assert r.logp_roll.dtype == torch.float32
    real = r.response_mask.bool()
    fp32, _ = response_logprobs_from_rollouts(model, r)
    with autocast("bf16_mixed", "cpu"):
        bf16, _ = response_logprobs_from_rollouts(model, r)
    to_fp32, to_bf16 = (fp32 - r.logp_roll).abs()[real], (bf16 - r.logp_roll).abs()[real]
    assert 1e-4 < to_fp32.max() < 0.5
    assert to_bf16.mean() < to_fp32.mean()


@pytest.mark.parametrize("options, message", [(EngineOptions(dtype=torch.float16), "float32 or bfloat16"),
                                              (EngineOptions(dtype=torch.bfloat16, quantization="int8"),
                                               "learner.precision=fp32")])
def test_engine_dtypes_the_hf_engine_cannot_run_are_refused(model, tok, options, message):
    with pytest.raises(ValueError, match=message):
        HFEngine(model, tok, options)


def test_bf16_rounded_engine_mismatch_and_sync(model, tok, prompts):
    # (g) A bf16-rounded sampler disagrees with the fp32 learner (the mismatch the corrections act
    # on), and sync_weights follows the learner's updates.
    engine = HFEngine(model, tok, EngineOptions(quantization="bf16_rounded"))
    assert engine.model is not model
    params = SamplingParams(n=4, max_new_tokens=8)
    r = engine.generate(prompts, params, generator=seeded(7))
    logp, _ = response_logprobs_from_rollouts(model, r)
    gap = (logp - r.logp_roll).abs()[r.response_mask.bool()]
    assert gap.max() > 1e-4 and gap.max() < 0.5

    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    rounded = lambda p: p.to(torch.bfloat16).float()  # noqa: E731
    assert not all(torch.equal(q, rounded(p)) for p, q in zip(model.parameters(), engine.model.parameters()))
    engine.sync_weights(model, version=1)
    assert all(torch.equal(q, rounded(p)) for p, q in zip(model.parameters(), engine.model.parameters()))
    assert not all(torch.equal(q, p) for p, q in zip(model.parameters(), engine.model.parameters()))


def test_bad_requests_name_the_problem(model, tok, prompts):
    with pytest.raises(ValueError, match="quantization"):
        HFEngine(model, tok, EngineOptions(quantization="fp8"))
    engine = HFEngine(model, tok)
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(prompts, SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(prompts, SamplingParams(temperature=0.0))
    with pytest.raises(ValueError, match="prompt_index"):
        engine.generate(prompts, SamplingParams(), prompt_index=[0])
    with pytest.raises(ValueError, match="prompts"):
        engine.generate([], SamplingParams())
