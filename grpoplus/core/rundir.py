"""The run directory: the one module that knows its layout.

```
RUN/
  config.yaml          the resolved config
  plan/                what the run decided from it, a YAML file per part (grpoplus.plan.files; the dry run prints them)
  metrics.jsonl        one JSON object per step
  samples.jsonl        a few completions per step with rewards
  traces/step-N.jsonl.gz  every trained sample of step N, token by token (grpoplus.metrics.traces; run.traces)
  checkpoints/step-N/  model + trainer state (grpoplus.learner.checkpoint)
  tb/                  TensorBoard event files (run.loggers: tensorboard)
  wandb/, mlruns/      offline W&B / local MLflow runs (run.loggers: wandb, mlflow)
  trackers.json        tracker run ids, so a resumed run continues the same tracker run
  report/              PNG panels + index.html (grpoplus report)
```
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CONFIG_FILE = "config.yaml"
PLAN_DIR = "plan"
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
TRACES_DIR = "traces"
CHECKPOINTS_DIR = "checkpoints"
TB_DIR = "tb"
REPORT_DIR = "report"
WANDB_DIR = "wandb"
MLRUNS_DIR = "mlruns"
TRACKERS_FILE = "trackers.json"
OUTPUTS = (METRICS_FILE, SAMPLES_FILE, TRACES_DIR, CHECKPOINTS_DIR, TB_DIR, REPORT_DIR, WANDB_DIR, MLRUNS_DIR, TRACKERS_FILE)
"""What a run writes; a directory holding any of these holds a run."""


class RunDir:
    """Paths of one run directory, and the few operations on it as a whole."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def plan(self) -> Path:
        return self.root / PLAN_DIR

    @property
    def metrics(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def samples(self) -> Path:
        return self.root / SAMPLES_FILE

    @property
    def traces(self) -> Path:
        return self.root / TRACES_DIR

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS_DIR

    @property
    def report(self) -> Path:
        return self.root / REPORT_DIR

    def clear(self, overwrite: bool) -> None:
        """Refuse to mix two runs in one directory; with ``overwrite`` delete the old run's outputs."""
        existing = [name for name in OUTPUTS if (self.root / name).exists()]
        if not existing:
            return
        if not overwrite:
            raise ValueError(f"run directory {str(self.root)!r} already holds a run ({', '.join(existing)}); "
                             f"continue it with `grpoplus train --resume {self.root}`, choose another --out, "
                             "or pass overwrite=true to start it afresh")
        for name in existing:
            path = self.root / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()

    def write_samples(self, step: int, scored, k: int) -> None:
        """Append the first ``k`` completions of the step's scored groups (:class:`~grpoplus.containers.ScoredGroups`)
        with their reward (null where a reward failed) and verdict."""
        r = scored.rollouts
        with open(self.samples, "a") as handle:
            for i in range(min(k, len(r.texts))):
                handle.write(json.dumps({"step": step, "prompt_index": r.prompt_index[int(r.group_ids[i])],
                                         "completion": r.texts[i], "reward": _reward(scored, i),
                                         "correct": bool(scored.correct[i]), "finished": bool(r.finished[i])}) + "\n")


def _reward(scored, i: int) -> float | None:
    """Response ``i``'s reward, None where a reward failed on it (no score)."""
    return float(scored.rewards[i]) if bool(scored.scored_mask[i]) else None
