"""Running an experiment: every arm x seed as an ordinary training run, then plots and the verdict.

```
OUT/
  runs/<arm>-s<seed>/   an ordinary run directory (config.yaml, metrics.jsonl, ...) + lab_run.json
  plots/<metric>.png    one overlay of every run per key metric (grpoplus compare's drawing)
  verdict.json          definition as run, per-seed measures, checks, verdicts, machine and load
  verdict.md            the same, short, for people
```

Runs go one after another in this process (a CPU machine has no room for two). A run whose
``lab_run.json`` records the same configuration is reused, so an interrupted experiment
continues where it stopped; a run of another configuration in the same place is an error.
"""

from __future__ import annotations

import json
import os
import platform
import re
import time
from pathlib import Path
from typing import Any, Callable

from grpoplus.lab.experiment import EXPERIMENTS, Arm, Experiment
from grpoplus.lab.measures import LabRun
from grpoplus.lab.verdict import ExperimentVerdict, Runs, judge, markdown, report_measures

LAB_SETTINGS = ("progress=false", "loggers=[]", "overwrite=true", "threads=1")
"""How the lab runs every arm: quietly, metrics.jsonl only, a half-finished run started afresh, on one
thread (the tiny model runs fastest on one; on a loaded 2-core machine two threads made a rollout
10x slower: 0.8 s vs 8.7-12.2 s). ``--set threads=N`` overrides it."""

RUN_MARKER = "lab_run.json"
_NOT_TRAINED = {"out", "overwrite", "overrides", "progress", "loggers", "preset"}  # run keys that change no result


def run_path(out: str | Path, arm: str, seed: int) -> Path:
    return Path(out) / "runs" / f"{arm}-s{seed}"


def arm_overrides(experiment: Experiment, arm: Arm, seed: int, out: str | Path, steps: int | None = None,
                  extra: tuple[str, ...] = ()) -> list[str]:
    """The ``key=value`` overrides of one run: the experiment's base, the arm's, the caller's extras,
    then seed, run directory and (when given) the step budget."""
    budget = [f"max_steps={steps}"] if steps else []
    return [*experiment.base, *arm.overrides, *extra, *budget, f"seed={seed}", f"out={run_path(out, arm.name, seed)}"]


def train_command(experiment: Experiment, arm: Arm, overrides: list[str]) -> str:
    """The ``grpoplus train`` command line that makes the same run by hand."""
    return " ".join(["grpoplus train --preset", arm.preset or experiment.preset, *overrides])


def every_run(experiment: Experiment, out: str | Path, seeds: int, steps: int | None = None,
              extra: tuple[str, ...] = ()) -> list[tuple[Arm, int, list[str]]]:
    """(arm, seed, overrides) of every run, arms in definition order, seeds 0..seeds-1 within each."""
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    missing = experiment.missing_keys()
    if missing:
        raise ValueError(f"lab experiment {experiment.name!r} needs the config key(s) {', '.join(missing)}, which this "
                         "grpoplus does not have yet; it is skipped until they exist")
    return [(arm, seed, arm_overrides(experiment, arm, seed, out, steps, extra))
            for arm in experiment.arms for seed in range(seeds)]


def _trained_config(config: dict[str, Any]) -> dict[str, Any]:
    """The resolved config without the run keys that change no result (compared to reuse a run)."""
    return {section: {k: v for k, v in values.items() if section != "run" or k not in _NOT_TRAINED}
            for section, values in config.items()}


def _load(path: Path) -> tuple[list[dict], dict]:
    from grpoplus.metrics.commands import load_run

    return load_run(str(path))


def _finished(path: Path, config: dict[str, Any]) -> bool:
    """True when ``path`` holds a finished lab run of exactly ``config``; a different one is an error."""
    marker = path / RUN_MARKER
    if not marker.is_file():
        return False
    saved = json.loads(marker.read_text())
    if saved["config"] != _trained_config(config):
        raise ValueError(f"{path} holds a lab run of another configuration; choose another --out or delete it")
    return True


def execute(experiment: Experiment, out: str | Path, seeds: int = 3, steps: int | None = None,
            extra: tuple[str, ...] = (), train_fn: Callable | None = None,
            log: Callable[[str], None] = print) -> Runs:
    """Run (or reuse) every arm x seed; returns the finished runs. Every config is validated
    before the first run starts, so a bad override fails at once."""
    from grpoplus.config import build_config

    if train_fn is None:
        from grpoplus.loop.driver import train as train_fn
    jobs = [(arm, seed, build_config(arm.preset or experiment.preset, overrides=[*LAB_SETTINGS, *o]))
            for arm, seed, o in every_run(experiment, out, seeds, steps, extra)]
    runs: Runs = {arm.name: {} for arm in experiment.arms}
    for i, (arm, seed, cfg) in enumerate(jobs, 1):
        path = Path(cfg.run.out)
        tag = f"[lab {experiment.name} {i}/{len(jobs)}] {arm.name} seed {seed}"
        if _finished(path, cfg.to_dict()):
            log(f"{tag}: reusing {path}")
        else:
            log(f"{tag}: training {cfg.run.max_steps} steps into {path} (load {_load_avg()})")
            record = _train_timed(train_fn, cfg)
            record.update(arm=arm.name, seed=seed, command=train_command(experiment, arm, list(cfg.run.overrides)))
            (path / RUN_MARKER).write_text(json.dumps(record, indent=1) + "\n")
            log(f"{tag}: done in {record['wall_s']:.0f} s (load {_load_avg()})")
        records, config = _load(path)
        runs[arm.name][seed] = LabRun(arm.name, seed, path, records, config)
    return runs


