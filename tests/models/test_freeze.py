"""learner.freeze: the named parameters keep their values through training and get no optimizer state; a name that
matches nothing, or one that freezes everything, is refused in one line."""

import pytest
import torch

from grpoplus.assemble import assemble
from grpoplus.config import build_config
from grpoplus.loop.driver import train_step
from grpoplus.models.freeze import freeze, matches
from grpoplus.models.tiny import tiny_model
from grpoplus.plan import resolve

SMALL = ["prompts_per_step=8", "group_size=4", "max_new_tokens=8", "eval_size=4", "eval_samples=1", "progress=false",
         "loggers=[]", "doctor_every=0", "micro_batch_size=8", "num_minibatches=1", "threads=1"]


def test_a_name_matches_as_whole_dotted_parts_or_as_a_glob():
    assert matches("model.embed_tokens.weight", "embed_tokens") and matches("model.layers.0.mlp.up.weight", "layers.0")
    assert not matches("model.layers.10.mlp.up.weight", "layers.1")  # a part, not a prefix of one
    assert matches("model.layers.3.mlp.up.weight", "model.layers.[0-3].*")
    assert not matches("model.layers.4.mlp.up.weight", "model.layers.[0-3].*")


def test_a_name_that_matches_nothing_or_freezes_everything_is_refused(tok):
    model = tiny_model(tok, size="nano")
    with pytest.raises(ValueError, match=r"^learner.freeze: 'embed_token' matches no parameter .*name a dotted part"):
        freeze(model, ["embed_token"])
    with pytest.raises(ValueError, match="freezes every parameter of the policy: nothing would train"):
        freeze(model, ["*"])


def test_with_lora_the_key_is_refused_before_anything_loads():
    pytest.importorskip("peft", reason="learner.lora_rank needs the lora extra: pip install -e '.[lora]'")
    with pytest.raises(ValueError, match="with learner.lora_rank > 0 the whole base is frozen"):
        build_config(overrides=["lora_rank=4", "freeze=[embed_tokens]"])


def test_frozen_parameters_keep_their_values_and_get_no_optimizer_state(tmp_path):
    cfg = build_config("grpo", overrides=[f"out={tmp_path}", *SMALL, "freeze=[embed_tokens,layers.0]"])
    c = assemble(resolve(cfg))
    try:
        model = c.learner.parts.model
        named = dict(model.named_parameters())
        frozen = {n for n in named if matches(n, "embed_tokens") or matches(n, "layers.0")}
        assert frozen and {n for n, p in named.items() if not p.requires_grad} == frozen
        optimized = {id(p) for group in c.learner.parts.optimizer.param_groups for p in group["params"]}
        assert optimized == {id(p) for n, p in named.items() if n not in frozen}
        before = {n: p.detach().clone() for n, p in named.items()}
        record, _ = train_step(c, 1)
        assert record["optim/grad_norm"] > 0
        assert all(torch.equal(before[n], named[n]) for n in frozen)
        assert any(not torch.equal(before[n], p) for n, p in named.items() if n not in frozen)
    finally:
        c.close()
