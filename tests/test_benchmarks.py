"""Benchmarks that drive the learner's internals directly run against the current code: a small call of each, its
record holding what the benchmark exists to compare (times are never asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _recorded(script: str, args: list[str], folder: Path) -> dict:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args, "--record", str(folder)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    (path,) = folder.glob("*.json")
    return json.loads(path.read_text())


@pytest.mark.slow
def test_the_packing_benchmark_compares_arms_that_compute_the_same_loss(tmp_path):
    figures = _recorded("packing.py", ["--model", "tiny", "--prompts", "2", "--group", "2", "--max-new-tokens", "16",
                                       "--repeats", "1", "--threads", "1"], tmp_path)["figures"]
    arms = figures["arms"]
    assert set(arms) == {"padded+shared", "padded", "packed", "auto"}
    losses = [arm["loss"] for arm in arms.values()]
    assert max(losses) - min(losses) <= 1e-5 * max(1.0, abs(losses[0])), losses
    assert arms["packed"]["pad_frac"] == 0.0 < figures["pad_frac_padded"] == arms["padded"]["pad_frac"]
