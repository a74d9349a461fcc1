"""A bf16 decode of float32 weights through a bf16 copy of the linear weights (the hf engine's default on a GPU,
``rollout.engine_kwargs.cast_weights``): the rollouts of autocast over the float32 weights, bit for bit, with the
copy refreshed in place at each sync."""

import pytest
import torch

from grpoplus.rollout import EngineOptions, HFEngine, SamplingParams


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def bf16_engine(model, tok, cast: bool | str) -> HFEngine:
    # no oneDNN copy: the CPU's own bf16 path, which the GPU's decode mirrors
    return HFEngine(model, tok, EngineOptions(dtype=torch.bfloat16, extra={"pack_weights": False, "cast_weights": cast}))


def test_the_bf16_copy_samples_what_autocast_over_fp32_weights_samples(model, tok, prompts, favour_eos):
    favour_eos(model, 2.0)  # rows end at different steps
    params = SamplingParams(n=3, max_new_tokens=12)
    plain, cast = bf16_engine(model, tok, False), bf16_engine(model, tok, True)
    assert plain.model is model and cast.model is not model
    a, b = plain.generate(prompts, params, generator=seeded(1)), cast.generate(prompts, params, generator=seeded(1))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logp_roll, b.logp_roll)
    assert 0 < a.finished.sum() < len(a.finished)


def test_only_the_linear_weights_are_copied(model, tok):
    sampler = bf16_engine(model, tok, True).model
    assert model.config.tie_word_embeddings
    assert sampler.lm_head.weight.dtype == torch.bfloat16  # the tied head gets its own copy ...
    assert sampler.model.embed_tokens.weight is model.model.embed_tokens.weight  # ... the embedding stays the policy's
    assert sampler.model.norm.weight is model.model.norm.weight
    layer, own = sampler.model.layers[0], model.model.layers[0]
    assert layer.mlp.up_proj.weight.dtype == torch.bfloat16 and own.mlp.up_proj.weight.dtype == torch.float32
    assert torch.equal(layer.mlp.up_proj.weight, own.mlp.up_proj.weight.to(torch.bfloat16))


def test_a_sync_refreshes_the_copy_in_place(model, tok, prompts):
    engine = bf16_engine(model, tok, True)
    copy_weight = engine.model.model.layers[0].self_attn.q_proj.weight
    address = copy_weight.data_ptr()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine.sync_weights(model, version=1)
    assert engine.model.model.layers[0].self_attn.q_proj.weight.data_ptr() == address  # a captured graph's address
    assert torch.equal(copy_weight, model.model.layers[0].self_attn.q_proj.weight.to(torch.bfloat16))
    params = SamplingParams(n=2, max_new_tokens=6)
    fresh = bf16_engine(model, tok, False).generate(prompts, params, generator=seeded(2))
    assert torch.equal(engine.generate(prompts, params, generator=seeded(2)).response_ids, fresh.response_ids)


def test_auto_casts_on_a_gpu_only_and_never_in_float32(model, tok):
    assert bf16_engine(model, tok, "auto").model is model  # a CPU: oneDNN's reordered copy does this work
    assert HFEngine(model, tok, EngineOptions(extra={"cast_weights": True})).model is model  # a float32 decode


def test_a_bad_cast_weights_is_refused_in_one_line(model, tok):
    with pytest.raises(ValueError, match="cast_weights must be auto, true or false"):
        bf16_engine(model, tok, "yes")
