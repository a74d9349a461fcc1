"""The logger fan-out of MetricsWriter, and each tracker against its real package (skipped
when the package is absent; none of them touches the network: wandb runs offline, MLflow
writes a file store, trackio a local SQLite file)."""

import json
import math
import subprocess
import sys

import pytest

from grpoplus.metrics import MetricsWriter, read_metrics
from grpoplus.metrics import loggers as L

RECORDS = [(0, {"eval/accuracy": 0.1, "eval/pass@4": 0.3}),
           (1, {"reward/mean": 0.25, "loss/total": float("nan")}),
           (2, {"reward/mean": 0.5, "optim/grad_norm": 1.5})]


class Recording:
    """A logger that keeps what it was sent (class-level, to look at after close)."""

    rewinds = False
    sent: list = []
    closed = 0

    def __init__(self, run_dir, config, resume_step):
        self.config, self.resume_step = config, resume_step

    def log(self, step, record):
        Recording.sent.append((step, dict(record)))

    def close(self):
        Recording.closed += 1


class Failing(Recording):
    def log(self, step, record):
        raise ConnectionError("tracker went away")


@pytest.fixture
def recording():
    L.LOGGERS.add("recording", Recording, overwrite=True)
    L.LOGGERS.add("failing", Failing, overwrite=True)
    Recording.sent, Recording.closed = [], 0
    return Recording


def _write(run_dir, loggers, records=RECORDS, resume_step=None, config=None):
    with MetricsWriter(run_dir, loggers=loggers, resume_step=resume_step, config=config) as w:
        for step, metrics in records:
            w.log(step, metrics)


def test_loggers_get_the_jsonl_names_and_finite_values(tmp_path, recording):
    _write(tmp_path, ["recording"], config={"rollout": {"group_size": 8}})
    assert recording.sent == [(0, {"eval/accuracy": 0.1, "eval/pass@4": 0.3}),
                              (1, {"reward/mean": 0.25}),  # NaN loss: only in metrics.jsonl
                              (2, {"reward/mean": 0.5, "optim/grad_norm": 1.5})]
    assert math.isnan(read_metrics(tmp_path)[1]["loss/total"]) and recording.closed == 1


def test_a_failing_tracker_is_dropped_and_the_file_goes_on(tmp_path, recording):
    with pytest.warns(UserWarning, match="'failing' failed at step 0.*tracker went away"):
        _write(tmp_path, ["failing", "recording"])
    assert [s for s, _ in recording.sent] == [0, 1, 2]
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]


def test_resume_does_not_resend_steps_a_tracker_keeps(tmp_path, recording):
    _write(tmp_path, ["recording"])  # the interrupted attempt got to step 2
    recording.sent = []
    _write(tmp_path, ["recording"], [(2, {"reward/mean": 0.5}), (3, {"reward/mean": 0.7})],
           resume_step=1)  # its checkpoint was step 1
    assert [s for s, _ in recording.sent] == [3]
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]
    recording.rewinds, recording.sent = True, []  # a logger that purges (TensorBoard)
    try:
        _write(tmp_path, ["recording"], [(2, {"reward/mean": 0.5})], resume_step=1)
    finally:
        recording.rewinds = False
    assert [s for s, _ in recording.sent] == [2]


