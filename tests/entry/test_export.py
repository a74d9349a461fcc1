"""`grpoplus export RUN --out DIR`: the model files of a complete checkpoint, nothing of the trainer's;
a missing run, a run without a complete checkpoint, a missing step and a non-empty target are one-line errors."""

from pathlib import Path

import pytest

from grpoplus.entry.cli import main
from grpoplus.entry.export import export_checkpoint
from grpoplus.learner.checkpoint import MARKER, REF_FILE, STATE_FILE


def _checkpoint(run: Path, step: int, complete: bool = True) -> Path:
    path = run / "checkpoints" / f"step-{step}"
    path.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", STATE_FILE, REF_FILE):
        (path / name).write_text(f"{name} of step {step}")
    if complete:
        (path / MARKER).write_text(str(step))
    return path


def test_the_newest_complete_checkpoint_is_exported_without_the_trainers_files(tmp_path):
    run = tmp_path / "run"
    _checkpoint(run, 2)
    _checkpoint(run, 4)
    _checkpoint(run, 6, complete=False)  # a save cut short: never exported
    assert export_checkpoint(run, tmp_path / "out").name == "step-4"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors",
                                                                   "tokenizer.json"]
    assert (tmp_path / "out" / "model.safetensors").read_text() == "model.safetensors of step 4"
    assert main(["export", str(run), "--out", str(tmp_path / "two"), "--step", "2"]) == 0
    assert (tmp_path / "two" / "config.json").read_text() == "config.json of step 2"


@pytest.mark.parametrize("setup, step, message", [
    (lambda run: None, None, "does not exist"),
    (lambda run: run.mkdir(), None, "has no complete checkpoint to export"),
    (lambda run: _checkpoint(run, 2), 3, "no complete checkpoint of step 3; complete: step-2"),
])
def test_what_cannot_be_exported_is_a_one_line_error(tmp_path, capsys, setup, step, message):
    run = tmp_path / "run"
    setup(run)
    args = ["export", str(run), "--out", str(tmp_path / "out")] + ([] if step is None else ["--step", str(step)])
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_a_non_empty_target_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    _checkpoint(run, 2)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
