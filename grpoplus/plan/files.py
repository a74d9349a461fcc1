"""A run's plan as files: each part of :class:`~grpoplus.plan.run.RunPlan` (where the roles run, what a learner
rank and a rollout worker are told, the examples, the loop, collection, rewards, ...) as one YAML file under
``RUN/plan/``. The run writes them at its start; ``grpoplus train --dry-run`` prints the same text first, so what a
dry run shows is what the run's roles receive."""

from __future__ import annotations

from pathlib import Path

import yaml

from grpoplus.plan.run import RunPlan


def plan_files(plan: RunPlan) -> dict[str, str]:
    """``{file name: YAML text}`` of each part of the plan, in the plan's order."""
    return {f"{part}.yaml": yaml.safe_dump(value, sort_keys=False) for part, value in plan.to_dict().items()}


def write_plan_files(directory: Path, plan: RunPlan) -> None:
    """Write :func:`plan_files` into ``directory`` (``RUN/plan/``), replacing what an earlier start of the run wrote
    (a part this plan lacks, as cluster.yaml after a resume with run.cluster=local, is removed)."""
    files = plan_files(plan)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.yaml"):
        if stale.name not in files:
            stale.unlink()
    for name, text in files.items():
        (directory / name).write_text(text)