def test_unknown_logger_and_missing_package_fail_before_anything_is_written(
        tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown metrics logger 'wandbb'.*tensorboard.*wandb"):
        MetricsWriter(tmp_path / "a", loggers=["wandbb"])
    real = L.importlib.util.find_spec
    monkeypatch.setattr(L.importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ImportError) as err:
        MetricsWriter(tmp_path / "b", loggers=["tensorboard", "mlflow"])
    message = str(err.value)
    assert "\n" not in message and "pip install mlflow-skinny" in message
    assert not (tmp_path / "b" / "metrics.jsonl").exists()
    assert not (tmp_path / "b" / "tb").exists()  # checked before any logger opened


def test_mlflow_key_keeps_names_readable():
    assert L.mlflow_key("eval/pass@4") == "eval/pass_at_4"
    assert L.mlflow_key("reward/mean") == "reward/mean"
    assert L.mlflow_key("moe/routing_mismatch/layer3") == "moe/routing_mismatch/layer3"


def test_flatten_config_for_params():
    assert L._flatten({"rollout": {"group_size": 8}, "algo": {"corrections": ["tis_token"]}}) == {
        "rollout.group_size": "8", "algo.corrections": "['tis_token']"}


# --- the real packages ---------------------------------------------------------------

CONFIG = {"run": {"preset": "dapo"}, "rollout": {"group_size": 8}}


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No tracker reaches the network or writes outside tmp_path."""
    for var in ("WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME",
                "TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _wandb_log_holds(run, needles, timeout=60.0):
    """Whether the run's offline transaction logs hold every needle; wandb's service process
    may still be writing them when finish() returns, so look again for up to ``timeout``."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        data = b"".join(p.read_bytes() for p in (run / "wandb").glob("offline-run-*/run-*.wandb"))
        if all(n in data for n in needles) or time.monotonic() > deadline:
            return all(n in data for n in needles)
        time.sleep(0.5)


def test_wandb_offline_run_in_the_run_dir_and_resumed(tmp_path, offline):
    pytest.importorskip("wandb")
    run = tmp_path / "run"
    _write(run, ["wandb"], config=CONFIG)
    run_id = json.loads((run / "trackers.json").read_text())["wandb"]
    assert _wandb_log_holds(run, [b"reward/mean", b"eval/pass@4", b'{"group_size":8}'])
    _write(run, ["wandb"], [(2, {"reward/mean": 0.5}), (3, {"reward/mean": 0.75})],
           resume_step=1)
    assert _wandb_log_holds(run, [b"0.75"])
    # the resumed attempt continues the same wandb run id
    dirs = list((run / "wandb").glob("offline-run-*"))
    assert dirs and all(d.name.endswith(f"-{run_id}") for d in dirs)


def test_mlflow_file_store_in_the_run_dir_and_resumed(tmp_path, offline):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    run = tmp_path / "run"
    _write(run, ["mlflow"], config=CONFIG)
    run_id = json.loads((run / "trackers.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=(run / "mlruns").as_uri())
    history = lambda key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]  # noqa: E731
    assert history("reward/mean") == [(1, 0.25), (2, 0.5)]
    assert history("eval/pass_at_4") == [(0, 0.3)] and history("loss/total") == []
    assert client.get_run(run_id).data.params["rollout.group_size"] == "8"
    _write(run, ["mlflow"], [(2, {"reward/mean": 0.5}), (3, {"reward/mean": 0.75})],
           resume_step=1)
    # the same run goes on; step 2 is not logged twice
    assert history("reward/mean") == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert client.get_run(run_id).info.status == "FINISHED"


TRACKIO_SCRIPT = """
import sys
from grpoplus.metrics import MetricsWriter
with MetricsWriter(sys.argv[1], loggers=["trackio"], config={"rollout": {"group_size": 8}}) as w:
    w.log(0, {"eval/pass@4": 0.3})
    w.log(1, {"reward/mean": 0.25, "loss/total": float("nan")})
from trackio.sqlite_storage import SQLiteStorage
print("LOGS", [{k: v for k, v in r.items() if k != "timestamp"}
               for r in SQLiteStorage.get_logs("grpoplus", "myrun")])
"""


def test_trackio_local_database(tmp_path, offline, monkeypatch):
    pytest.importorskip("trackio")
    # trackio reads TRACKIO_DIR once, at import: a fresh process sees this test's directory
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    out = subprocess.run([sys.executable, "-c", TRACKIO_SCRIPT, str(tmp_path / "myrun")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    logs = out.stdout.split("LOGS ", 1)[1]
    assert "{'eval/pass@4': 0.3, 'step': 0}" in logs and "{'reward/mean': 0.25, 'step': 1}" in logs
    assert (tmp_path / "trackio" / "grpoplus.db").is_file()
