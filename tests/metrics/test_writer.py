import math
import subprocess
import sys

import pytest
import torch

from grpoplus.metrics import MetricsWriter, read_metrics


def _metrics(step):
    return {"reward/mean": step / 10, "loss/total": torch.tensor(0.5 * step)}


def test_roundtrip_keeps_values_types_and_nonfinite(tmp_path):
    with MetricsWriter(tmp_path, loggers=()) as w:
        w.log(0, {"reward/mean": 0.25, "optim/skipped_updates": 1, "loss/total": float("nan")})
        w.log(1, {"reward/mean": torch.tensor(0.5), "optim/grad_norm": float("inf")})
    records = read_metrics(tmp_path)
    assert records[0]["step"] == 0 and records[0]["reward/mean"] == 0.25
    assert records[0]["optim/skipped_updates"] == 1 and math.isnan(records[0]["loss/total"])
    assert records[1]["reward/mean"] == 0.5 and records[1]["optim/grad_norm"] == math.inf
    assert read_metrics(tmp_path / "metrics.jsonl") == records  # the file path works too


def test_each_log_is_flushed_before_close(tmp_path):
    w = MetricsWriter(tmp_path, loggers=())
    w.log(3, {"reward/mean": 1.0})
    assert read_metrics(tmp_path) == [{"step": 3, "reward/mean": 1.0}]
    w.close()


def test_resume_equals_uninterrupted_run(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    with MetricsWriter(straight, loggers=()) as w:
        for step in range(10):
            w.log(step, _metrics(step))
    # The interrupted run got to step 7 (and half a line of step 8) but its last
    # checkpoint is step 5: resuming there must drop steps 6-8.
    with MetricsWriter(resumed, loggers=()) as w:
        for step in range(8):
            w.log(step, _metrics(step))
    with open(resumed / "metrics.jsonl", "a") as f:
        f.write('{"step": 8, "reward/me')
    with pytest.warns(UserWarning, match="truncated last line"):
        w = MetricsWriter(resumed, loggers=(), resume_step=5)
    with w:
        for step in range(6, 10):
            w.log(step, _metrics(step))
    assert (resumed / "metrics.jsonl").read_bytes() == (straight / "metrics.jsonl").read_bytes()
    assert not list(resumed.glob("*.tmp"))


def test_truncated_last_line_is_skipped_with_warning(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "reward/mean": 0.1}\n{"step": 1, "reward/mean": 0.2}\n'
                    '{"step": 2, "rew')
    with pytest.warns(UserWarning, match="truncated last line 3"):
        records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1]


def test_corrupt_middle_line_and_missing_step_are_errors(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1, oops}\n{"step": 2}\n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_metrics(tmp_path)
    path.write_text('{"step": 0}\n{"reward/mean": 1.0}\n')
    with pytest.raises(ValueError, match="line 2 is not a JSON object with a 'step' key"):
        read_metrics(tmp_path)
    path.write_text('{"step": 0, "reward/mean": "high"}\n')
    with pytest.raises(ValueError, match="line 1: metric 'reward/mean' is not a number"):
        read_metrics(tmp_path)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "metrics.jsonl")):
        read_metrics(tmp_path)


def test_bad_values_and_backwards_steps_are_rejected(tmp_path):
    with MetricsWriter(tmp_path, loggers=()) as w:
        with pytest.raises(ValueError, match="metric 'note' must be a number"):
            w.log(0, {"note": "hello"})
        w.log(4, {"reward/mean": 1.0})
        w.log(4, {"eval/accuracy": 0.5})  # same step again (e.g. eval) is fine
        with pytest.raises(ValueError, match="step 3 logged after step 4.*resume_step"):
            w.log(3, {"reward/mean": 1.0})
    # A new writer on the same file knows the last step too.
    with MetricsWriter(tmp_path, loggers=()) as w:
        with pytest.raises(ValueError, match="step 0 logged after step 4"):
            w.log(0, {"reward/mean": 1.0})


def test_tensorboard_events_are_written(tmp_path):
    with MetricsWriter(tmp_path, loggers=["tensorboard"]) as w:
        for step in range(3):
            w.log(step, {"reward/mean": step / 2, "loss/total": float("nan")})
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("reward/mean")] == [0.0, 0.5, 1.0]


def test_import_is_light_and_tensorboard_false_needs_no_tensorboard(tmp_path):
    code = (
        "import sys\n"
        "sys.modules['torch.utils.tensorboard'] = None  # any import of it now fails\n"
        "import grpoplus.metrics as m\n"
        "heavy = {'matplotlib', 'torch', 'wandb', 'mlflow', 'trackio'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
        f"w = m.MetricsWriter({str(tmp_path)!r}, loggers=())\n"
        "w.log(0, {'reward/mean': 1.0}); w.close()\n"
        "print(m.read_metrics(" + repr(str(tmp_path)) + "))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "'reward/mean': 1.0" in out.stdout
