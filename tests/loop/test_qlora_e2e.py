"""`grpoplus train` with LoRA adapters on a 4-bit base (learner.quantize): the built-in tiny model's adapters train
while its 4-bit weights stay, the sampler and the learner agree, and a run killed by SIGKILL resumes to the
uninterrupted result (the base re-quantised from the model path)."""

import pytest
import torch

from grpoplus.assemble import assemble
from grpoplus.config import build_config
from grpoplus.loop.driver import train_step
from grpoplus.plan import resolve

from .conftest import assert_adapter_run_resumes_exactly

pytest.importorskip("peft")
bnb = pytest.importorskip("bitsandbytes")

SMALL = ["prompts_per_step=8", "group_size=4", "max_new_tokens=8", "eval_size=6", "eval_samples=2",
         "progress=false", "loggers=[]", "doctor_every=0", "micro_batch_size=8", "lora_rank=8", "lora_alpha=16",
         "quantize=nf4"]


def test_the_adapters_train_on_the_4bit_base_and_the_sampler_agrees_with_the_learner(tmp_path):
    # The built-in tiny model on arithmetic (it solves some problems, so advantages are not all zero); KL to the
    # 4-bit base with its adapters off.
    cfg = build_config("grpo", overrides=[f"out={tmp_path}", "threads=1", *SMALL, "beta=0.04", "num_minibatches=1"])
    c = assemble(resolve(cfg))
    try:
        model = c.learner.parts.model
        four_bit = {n: m.weight.data.clone() for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
        adapters = {n: p for n, p in model.named_parameters() if p.requires_grad}
        assert len(four_bit) == 21 and adapters and all("lora_" in n for n in adapters)
        assert c.learner.parts.ref_model is None and c.learner.plan.reference_adapters_off
        before = {n: p.detach().clone() for n, p in adapters.items()}
        steps = [train_step(c, step)[0] for step in (1, 2, 3)]
        assert any(not torch.equal(before[n], p) for n, p in adapters.items())  # the adapters moved
        assert all(torch.equal(four_bit[n], m.weight.data) for n, m in model.named_modules() if n in four_bit)
        assert steps[0]["loss/kl_ref"] == 0 and any(s["optim/grad_norm"] > 0 for s in steps)  # B = 0: the base
        assert steps[-1]["loss/kl_ref"] > 0  # the updated adapters move the policy away from the 4-bit base
        # the engine samples the learner's own 4-bit module: float32 rounding between the decode's KV cache and
        # the learner's full forward (bf16_mixed: ~1e-2, as for any bf16 sampler)
        assert max(s["mismatch/abs_p_diff_max"] for s in steps) < 1e-4
        assert max(abs(s["mismatch/k3"]) for s in steps) < 1e-6
    finally:
        c.close()


@pytest.mark.slow
def test_qlora_sigkill_then_resume_equals_uninterrupted_run(nano_dir, tmp_path):
    assert_adapter_run_resumes_exactly(nano_dir, tmp_path, SMALL)
