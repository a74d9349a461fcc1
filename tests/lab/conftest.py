"""Fake finished runs for the lab's tests: real config.yaml, synthetic metrics.jsonl / samples.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpoplus.lab.measures import LabRun


def write_run(path: Path, records: list[dict], config: dict | None = None, samples: list[dict] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if samples is not None:
        (path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    if config is not None:
        import yaml

        (path / "config.yaml").write_text(yaml.safe_dump(config))
    return path


def lab_run(tmp_path: Path, records: list[dict], arm: str = "a", seed: int = 0, config: dict | None = None,
            samples: list[dict] | None = None) -> LabRun:
    path = write_run(tmp_path / f"{arm}-s{seed}", records, config, samples)
    return LabRun(arm, seed, path, records, config or {})


@pytest.fixture
def make_run(tmp_path):
    return lambda records, **kw: lab_run(tmp_path, records, **kw)
