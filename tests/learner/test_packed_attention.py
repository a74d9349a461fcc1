"""learner.packed_attention: a packed forward under flex attention (a block mask of each row's span, no [S, S] mask)
gives the padded forward's numbers; a kernel that fails is said once and the model's own attention takes over."""

import pytest
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import grpoplus.learner.packing as packing_mod
from grpoplus.config import build_config
from grpoplus.config.rules import ConfigError
from grpoplus.learner.entropy import response_logprobs_and_entropy
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.learner.packing import layer_flops, packed_attention, packing_pays
from grpoplus.models.tiny import tiny_model
from grpoplus.plan import resolve

from .test_packing import _grads, _rows


@pytest.fixture
def attention_calls(monkeypatch):
    """The attention implementations the layers ran, one entry per call."""
    calls = []
    for name in ("sdpa", "flex_attention"):
        inner = ALL_ATTENTION_FUNCTIONS[name]

        def counted(*args, _inner=inner, _name=name, **kwargs):
            calls.append(_name)
            return _inner(*args, **kwargs)

        monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, name, counted)
    monkeypatch.setattr(packing_mod, "FAILED_ATTENTION", set())
    return calls


@pytest.mark.parametrize("head", ["chunked head", "model logits"])
@torch.no_grad()  # flex attention has no backward on a CPU: the gradients are checked on a GPU (tests/gpu)
def test_a_packed_forward_under_flex_attention_equals_the_padded_one(tok, head, attention_calls):
    model = tiny_model(tok, size="nano", seed=0)
    if head == "model logits":  # a hooked head takes the logits path
        model.lm_head.register_forward_hook(lambda module, inputs, out: out)
    rows = _rows(tok)
    logp, entropy = response_logprobs(model, *rows, with_entropy=True, share_prompts=False)
    assert set(attention_calls) == {"sdpa"}
    attention_calls.clear()
    logp_f, entropy_f = response_logprobs(model, *rows, with_entropy=True, packing=True,
                                          packed_attention="flex_attention")
    assert attention_calls and set(attention_calls) == {"flex_attention"}
    assert model.config._attn_implementation == "sdpa"  # the model's own again after the packed forward
    torch.testing.assert_close(logp_f, logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy_f, entropy, atol=1e-5, rtol=0)
    assert (logp_f[rows[3] == 0] == 0).all()


@torch.no_grad()
def test_the_entropy_bonus_forward_packs_under_flex_attention(tok, attention_calls):
    model = tiny_model(tok, size="nano", seed=0)
    rows = _rows(tok, seed=1)
    plain = response_logprobs_and_entropy(model, *rows, temperature=0.7)
    flex = response_logprobs_and_entropy(model, *rows, temperature=0.7, packing=True, packed_attention="flex_attention")
    assert "flex_attention" in attention_calls
    for a, b in zip(plain, flex):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)


def test_a_packed_attention_that_fails_is_said_once_and_the_models_own_takes_over(tok, monkeypatch, capsys,
                                                                                   attention_calls):
    def broken(*args, **kwargs):
        raise RuntimeError("the kernel did not compile\nits long trace")

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "flex_attention", broken)
    model = tiny_model(tok, size="nano", seed=0)
    rows = _rows(tok)
    logp, _, _ = _grads(model, rows, packing=True)
    for _ in range(2):  # the second never tries it again
        logp_f, _, _ = _grads(model, rows, packing=True, packed_attention="flex_attention")
        torch.testing.assert_close(logp_f, logp, atol=0, rtol=0)  # the model's own packed forward, the same numbers
    err = capsys.readouterr().err
    assert err == ("grpoplus: note: the packed forward under flex_attention failed (RuntimeError: the kernel did not "
                   "compile); packed forwards use the model's own attention from now on\n")
    assert model.config._attn_implementation == "sdpa"


def test_which_attention_a_packed_forward_runs_under(tok):
    model = tiny_model(tok, size="nano")
    assert packed_attention("auto", model, "auto") is None  # a CPU keeps the model's own
    assert packed_attention("model", model, True) is None
    assert packed_attention("flex_attention", model, False) is None  # never packs: nothing to switch
    with pytest.raises(ValueError, match=r"^learner.packed_attention=flex_attention needs a GPU: PyTorch's flex "
                                         r"attention has no backward on a CPU .*; set learner.packed_attention=auto or model$"):
        packed_attention("flex_attention", model, True)
    with pytest.raises(ValueError, match=r"^learner.packed_attention='flash' is not one of auto, model, flex_attention$"):
        packed_attention("flash", model, True)
    # what it decides for a policy on a GPU, without one: the device of its first parameter is all it reads
    model.parameters = lambda: iter([type("OnGPU", (), {"device": torch.device("cuda")})()])
    assert packed_attention("auto", model, "auto") == "flex_attention"
    assert packed_attention("flex_attention", model, True) == "flex_attention"


def test_flex_attention_scores_each_rows_block_only_in_the_packing_estimate(tok):
    model = tiny_model(tok, size="nano")
    assert not layer_flops(model)[2] and layer_flops(model, "flex_attention")[2]
    # 4 long rows of nearly equal length: a [S, S] block mask scores every pair of their tokens, about 4x what padding
    # them scores; flex attention scores each row's own block, less than padding, and packing drops the padding
    n, p, t = 4, 8, 4000
    prompt_mask = torch.ones(n, p, dtype=torch.long)
    response_mask = torch.zeros(n, t, dtype=torch.long)
    response_mask[0] = 1
    response_mask[1:, :3900] = 1
    prompt_ids = torch.arange(n * p).reshape(n, p)
    assert not packing_pays(model, prompt_ids, prompt_mask, response_mask, False)
    assert packing_pays(model, prompt_ids, prompt_mask, response_mask, False, attention="flex_attention")


def test_the_config_names_the_packed_attention_and_refuses_it_without_packing_or_a_gpu():
    assert resolve(build_config("grpo", overrides=["packed_attention=flex_attention", "device=cuda"])
                   ).learner.update.packed_attention == "flex_attention"
    assert resolve(build_config("grpo")).learner.update.packed_attention == "auto"
    with pytest.raises(ConfigError, match=r"^learner.packed_attention=flex_attention is the attention of packed forwards, "
                                          r"but learner.packing=off never packs: "):
        build_config("grpo", overrides=["packed_attention=flex_attention", "packing=off", "device=cuda"])
    with pytest.raises(ConfigError, match=r"^learner.packed_attention=flex_attention needs a GPU \(learner.device=cpu\): "):
        build_config("grpo", overrides=["packed_attention=flex_attention"])
