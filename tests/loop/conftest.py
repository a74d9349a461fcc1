"""Helpers of the whole-run tests: ``grpoplus train`` in a child process (optionally SIGKILLed after a step), and the
exact-resume check the adapter runs share."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from grpoplus.metrics import read_metrics

KILLER = str(Path(__file__).resolve().parents[1] / "killed.py")  # grpoplus train, SIGKILLed after step N


def cli(args: list[str], kill_at: int | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, KILLER, str(kill_at)] if kill_at else [sys.executable, "-m", "grpoplus"]
    return subprocess.run([*cmd, "train", *args], env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=600)


def assert_adapter_run_resumes_exactly(nano_dir: str, tmp_path: Path, small: list[str]) -> None:
    """A 5-step adapter run SIGKILLed after step 3 and resumed logs what the uninterrupted run logs, and saves the
    same adapters (adapters only, no model weights)."""
    common = ["--preset", "grpo", "--model", nano_dir, "max_steps=5", "save_every=2", "eval_every=2", "threads=1",
              "beta=0.04", *small]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert cli(["--out", str(straight), *common]).returncode == 0
    run = cli(["--out", str(killed), *common], kill_at=3)
    assert run.returncode == -9
    resumed = cli(["--resume", str(killed)])
    assert resumed.returncode == 0, resumed.stderr
    drop = ("time/", "throughput/")
    assert ([{k: v for k, v in r.items() if not k.startswith(drop)} for r in read_metrics(killed)]
            == [{k: v for k, v in r.items() if not k.startswith(drop)} for r in read_metrics(straight)])
    final = [run / "checkpoints" / "step-5" for run in (straight, killed)]
    assert not list(final[0].glob("model*.safetensors"))  # adapters only
    a, b = (load_file(path / "adapter_model.safetensors") for path in final)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
