"""run.release_memory: freed memory goes back to the system after the rollout and after the update (phases), and
during the backward every few layers with the same gradients (eager)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import grpoplus.learner.trimming as trimming
from grpoplus.assemble import assemble
from grpoplus.assemble.learner import build_learner_plan
from grpoplus.config import build_config
from grpoplus.learner.activation_checkpointing import checkpointed_layers
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.learner.trimming import trimmed_backward
from grpoplus.loop.driver import train_step
from grpoplus.plan import resolve

SMALL = dict(vocab_size=40, hidden_size=32, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def _grads(model, rows, every: int, checkpointed: bool, share: bool, monkeypatch) -> tuple[dict, list[bool]]:
    """Gradients of a weighted log-prob sum, and for each trim whether it ran inside a backward."""
    trims = []
    monkeypatch.setattr(trimming, "give_back_freed_memory",
                        lambda: trims.append(torch._C._current_graph_task_id() != -1))
    model.zero_grad()
    with checkpointed_layers(model, checkpointed), trimmed_backward(model, every):
        logp, _ = response_logprobs(model, *rows, share_prompts=share)
    assert trims == []  # nothing during the forward
    (logp * torch.linspace(-1.0, 2.0, logp.shape[1], dtype=logp.dtype)).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, trims


@pytest.mark.parametrize("checkpointed", [False, True])
@pytest.mark.parametrize("share, every, expected", [(True, 3, 2), (True, 1, 8), (False, 2, 2), (False, 6, 0)])
def test_trims_run_in_the_backward_every_few_layers_with_the_same_gradients(checkpointed, share, every, expected,
                                                                            grouped_rows, monkeypatch):
    # 4 layers; shared prompts run each layer twice (prompts, then responses): 8 layer passes, else 4
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMALL)).double()
    plain, none = _grads(model, grouped_rows(0), 0, checkpointed, share, monkeypatch)
    trimmed, trims = _grads(model, grouped_rows(0), every, checkpointed, share, monkeypatch)
    assert none == [] and trims == [True] * expected
    for name, grad in plain.items():
        assert torch.equal(trimmed[name], grad), name
    assert not any("forward" in vars(m) for m in model.modules())  # layers restored


@pytest.mark.parametrize("mode, every", [("eager", 6), ("phases", 0), ("off", 0)])
def test_only_eager_release_trims_in_the_backward(mode, every):
    torch.manual_seed(0)
    cfg = build_config(overrides=[f"release_memory={mode}"])
    assert build_learner_plan(resolve(cfg).learner, LlamaForCausalLM(LlamaConfig(**SMALL))).trim_every == every


@pytest.mark.parametrize("mode, expected", [("phases", ["rollout", "update"]), ("eager", ["rollout", "update"]),
                                            ("off", [])])
def test_phases_give_back_after_the_rollout_and_on_the_learner_rank_after_the_update(mode, expected, tmp_path,
                                                                                    monkeypatch):
    import grpoplus.distributed.learner as learner_mod
    import grpoplus.loop.driver as driver

    calls = []
    monkeypatch.setattr(driver, "give_back_freed_memory", lambda: calls.append("rollout"))
    monkeypatch.setattr(learner_mod, "give_back_freed_memory", lambda: calls.append("update"))
    cfg = build_config("grpo", overrides=[f"out={tmp_path}", "prompts_per_step=4", "group_size=4", "max_new_tokens=8",
                                          "eval_size=4", "progress=false", "loggers=[]", "doctor_every=0", "threads=1",
                                          f"release_memory={mode}"])
    c = assemble(resolve(cfg))
    try:
        metrics, _ = train_step(c, 1)
    finally:
        c.close()
    assert metrics["optim/grad_norm"] > 0  # the step updated
    assert calls == expected
