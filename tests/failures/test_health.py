"""The failure gallery, run health: a run that cannot learn is named the step it happens and stopped with its work
kept; a run whose every completion is cut is named at once, by the run and by the doctor."""

import pytest

from grpoplus.entry.cli import main
from grpoplus.learner.checkpoint import latest_checkpoint
from grpoplus.metrics import read_metrics

SMALL = ["prompts_per_step=4", "group_size=4", "max_new_tokens=10", "eval_size=4", "eval_samples=0",
         "progress=false", "loggers=[]", "micro_batch_size=8", "threads=1"]
CONSTANT = "def constant(prompts, completions, **fields):\n    return [0.0] * len(completions)\n"


def test_a_reward_that_never_varies_stops_the_run_with_its_checkpoint_and_exit_status_3(nano_dir, tmp_path, capsys):
    (tmp_path / "const.py").write_text(CONSTANT)
    out = tmp_path / "run"
    code = main(["train", "--preset", "grpo", "--model", nano_dir, "--out", str(out), "max_steps=6", "save_every=0",
                 "health.stop_after=2", f"rewards=[{tmp_path / 'const.py'}:constant]", *SMALL])
    err = capsys.readouterr().err
    assert code == 3
    assert [r["step"] for r in read_metrics(out)] == [0, 1, 2]
    assert latest_checkpoint(out).name == "step-2"  # the work so far is kept
    assert "health: step 1: no_spread: every group's rewards were equal" in err
    stopped = [line for line in err.splitlines() if line.startswith("grpoplus train: stopped:")]
    assert len(stopped) == 1 and "no learning signal for 2 consecutive steps (1-2: no_spread on 2)" in stopped[0]
    assert "Traceback" not in err


def test_every_completion_cut_is_named_the_step_it_happens_and_by_the_doctor(nano_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--model", nano_dir, "--out", str(out), "max_steps=2", "health.stop_after=0",
                 *[o for o in SMALL if not o.startswith("max_new_tokens")], "max_new_tokens=1"])
    assert code == 0
    err = capsys.readouterr().err
    records = read_metrics(out)
    assert records[1]["length/truncated_frac"] == 1.0  # one token, never the stop token: the seeded run's draw
    assert "health: step 1: all_truncated: every completion was cut at the length limit" in err
    main(["doctor", str(out)])
    report = capsys.readouterr().out
    assert "all_truncated" in report and "rollout.max_new_tokens" in report


def test_the_guard_is_quiet_on_a_healthy_run(tmp_path, capsys):
    """The built-in model (warm-started on the arithmetic task) on its task: answers that end, rewards that differ."""
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "max_steps=2", "eval_size=4", "eval_samples=0", "progress=false",
                 "loggers=[]", "threads=1", "prompts_per_step=8"]) == 0
    assert "health:" not in capsys.readouterr().err
    assert all(r["groups/zero_std_frac"] < 1 and r["length/truncated_frac"] < 1 for r in read_metrics(out)[1:])


@pytest.mark.parametrize("value", ["-1", "x"])
def test_a_bad_health_key_is_one_line(nano_dir, tmp_path, capsys, value):
    code = main(["train", "--model", nano_dir, "--out", str(tmp_path / "run"), f"health.stop_after={value}", *SMALL])
    err = capsys.readouterr().err
    assert code == 2 and "stop_after" in err and "Traceback" not in err


def test_non_finite_updates_are_named_each_step_stop_the_run_and_never_reach_the_checkpoint(nano_dir, tmp_path,
                                                                                             monkeypatch, capsys):
    """Every gradient non-finite (injected: the gradient norm is NaN), so every update is skipped: named the step it
    happens, the run stops after health.stop_after such steps, and its checkpoint holds the finite start weights."""
    import torch
    from safetensors.torch import load_file

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: torch.tensor(float("nan")))
    (tmp_path / "spread.py").write_text("def spread(prompts, completions, **fields):\n"
                                        "    return [len(set(c)) / 10 for c in completions]\n")
    out = tmp_path / "run"
    code = main(["train", "--preset", "grpo", "--model", nano_dir, "--out", str(out), "max_steps=5",
                 "health.stop_after=2", f"rewards=[{tmp_path / 'spread.py'}:spread]", *SMALL])
    err = capsys.readouterr().err
    assert code == 3
    assert "health: step 1: nonfinite: every update was skipped: non-finite loss or gradient" in err
    assert "no learning signal for 2 consecutive steps (1-2: nonfinite on 2)" in err
    saved = load_file(latest_checkpoint(out) / "model.safetensors")
    start = load_file(f"{nano_dir}/model.safetensors")
    assert all(torch.isfinite(t).all() for t in saved.values())
    assert set(saved) == set(start) and all(torch.equal(saved[k], start[k]) for k in start)  # no update landed
