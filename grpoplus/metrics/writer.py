"""Per-step metrics on disk: ``RUN/metrics.jsonl`` (one JSON object per step), passed on to
TensorBoard and experiment trackers (:mod:`grpoplus.metrics.loggers`).

The JSONL file is the source of truth for ``grpoplus report``, ``compare`` and ``doctor``.
Non-finite floats are written as Python's ``json`` writes them (``NaN``, ``Infinity``),
so a step whose loss was NaN stays visible to the doctor; ``read_metrics`` reads them back.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

from grpoplus.core.rundir import METRICS_FILE


def _metrics_path(run_dir: str | os.PathLike) -> Path:
    """``run_dir`` may be the run directory or the ``metrics.jsonl`` file itself."""
    path = Path(run_dir)
    return path if path.suffix == ".jsonl" else path / METRICS_FILE


def _parse_lines(path: Path) -> list[dict[str, Any]]:
    """Parse a metrics file; a broken *last* line (run killed mid-write) is dropped, with a
    warning."""
    lines = path.read_text(encoding="utf-8").splitlines()
    records: list[dict[str, Any]] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if lineno == len(lines):
                warnings.warn(
                    f"{path}: skipping truncated last line {lineno} (run stopped mid-write?)",
                    stacklevel=3,
                )
                break
            raise ValueError(f"{path}: line {lineno} is not valid JSON ({err})") from None
        if not isinstance(record, dict) or "step" not in record:
            raise ValueError(f"{path}: line {lineno} is not a JSON object with a 'step' key")
        for key, value in record.items():
            if value is not None and not isinstance(value, (int, float)):
                raise ValueError(f"{path}: line {lineno}: metric {key!r} is not a number: {value!r}")
        records.append(record)
    return records


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All per-step records of a run, in file order.

    Args:
        run_dir: the run directory (holding ``metrics.jsonl``) or the file itself.

    Raises:
        FileNotFoundError: naming the missing file.
        ValueError: a corrupt line other than the last one, or a line without ``step``.
    """
    path = _metrics_path(run_dir)
    if not path.is_file():
        raise FileNotFoundError(
            f"no metrics file at {path}: is {path.parent} a grpoplus run directory?"
        )
    return _parse_lines(path)


def _to_number(key: str, value: Any) -> int | float:
    """A JSON-ready scalar from a Python/numpy/torch scalar; anything else is a caller bug."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if hasattr(value, "item"):  # torch / numpy scalars (0-d or one element)
        value = value.item()
    if isinstance(value, numbers.Real):
        return float(value)
    raise ValueError(f"metric {key!r} must be a number, got {type(value).__name__}: {value!r}")


def truncate_jsonl(path: str | os.PathLike, step: int) -> None:
    """Keep only the lines of a per-step JSONL file (metrics, samples) with ``step <= step``;
    a broken last line is dropped. Temp file + ``os.replace``, so a crash leaves either the
    old or the new file, never half of one. A missing file is left missing."""
    path = Path(path)
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a killed writer's last line
            warnings.warn(f"{path}: dropping a truncated last line (run stopped mid-write?)", stacklevel=2)
            continue
        if record.get("step", 0) <= step:
            kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    os.replace(tmp, path)


class MetricsWriter:
    """Append one JSON line per step to ``RUN/metrics.jsonl`` and fan the record out to the
    ``loggers`` (names in :data:`grpoplus.metrics.loggers.LOGGERS`: ``tensorboard``,
    ``wandb``, ``mlflow``, ``trackio``).

    The JSONL file is written first and is the source of truth; the loggers get the finite
    values under the same names. With ``resume_step=k`` the file is first cut back to the
    records with ``step <= k``, so a resumed run's file equals the file of an uninterrupted
    run; TensorBoard purges its events after step k, and trackers that keep what they were
    sent (wandb, mlflow, trackio) are not sent again the steps the interrupted attempt
    already sent them (a resumed run reproduces those steps, timings aside).

    Example::

        w = MetricsWriter("runs/demo", loggers=())
        w.log(0, {"reward/mean": 0.25, "length/mean": 41.0})
        w.close()
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        loggers: Sequence[str] = ("tensorboard",),
        resume_step: int | None = None,
        config: Mapping[str, Any] | None = None,
    ):
        """
        Args:
            run_dir: the run directory (created if missing).
            loggers: where the records go besides metrics.jsonl.
            resume_step: the checkpoint step a resumed run continues after.
            config: the resolved config as a nested dict, for the trackers' run config.

        Raises:
            ValueError / ImportError: an unknown logger, or its package is not installed
                (one line naming ``pip install ...``), before anything is written.
        """
        from .loggers import open_loggers

        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        sent = self._last_logged_step() if resume_step is not None else None
        if resume_step is not None and self.path.exists():
            truncate_jsonl(self.path, resume_step)
        self._last_step = self._last_logged_step()
        self._sent_upto = sent
        self._loggers = open_loggers(list(loggers), self.run_dir, dict(config or {}), resume_step)
        self._file = open(self.path, "a", encoding="utf-8")

    def _last_logged_step(self) -> int | None:
        if not self.path.exists():
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a truncated tail is reported by read_metrics
            records = _parse_lines(self.path)
        return records[-1]["step"] if records else None

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Write one record ``{"step": step, **metrics}``, flush it, then pass it on.

        Raises:
            ValueError: a non-numeric metric, or a step lower than one already written
                (a resumed run must pass ``resume_step``).
        """
        step = int(step)
        if self._last_step is not None and step < self._last_step:
            raise ValueError(
                f"{self.path}: step {step} logged after step {self._last_step}; "
                "a resumed run must open MetricsWriter with resume_step=<checkpoint step>"
            )
        record: dict[str, Any] = {"step": step}
        for key, value in metrics.items():
            if key != "step":
                record[key] = _to_number(key, value)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        self._last_step = step
        finite = {k: v for k, v in record.items() if k != "step" and math.isfinite(v)}
        for name, logger in list(self._loggers.items()):
            if not logger.rewinds and self._sent_upto is not None and step <= self._sent_upto:
                continue  # the interrupted attempt already sent this step
            self._pass_on(name, logger, step, finite)

    def _pass_on(self, name: str, logger: Any, step: int, record: dict[str, float]) -> None:
        """A tracker that fails mid-run is dropped with a warning; metrics.jsonl goes on."""
        try:
            logger.log(step, record)
        except Exception as err:  # noqa: BLE001 - a third-party tracker must not stop training
            del self._loggers[name]
            warnings.warn(f"metrics logger {name!r} failed at step {step} ({err!r}); it gets no "
                          f"more records, {self.path} has them all", stacklevel=3)

    def close(self) -> None:
        self._file.close()
        loggers, self._loggers = self._loggers, {}
        for logger in loggers.values():
            logger.close()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
