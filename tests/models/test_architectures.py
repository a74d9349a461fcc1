"""The architecture matrix: every family of grpoplus.models.families (tiny, randomly initialised, fp32, built from
transformers' own config classes) on every path of the learner and the hf engine.

The models are initialised sharply (initializer_range 0.5): near-uniform logits would hide a wrong row's state, a
leaked padding token or a missing soft-cap. Each family's distinguishing layers run: linear attention, Mamba and
short-convolution states beside full attention, sliding and chunked windows shorter than the prompts, experts,
multi-head latent attention.
"""

import importlib.util

import pytest
import torch

from grpoplus.config import build_config
from grpoplus.dryrun import dry_run
from grpoplus.learner.activation_checkpointing import checkpointed_layers, require_checkpointable
from grpoplus.learner.logprobs import HEAD_MODEL_TYPES, chunked_head, response_logprobs
from grpoplus.learner.packing import PACKED_MODEL_TYPES, check_packing
from grpoplus.learner.replay import check_replay, moe_spec
from grpoplus.loop.driver import train
from grpoplus.models.families import FAMILIES, VLLM, tiny_family_model
from grpoplus.models.load import builtin_family, is_builtin, load_hf_dir, load_policy
from grpoplus.models.routing import record_routing, replay_routing
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.rollout import SamplingParams
from grpoplus.rollout.hf import decode
from grpoplus.sft.warmstart import build_warmstart

SHARP = 0.5  # initializer_range
# fp32 rounding of logits of this magnitude (measured at most 4e-5 over the matrix): a wrong row's state or a leaked
# padding token moves them by whole units
TOL = 2e-4
PROMPTS = ["3+4=", "19-2+1=", "5="]
REPLAYED = {"qwen3_moe", "qwen3_next", "qwen3_5_moe_text"}  # MoE families whose router routing replay drives
G = 4


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tok):
    return request.param, tiny_family_model(tok, request.param, initializer_range=SHARP)


def _prompts(tok):
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    return enc.input_ids, enc.attention_mask


