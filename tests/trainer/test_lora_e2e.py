"""`grpoplus train` with LoRA adapters on a nano model: only the adapters train, the KL reference is
the model with its adapters off, and a run killed by SIGKILL resumes to the uninterrupted result."""

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

SMALL = ["prompts_per_step=4", "group_size=4", "max_new_tokens=10", "eval_size=6", "eval_samples=2",
         "progress=false", "loggers=[]", "doctor_every=0", "micro_batch_size=8", "lora_rank=4", "lora_alpha=8"]



def _cli(args: list[str], kill_at: int | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, KILLER, str(kill_at)] if kill_at else [sys.executable, "-m", "grpoplus"]
    return subprocess.run([*cmd, "train", *args], env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=600)


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
        first, _ = train_step(cfg, c, 1)
        assert first["optim/grad_norm"] > 0 and first["loss/kl_ref"] == 0  # B = 0: the policy is the base model
        assert any(not torch.equal(before[n], p) for n, p in adapters.items())
        second, _ = train_step(cfg, c, 2)
        assert second["loss/kl_ref"] > 0  # the updated adapters move the policy away from the base
        assert all(torch.equal(frozen[n], p) for n, p in parts.model.named_parameters() if not p.requires_grad)
    finally:
        c.close()


@pytest.mark.slow
def test_lora_sigkill_then_resume_equals_uninterrupted_run(nano_dir, tmp_path):
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


@pytest.mark.parametrize("extra", [["data_parallel=2", "micro_batch_size=8"], ["max_staleness=1"]])
def test_lora_with_scale_out_is_refused_in_one_line(extra):
    with pytest.raises(ValueError, match="trains in one process for now"):
        build_config("grpo", overrides=["lora_rank=8", *extra])
