"""`grpoplus train` with LoRA adapters on a 4-bit base (learner.quantize): the built-in tiny model's adapters train
while its 4-bit weights stay, the sampler and the learner agree, and a run killed by SIGKILL resumes to the
uninterrupted result (the base re-quantised from the model path)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpoplus.assemble import assemble
from grpoplus.config import build_config
from grpoplus.metrics import read_metrics
from grpoplus.plan import resolve
from grpoplus.trainer import train_step

KILLER = str(Path(__file__).resolve().parents[1] / "killed.py")  # grpoplus train, SIGKILLed after step N

pytest.importorskip("peft")
bnb = pytest.importorskip("bitsandbytes")

SMALL = ["prompts_per_step=8", "group_size=4", "max_new_tokens=8", "eval_size=6", "eval_samples=2",
         "progress=false", "loggers=[]", "doctor_every=0", "micro_batch_size=8", "lora_rank=8", "lora_alpha=16",
         "quantize=nf4"]


def _cli(args: list[str], kill_at: int | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, KILLER, str(kill_at)] if kill_at else [sys.executable, "-m", "grpoplus"]
    return subprocess.run([*cmd, "train", *args], env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=600)


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
        steps = [train_step(cfg, c, step)[0] for step in (1, 2, 3)]
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
    common = ["--preset", "grpo", "--model", nano_dir, "max_steps=5", "save_every=2", "eval_every=2", "threads=1",
              "beta=0.04", *SMALL]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert _cli(["--out", str(straight), *common]).returncode == 0
    run = _cli(["--out", str(killed), *common], kill_at=3)
    assert run.returncode == -9
    resumed = _cli(["--resume", str(killed)])
    assert resumed.returncode == 0, resumed.stderr
    drop = ("time/", "throughput/")
    assert ([{k: v for k, v in r.items() if not k.startswith(drop)} for r in read_metrics(killed)]
            == [{k: v for k, v in r.items() if not k.startswith(drop)} for r in read_metrics(straight)])
    final = [run / "checkpoints" / "step-5" for run in (straight, killed)]
    assert not list(final[0].glob("model*.safetensors"))  # adapters only
    a, b = (load_file(path / "adapter_model.safetensors") for path in final)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
