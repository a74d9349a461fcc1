"""ruff is clean on the package, the tests and the benchmarks (rules: pyproject.toml's [tool.ruff])."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed: pip install -e '.[test]'")
    run = subprocess.run([ruff, "check", "--no-cache", "grpoplus", "tests", "benchmarks"], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:]
