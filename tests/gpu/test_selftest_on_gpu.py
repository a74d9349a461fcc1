"""Every check of ``grpoplus selftest`` passes on a CUDA device (``pytest -m gpu``; skipped without one)."""

import importlib.util

import pytest
import torch

from grpoplus.selftest import CHECKS
from grpoplus.selftest.runner import Context, run_one

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", [c.name for c in CHECKS if c.name != "main_job"])
def test_the_check_passes_on_the_gpu(name, tmp_path):
    result = run_one(next(c for c in CHECKS if c.name == name), Context(torch.device("cuda"), tmp_path, quick=True))
    if name == "lora" and importlib.util.find_spec("peft") is None:
        assert result.status == "skip"
        return
    assert result.status == "pass", result.line()
    assert result.peak_mb is not None and result.peak_mb > 0  # measured on the device


def test_the_quick_main_job_raises_accuracy_on_the_gpu(tmp_path):
    result = run_one(next(c for c in CHECKS if c.name == "main_job"), Context(torch.device("cuda"), tmp_path, quick=True))
    assert result.status == "pass", result.line()