def _sample(model, tok, max_new_tokens=14):
    """G rows per prompt (one prefill per prompt, copied to its rows); a quarter of the ids end a row, so rows end
    at different steps and the finished ones are pruned from the batch."""
    ids, mask = _prompts(tok)
    stop = torch.arange(3, 3 + len(tok) // 4)
    tokens, rmask, logp, finished = decode(model, ids, mask, torch.full((len(PROMPTS),), G),
                                           SamplingParams(n=G, max_new_tokens=max_new_tokens), stop, tok.pad_token_id,
                                           torch.Generator().manual_seed(0))
    rows = torch.arange(len(PROMPTS)).repeat_interleave(G)
    return ids[rows], mask[rows], tokens.clone(), rmask.clone(), logp.clone(), finished


def test_a_left_padded_row_equals_the_row_alone(family, tok):
    name, model = family
    ids = torch.randint(3, len(tok), (2, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :4], ids[1, :4] = 0, tok.pad_token_id
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
        alone = model(input_ids=ids[1:, 4:]).logits
    torch.testing.assert_close(padded[1, 4:], alone[0], atol=TOL, rtol=0)


def test_the_hf_engine_samples_and_its_logp_roll_is_the_learners(family, tok):
    name, model = family
    ids, mask, tokens, rmask, logp_roll, finished = _sample(model, tok)
    lengths = rmask.sum(1)
    assert finished.sum() >= len(finished) // 2 and len(set(lengths.tolist())) > 2  # rows ended apart: pruned
    for share in (True, False):  # each distinct prompt once in the learner's forward, or row by row
        with torch.no_grad():
            logp, _ = response_logprobs(model, ids, mask, tokens, rmask, share_prompts=share)
        torch.testing.assert_close(logp * rmask, logp_roll * rmask, atol=TOL, rtol=0)


def test_the_chunked_head_is_used_exactly_where_it_equals_the_models_logits(family, tok):
    name, model = family
    ids, mask, tokens, rmask, *_ = _sample(model, tok, max_new_tokens=6)
    with torch.no_grad():
        fast, _ = response_logprobs(model, ids, mask, tokens, rmask)
        hook = model.lm_head.register_forward_hook(lambda module, inputs, out: out)  # a hooked head: the logits path
        try:
            assert chunked_head(model) is None
            logits_path, _ = response_logprobs(model, ids, mask, tokens, rmask)
        finally:
            hook.remove()
        h = model.model(input_ids=ids[:1], use_cache=False).last_hidden_state
        plain = torch.equal(model.lm_head(h), model(input_ids=ids[:1]).logits)  # no scale or soft-cap after the head
    assert (chunked_head(model) is not None) == (name in HEAD_MODEL_TYPES)
    assert name not in HEAD_MODEL_TYPES or plain, f"{name} is on the chunked-head path but its logits are not lm_head(h)"
    torch.testing.assert_close(fast * rmask, logits_path * rmask, atol=TOL, rtol=0)


VERSION_DEPENDENT = {"llama4_text"}
"""Families whose packed forward equals the padded one on some transformers releases only: llama4_text's chunked
attention counts its chunks over the packed sequence on 5.19 (differs) and per row on 5.24 (equal)."""


def test_packed_micro_batches_give_the_padded_numbers_exactly_where_the_architecture_packs(family, tok):
    """Each family is tried packed: those of PACKED_MODEL_TYPES equal the padded forward (log-probs, entropy,
    gradient), every other one differs (a row's recurrent state or chunk count runs into the next) and is refused."""
    name, model = family
    ids, mask, tokens, rmask, *_ = _sample(model, tok, max_new_tokens=10)
    out = []
    for packing in (False, True):
        model.zero_grad(set_to_none=True)
        logp, entropy = response_logprobs(model, ids, mask, tokens, rmask, with_entropy=True, packing=packing,
                                          share_prompts=False)
        (logp * rmask).sum().backward()
        out.append((logp.detach(), entropy, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    model.zero_grad(set_to_none=True)
    (logp, entropy, grads), (logp_p, entropy_p, grads_p) = out
    equal = bool((logp_p - logp).abs().max() < TOL)
    if name in VERSION_DEPENDENT:  # kept off the list: packs on some transformers releases only
        assert name not in PACKED_MODEL_TYPES
    else:
        assert equal == (name in PACKED_MODEL_TYPES), f"{name}: packed equal to padded: {equal}"
    if name not in PACKED_MODEL_TYPES:
        with pytest.raises(ValueError, match=f"^learner.packing=on cannot pack this model: a {name} model is not"):
            check_packing("on", model)
        return
    torch.testing.assert_close(entropy_p, entropy, atol=TOL, rtol=0)
    assert grads.keys() == grads_p.keys() and len(grads) > 0
    for key in grads:
        # rtol 1e-3: the sharp weights' gradients reach ~1 and sum over every token in another order (measured
        # 8e-4 at worst, deepseek_v3's embedding); a leaked row moves them by whole units
        torch.testing.assert_close(grads_p[key], grads[key], atol=1e-4, rtol=1e-3, msg=lambda m, key=key: f"{key}: {m}")


def test_activation_checkpointing_gives_the_same_gradient(family, tok):
    name, model = family
    require_checkpointable(model)
    ids, mask, tokens, rmask, *_ = _sample(model, tok, max_new_tokens=6)
    grads = []
    for enabled in (False, True):
        model.zero_grad(set_to_none=True)
        with checkpointed_layers(model, enabled):
            logp, _ = response_logprobs(model, ids, mask, tokens, rmask)
        (logp * rmask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    model.zero_grad(set_to_none=True)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 0
    for key in grads[0]:
        torch.testing.assert_close(grads[1][key], grads[0][key], atol=1e-4, rtol=1e-4, msg=key)


def test_routing_replay_reproduces_the_recorded_experts_where_the_router_is_supported(family, tok):
    name, model = family
    if moe_spec(model) is None:  # a dense model, or a router replay does not know: refused in one line
        with pytest.raises(ValueError, match=f"^algo.routing_replay=r2 needs a mixture-of-experts policy, but "
                                             f"{type(model).__name__} has no MoE router that replay supports"):
            check_replay("r2", model)
        assert name not in REPLAYED
        return
    assert name in REPLAYED
    ids, mask, tokens, rmask, *_ = _sample(model, tok, max_new_tokens=6)
    inputs = dict(input_ids=torch.cat([ids, tokens], 1), attention_mask=torch.cat([mask, rmask.long()], 1))
    with torch.no_grad(), record_routing(model) as record:
        plain = model(**inputs).logits
    with torch.no_grad(), replay_routing(model, record.routing):
        replayed = model(**inputs).logits
    with torch.no_grad(), replay_routing(model, record.routing.flip(-1).roll(1, 0)):
        other = model(**inputs).logits
    assert torch.equal(plain, replayed) and not torch.allclose(plain, other)


@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs peft: pip install -e '.[lora]'")
def test_lora_finds_the_linear_layers_and_only_the_adapters_train(family, tok):
    from grpoplus.models.lora import add_lora

    name, model = family
    ids, mask, tokens, rmask, *_ = _sample(model, tok, max_new_tokens=4)
    lora = add_lora(tiny_family_model(tok, name, initializer_range=SHARP), 4, 8.0, 0.0, ["all-linear"])
    trainable = {n for n, p in lora.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    logp, _ = response_logprobs(lora, ids, mask, tokens, rmask)
    (logp * rmask).sum().backward()
    assert {n for n, p in lora.named_parameters() if p.grad is not None} <= trainable


def test_two_training_steps_through_the_trainer(family, tok, tmp_path):
    name, model = family
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    cfg = build_config("grpo", overrides=[f"model={tmp_path / 'model'}", f"out={tmp_path / 'run'}", "max_steps=2",
                                          "prompts_per_step=2", "group_size=4", "max_new_tokens=6", "eval_size=2",
                                          "eval_samples=1", "progress=false", "loggers=[]", "doctor_every=0",
                                          "micro_batch_size=8", "num_minibatches=1", "lr=1e-3", "threads=1",
                                          "save_every=0"])
    records = train(cfg)
    steps = [r for r in records if r["step"] > 0 and "loss/total" in r]
    assert len(steps) == 2 and all(torch.isfinite(torch.tensor(r["loss/total"])) for r in steps)


def test_an_architecture_transformers_lacks_is_one_line_before_any_weight(tmp_path, tok):
    (tmp_path / "config.json").write_text('{"model_type": "qwen9_text"}')
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"^model dir .* is a 'qwen9_text' model, an architecture transformers [\d.]+ "
                                         r"does not know: upgrade it \(pip install -U transformers\)"):
        load_policy(str(tmp_path))  # no weights in the dir: the architecture is refused first
    run = dry_run(overrides=[f"model={tmp_path}"])  # the dry run lists it among what this machine lacks
    assert any("'qwen9_text' model" in need for need in run.needs) and run.policy.params is None


def test_a_built_in_tiny_model_of_every_architecture_is_named_tiny_type(tmp_path, monkeypatch):
    assert is_builtin("tiny-qwen3_5_text") and builtin_family("tiny-qwen3_5_text") == "qwen3_5_text"
    with pytest.raises(ValueError, match="^no built-in model 'tiny-qwen9': the built-in tiny models are "
                                         "tiny-moe, tiny-untrained, tiny-vlm and "):
        is_builtin("tiny-qwen9")
    assert dry_run(overrides=["model=tiny-qwen3_5_text"]).policy.params == sum(
        p.numel() for p in tiny_family_model(char_tokenizer(), "qwen3_5_text", size="small").parameters())
    monkeypatch.setenv("GRPOPLUS_CACHE", str(tmp_path))
    path = build_warmstart("arithmetic", size="qwen3_5_text", steps=3, batch_size=4)
    model, _ = load_hf_dir(path, torch.float32)
    assert model.config.model_type == "qwen3_5_text" and model.config.layer_types[-1] == "full_attention"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm: pip install -e '.[vllm]'")
def test_the_vllm_engine_runs_each_architecture_its_table_says_and_refuses_the_others_in_one_line(family, tok):
    from grpoplus.rollout import ENGINES, EngineOptions
    from grpoplus.rollout.base import EngineError

    name, model = family
    if VLLM[name] != "runs":
        with pytest.raises(EngineError, match=f"^rollout engine 'vllm' could not run this {name} model .*; use "
                                              r"rollout.engine=hf") as err:
            ENGINES.get("vllm")(model, tok, EngineOptions(max_model_len=128))
        assert "\n" not in str(err.value)
        return
    engine = ENGINES.get("vllm")(model, tok, EngineOptions(max_model_len=128))
    try:
        r = engine.generate(PROMPTS, SamplingParams(n=G, max_new_tokens=10, seed=0))
    finally:
        engine.close()
    logp, _ = response_logprobs(model, r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
    torch.testing.assert_close(logp * r.response_mask, r.logp_roll * r.response_mask, atol=TOL, rtol=0)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm: pip install -e '.[vllm]'")
def test_a_mixture_of_experts_engine_starts_after_a_dense_one_in_the_same_process(tok):
    # an in-process vLLM engine's model-parallel groups are dropped on close: a dense model's groups have no
    # expert-parallel one, which the next engine's MoE model needs
    from grpoplus.rollout import ENGINES, EngineOptions

    outputs = []
    for name in ("llama", "glm4_moe"):
        engine = ENGINES.get("vllm")(tiny_family_model(tok, name), tok, EngineOptions(max_model_len=128))
        try:
            outputs.append(engine.generate(PROMPTS, SamplingParams(n=G, max_new_tokens=4, seed=0)))
        finally:
            engine.close()
    assert all(r.response_mask.sum() > 0 for r in outputs)