def _train_timed(train_fn: Callable, cfg) -> dict[str, Any]:
    load_before, t0 = os.getloadavg(), time.perf_counter()
    train_fn(cfg)
    return {"wall_s": time.perf_counter() - t0, "load_before": list(load_before), "load_after": list(os.getloadavg()),
            "config": _trained_config(cfg.to_dict())}


def _load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_info() -> dict[str, Any]:
    """What the figures were measured on: CPU count and model, platform, torch and its threads."""
    import torch

    from grpoplus.models.device import cpuinfo

    model = cpuinfo("model name") or platform.processor() or platform.machine()
    cpus = os.cpu_count()
    return {"cpus": cpus, "cpu": model, "platform": platform.platform(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "summary": f"{cpus} CPUs ({model}), torch {torch.__version__}"}


def write_plots(experiment: Experiment, runs: Runs, out: Path) -> list[str]:
    """One PNG per key metric with every run overlaid (colour = run, labelled ``<arm> s<seed>``),
    drawn by ``grpoplus compare``'s code; returns the paths relative to ``out``."""
    from grpoplus.metrics.plots import Panel, draw_runs
    from grpoplus.metrics.series import Trace
    from grpoplus.metrics.style import save

    order = [(arm, seed, run) for arm, by_seed in runs.items() for seed, run in sorted(by_seed.items())]
    traces, labels = [Trace(run.records) for _, _, run in order], [f"{arm} s{seed}" for arm, seed, _ in order]
    (out / "plots").mkdir(parents=True, exist_ok=True)
    written = []
    for key in experiment.plots:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", key)
        fig = draw_runs(traces, labels, Panel(name, f"{experiment.name}: {key}", key, (key,)), smooth=None)
        if fig is not None:
            save(fig, out / "plots" / f"{name}.png")
            written.append(f"plots/{name}.png")
    return written


def lab_command(experiment: Experiment, seeds: int, steps: int | None, extra: tuple[str, ...]) -> str:
    parts = ["grpoplus lab", experiment.name, "--out DIR", f"--seeds {seeds}"]
    parts += [f"--steps {steps}"] if steps else []
    parts += [f"--set {e}" for e in extra]
    return " ".join(parts)


def run_experiment(experiment: Experiment | str, out: str | Path, seeds: int = 3, steps: int | None = None,
                   extra: tuple[str, ...] = (), train_fn: Callable | None = None,
                   log: Callable[[str], None] = print) -> ExperimentVerdict:
    """Run every arm x seed of ``experiment`` (or reuse finished runs), draw the overlays, judge
    each comparison and write ``verdict.json`` and ``verdict.md`` under ``out``."""
    if isinstance(experiment, str):
        experiment = EXPERIMENTS.get(experiment)
    out = Path(out)
    runs = execute(experiment, out, seeds, steps, extra, train_fn, log)
    seed_list = list(range(seeds))
    first = next(iter(runs[experiment.arms[0].name].values()))
    verdict = ExperimentVerdict(
        experiment=experiment.name, title=experiment.title, source=experiment.source, regime=experiment.regime,
        command=lab_command(experiment, seeds, steps, extra), seeds=seed_list, steps=first.last_step,
        arms={a.name: {"preset": a.preset or experiment.preset, "overrides": [*experiment.base, *a.overrides, *extra]}
              for a in experiment.arms},
        comparisons=[judge(c, runs) for c in experiment.comparisons],
        report=report_measures(experiment, runs, seed_list), runs=_run_records(runs), machine=machine_info(),
        plots=write_plots(experiment, runs, out))
    (out / "verdict.json").write_text(json.dumps(verdict.to_dict(), indent=1, default=_json_default) + "\n")
    (out / "verdict.md").write_text(markdown(verdict))
    return verdict


def _run_records(runs: Runs) -> list[dict[str, Any]]:
    """Per run: where it is, how long it took and how loaded the machine was (from its lab_run.json)."""
    out = []
    for arm, by_seed in runs.items():
        for seed, run in sorted(by_seed.items()):
            saved = json.loads((run.path / RUN_MARKER).read_text())
            out.append({"arm": arm, "seed": seed, "dir": str(run.path), "command": saved.get("command"),
                        "wall_s": saved.get("wall_s"), "load_before": saved.get("load_before"),
                        "load_after": saved.get("load_after")})
    return out


def _json_default(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not JSON serialisable: {value!r}")
