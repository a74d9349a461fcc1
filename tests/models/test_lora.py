"""LoRA policy: the learner's log-probs and gradients through peft's wrapper, the reference with
adapters off, the sampler's merged weights, and adapter checkpoints."""

import copy

import pytest
import torch

from grpoplus.learner import checkpoint as ckpt
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.models.lora import adapters_off, add_lora, compute_module, merge_into, plain_model
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.rollout import HFEngine, SamplingParams

pytest.importorskip("peft")


pytestmark = pytest.mark.usefixtures("one_thread")


def _lora(dtype=torch.float32, rank=4, seed=0):
    """(the plain model before wrapping, the LoRA policy) with random non-zero B, so adapters change outputs;
    the base weights are the same for every ``seed``, the adapters differ."""
    tok = char_tokenizer()
    base = tiny_model(tok, size="nano", seed=0).to(dtype)
    original = copy.deepcopy(base)
    torch.manual_seed(seed)
    policy = add_lora(base, rank, 2.0 * rank, 0.0, ["all-linear"])
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3)
    return original, policy, tok


def _batch(tok):
    prompts = tok(["12+3=", "7*8-1="], padding=True, padding_side="left", return_tensors="pt")
    response = torch.tensor([[5, 9, 11, 4], [6, 7, 3, 0]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])
    return prompts["input_ids"], prompts["attention_mask"], response, mask


def test_logprobs_and_gradients_match_the_models_own_logits():
    _, policy, tok = _lora(torch.float64)
    p_ids, p_mask, r_ids, r_mask = _batch(tok)
    logp, _ = response_logprobs(policy, p_ids, p_mask, r_ids, r_mask)  # body + chunked head, through peft
    (logp * r_mask).sum().backward()
    got = {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}
    policy.zero_grad()
    # Reference: the peft model's own full logits, log-softmax in float64, gathered at the response tokens.
    ids = torch.cat([p_ids, r_ids], 1)
    attn = torch.cat([p_mask, r_mask.long()], 1)
    logits = policy(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(min=0)).logits
    want = logits[:, p_ids.shape[1] - 1:-1].log_softmax(-1).gather(-1, r_ids[..., None]).squeeze(-1) * r_mask
    (want * r_mask).sum().backward()
    assert torch.allclose(logp, want, atol=1e-12)
    assert got and all(torch.allclose(got[n], p.grad, atol=1e-10) for n, p in policy.named_parameters()
                       if p.requires_grad)
    assert all("lora_" in n for n in got)  # only the adapters train


def test_reference_is_the_base_model_with_adapters_off():
    original, policy, tok = _lora()
    batch = _batch(tok)
    with adapters_off(policy):
        ref, _ = response_logprobs(policy, *batch)
    base, _ = response_logprobs(original, *batch)
    adapted, _ = response_logprobs(policy, *batch)
    assert torch.equal(ref, base)
    assert (ref - adapted).abs().max() > 1e-2  # the adapters are back on after the block


def test_plain_model_shares_the_base_and_merges_exactly():
    _, policy, tok = _lora(torch.float64)
    plain = plain_model(policy)
    inner = compute_module(policy)
    assert plain.model.embed_tokens.weight is inner.model.embed_tokens.weight  # shared, not copied
    q = plain.model.layers[0].self_attn.q_proj
    assert type(q) is torch.nn.Linear and q.weight.data_ptr() != inner.model.layers[0].self_attn.q_proj.weight.data_ptr()
    ids = torch.tensor([[3, 8, 12, 5, 7]])
    assert torch.allclose(plain(input_ids=ids).logits, policy(input_ids=ids).logits, atol=1e-12)
    with torch.no_grad():  # an update of the adapters, then a re-merge
        for name, p in policy.named_parameters():
            if "lora_A" in name:
                p.add_(0.1)
    before = q.weight.clone()
    merge_into(plain, policy)
    first = q.weight.clone()
    merge_into(plain, policy)
    assert not torch.equal(before, first) and torch.equal(first, q.weight)  # recomputed from W: no drift
    assert torch.allclose(plain(input_ids=ids).logits, policy(input_ids=ids).logits, atol=1e-12)


def test_hf_engine_samples_with_the_merged_weights_after_a_sync():
    _, policy, tok = _lora()
    engine = HFEngine(policy, tok)
    prompts = ["12+3=", "7*8-1="]
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.mul_(-1.5)  # the learner's update
    stale = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=6), generator=torch.Generator().manual_seed(1))
    engine.sync_weights(policy, version=1)
    fresh = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=6), generator=torch.Generator().manual_seed(1))
    for r, close in ((stale, False), (fresh, True)):
        learner, _ = response_logprobs(policy, r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
        gap = (learner - r.logp_roll).abs().max()
        assert (gap < 1e-5) == close, gap
    assert fresh.policy_version == 1


def test_adapter_checkpoints_round_trip_and_mismatches_are_clear(tmp_path):
    _, policy, tok = _lora(rank=4, seed=0)
    path = ckpt.save_checkpoint(tmp_path, 3, policy, tok, {"step": 3})
    assert (path / "adapter_model.safetensors").is_file() and not list(path.glob("model*.safetensors"))
    _, other, _ = _lora(rank=4, seed=1)
    adapters = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert not torch.equal(policy.state_dict()[adapters[0]], other.state_dict()[adapters[0]])
    ckpt.load_weights(other, path)
    for (name, a), b in zip(policy.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    _, rank8, _ = _lora(rank=8)
    with pytest.raises(ValueError, match="do not match the model"):
        ckpt.load_weights(rank8, path)
    with pytest.raises(ValueError, match="holds LoRA adapters, not a whole model"):
        ckpt.load_weights(tiny_model(tok, size="nano"), path)
    full = ckpt.save_checkpoint(tmp_path / "full", 1, tiny_model(tok, size="nano"), tok, {})
    with pytest.raises(ValueError, match="holds no LoRA adapters"):
        ckpt.load_weights(other, full)


def test_unknown_target_modules_name_the_linear_layers():
    with pytest.raises(ValueError, match="q_proj"):
        add_lora(tiny_model(char_tokenizer(), size="nano"), 4, 8.0, 0.0, ["attn_proj"])


@pytest.mark.parametrize("override, message", [
    ("lora_rank=-1", "lora_rank must be >= 0"),
    ("lora_dropout=1.0", "0 <= learner.lora_dropout < 1"),
    ("lora_target_modules=[]", "at least one"),
])
def test_bad_lora_settings_are_refused_at_config_time(override, message):
    from grpoplus.config import build_config

    with pytest.raises(ValueError, match=message):
        build_config(overrides=["lora_rank=8", override])


def test_a_moving_reference_is_refused_with_lora():
    from grpoplus.config import build_config

    with pytest.raises(ValueError, match="reference is the base model"):
        build_config("prorl", overrides=["lora_rank=8"])
