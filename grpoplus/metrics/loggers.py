"""Where each step's metrics go besides ``metrics.jsonl``: TensorBoard and experiment trackers.

``run.loggers`` names them, e.g. ``[tensorboard]``, ``[tensorboard, wandb]``, ``[mlflow]``.
Each is a class in :data:`LOGGERS` built as ``cls(run_dir, config, resume_step)`` with
``log(step, record)`` and ``close()``; it receives the metric names of ``metrics.jsonl``
(finite values only) and stays on the machine unless the user points it elsewhere:

- ``tensorboard``: event files under ``RUN/tb``.
- ``wandb``: an offline run under ``RUN/wandb`` (``wandb sync RUN/wandb/offline-run-*``
  uploads it later); ``WANDB_MODE=online`` logs live; project ``$WANDB_PROJECT`` or
  ``grpoplus``.
- ``mlflow``: tracking URI ``$MLFLOW_TRACKING_URI``, else the file store ``RUN/mlruns``;
  experiment ``$MLFLOW_EXPERIMENT_NAME`` or ``grpoplus``; the config as flat params.
  MLflow forbids ``@`` in names: ``eval/pass@4`` is logged as ``eval/pass_at_4``.
- ``trackio``: trackio's local database (``$TRACKIO_DIR``, default under
  ``~/.cache/huggingface``), project ``grpoplus``; ``trackio show`` opens the dashboard.

Tracker run ids are kept in ``RUN/trackers.json`` so a resumed run continues the same
tracker run. Importing this module imports none of the packages.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from grpoplus.core.registry import Registry
from grpoplus.core.rundir import MLRUNS_DIR, TB_DIR
from grpoplus.core.rundir import TRACKERS_FILE as IDS_FILE

PROJECT = "grpoplus"


class Logger(Protocol):
    """One destination of the per-step metrics."""

    rewinds: bool
    """True when opening with ``resume_step=k`` drops what it held after step k (TensorBoard's
    purge); False when the tracker keeps it, so the writer does not send those steps again."""

    def log(self, step: int, record: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


LoggerFactory = Callable[[Path, Mapping[str, Any], "int | None"], Logger]
LOGGERS: Registry[LoggerFactory] = Registry("metrics logger")


def require_loggers(names: Sequence[str]) -> None:
    """Check, without importing them, that the named loggers exist and their packages are
    installed; call it when the config is validated, before anything is loaded.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
        ImportError: a missing package, naming the ``pip install`` that adds it.
    """
    for name in names:
        module, pip = getattr(LOGGERS.get(name), "requires", (None, None))
        if module is not None and importlib.util.find_spec(module) is None:
            from grpoplus.core.needs import unmet

            unmet(ImportError(f"run.loggers: {name!r} needs the {module} package, which is not installed: "
                              f"pip install {pip}"))


def open_loggers(names: Sequence[str], run_dir: Path, config: Mapping[str, Any],
                 resume_step: int | None) -> dict[str, Logger]:
    """``{name: logger}`` for ``run.loggers``, after :func:`require_loggers`."""
    require_loggers(names)
    return {name: LOGGERS.get(name)(run_dir, config, resume_step) for name in names}


def _stored_id(run_dir: Path, name: str) -> str | None:
    path = run_dir / IDS_FILE
    return json.loads(path.read_text()).get(name) if path.is_file() else None


def _store_id(run_dir: Path, name: str, value: str) -> None:
    path = run_dir / IDS_FILE
    ids = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**ids, name: value}, indent=1) + "\n")


@LOGGERS.register("tensorboard")
class TensorBoardLogger:
    """Scalars under ``RUN/tb``; a resumed run purges the events after its checkpoint."""

    requires = ("tensorboard", "tensorboard")
    rewinds = True

    def __init__(self, run_dir: Path, config: Mapping[str, Any], resume_step: int | None):
        from torch.utils.tensorboard import SummaryWriter  # lazy: slow import

        purge = None if resume_step is None else resume_step + 1
        self._tb = SummaryWriter(log_dir=str(Path(run_dir) / TB_DIR), purge_step=purge)

    def log(self, step: int, record: Mapping[str, float]) -> None:
        for key, value in record.items():
            self._tb.add_scalar(key, value, global_step=step)
        self._tb.flush()

    def close(self) -> None:
        self._tb.close()


@LOGGERS.register("wandb")
class WandbLogger:
    """A Weights & Biases run in ``RUN/wandb``, offline unless ``WANDB_MODE`` says otherwise."""

    requires = ("wandb", "wandb")
    rewinds = False

    def __init__(self, run_dir: Path, config: Mapping[str, Any], resume_step: int | None):
        import wandb

        run_dir = Path(run_dir)
        run_id = (_stored_id(run_dir, "wandb") if resume_step is not None else None) \
            or secrets.token_hex(4)
        self._run = wandb.init(
            dir=str(run_dir), id=run_id, resume="allow", name=run_dir.name,
            project=os.environ.get("WANDB_PROJECT", PROJECT), config=dict(config),
            mode=None if "WANDB_MODE" in os.environ else "offline",
            settings=wandb.Settings(console="off", save_code=False, x_disable_stats=True),
        )
        _store_id(run_dir, "wandb", run_id)

    def log(self, step: int, record: Mapping[str, float]) -> None:
        self._run.log(dict(record), step=step)

    def close(self) -> None:
        self._run.finish()


def mlflow_key(key: str) -> str:
    """A metric name MLflow accepts (letters, digits, ``_ - . : /`` and spaces):
    ``eval/pass@4`` -> ``eval/pass_at_4``, any other character -> ``_``."""
    return re.sub(r"[^\w\-. :/]", "_", key.replace("@", "_at_"))


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"rollout": {"group_size": 8}}`` -> ``{"rollout.group_size": "8"}``."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value)[:6000]  # MLflow's limit on a param value
    return flat


@LOGGERS.register("mlflow")
class MlflowLogger:
    """An MLflow run; the resolved config as params (once, when the run is created)."""

    requires = ("mlflow", "mlflow-skinny")
    rewinds = False
    BATCH = 100  # MLflow takes at most 100 params per log_batch call

    def __init__(self, run_dir: Path, config: Mapping[str, Any], resume_step: int | None):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        run_dir = Path(run_dir)
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / MLRUNS_DIR).resolve().as_uri()
        if uri.startswith("file:"):  # MLflow 3 keeps its file store only on request
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = MlflowClient(tracking_uri=uri)
        self._run_id = _stored_id(run_dir, "mlflow") if resume_step is not None else None
        if self._run_id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
            experiment = self._client.get_experiment_by_name(name)
            experiment_id = (experiment.experiment_id if experiment
                             else self._client.create_experiment(name))
            self._run_id = self._client.create_run(experiment_id, run_name=run_dir.name).info.run_id
            params = [Param(k, v) for k, v in _flatten(config).items()]
            for i in range(0, len(params), self.BATCH):
                self._client.log_batch(self._run_id, params=params[i:i + self.BATCH])
            _store_id(run_dir, "mlflow", self._run_id)

    def log(self, step: int, record: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(k), float(v), now, step) for k, v in record.items()]
        self._client.log_batch(self._run_id, metrics=metrics)

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


@LOGGERS.register("trackio")
class TrackioLogger:
    """A trackio run in its local database, named after the run directory."""

    requires = ("trackio", "trackio")
    rewinds = False

    def __init__(self, run_dir: Path, config: Mapping[str, Any], resume_step: int | None):
        import trackio

        self._run = trackio.init(
            project=PROJECT, name=Path(run_dir).name, config=dict(config),
            resume="never" if resume_step is None else "allow",
            embed=False, auto_log_gpu=False, auto_log_cpu=False,
        )

    def log(self, step: int, record: Mapping[str, float]) -> None:
        self._run.log(dict(record), step=step)

    def close(self) -> None:
        self._run.finish()
