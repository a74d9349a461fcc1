"""`grpoplus train` with LoRA adapters on a nano model: only the adapters train, the KL reference is
the model with its adapters off, and a run killed by SIGKILL resumes to the uninterrupted result."""

import pytest
import torch

from grpoplus.assemble import assemble
from grpoplus.config import build_config
from grpoplus.loop.driver import train_step
from grpoplus.plan import resolve

from .conftest import assert_adapter_run_resumes_exactly

pytest.importorskip("peft")

SMALL = ["prompts_per_step=4", "group_size=4", "max_new_tokens=10", "eval_size=6", "eval_samples=2",
         "progress=false", "loggers=[]", "doctor_every=0", "micro_batch_size=8", "lora_rank=4", "lora_alpha=8"]


def test_only_the_adapters_train_and_the_reference_is_the_base_model(tmp_path):
    # The built-in tiny model on arithmetic: it solves some problems, so advantages are not all zero.
    cfg = build_config("grpo", overrides=[f"out={tmp_path}", "threads=1", *SMALL, "beta=0.04", "num_minibatches=1",
                                          "max_new_tokens=8", "prompts_per_step=8"])
    c = assemble(resolve(cfg))
    try:
        parts = c.learner.parts
        trained = {id(p) for group in parts.optimizer.param_groups for p in group["params"]}
        adapters = {n: p for n, p in parts.model.named_parameters() if p.requires_grad}
        assert trained == {id(p) for p in adapters.values()} and all("lora_" in n for n in adapters)
        assert parts.ref_model is None and c.learner.plan.reference_adapters_off  # no second copy of the model
        frozen = {n: p.detach().clone() for n, p in parts.model.named_parameters() if not p.requires_grad}
        before = {n: p.detach().clone() for n, p in adapters.items()}
        first, _ = train_step(c, 1)
        assert first["optim/grad_norm"] > 0 and first["loss/kl_ref"] == 0  # B = 0: the policy is the base model
        assert any(not torch.equal(before[n], p) for n, p in adapters.items())
        second, _ = train_step(c, 2)
        assert second["loss/kl_ref"] > 0  # the updated adapters move the policy away from the base
        assert all(torch.equal(frozen[n], p) for n, p in parts.model.named_parameters() if not p.requires_grad)
    finally:
        c.close()


@pytest.mark.slow
def test_lora_sigkill_then_resume_equals_uninterrupted_run(nano_dir, tmp_path):
    assert_adapter_run_resumes_exactly(nano_dir, tmp_path, SMALL)


@pytest.mark.parametrize("extra", [["data_parallel=2", "micro_batch_size=8"], ["max_staleness=1"]])
def test_lora_with_scale_out_is_refused_in_one_line(extra):
    with pytest.raises(ValueError, match="trains in one process for now"):
        build_config("grpo", overrides=["lora_rank=8", *extra])
