"""The runner and the CLI with a fake trainer (synthetic metrics from each run's real config),
and one short real run through the trainer."""

import json
from pathlib import Path

import pytest

from grpoplus.core.rundir import RunDir
from grpoplus.entry.cli import main
from grpoplus.lab import EXPERIMENTS, Arm, Check, Comparison, Experiment, Measure, Rule, run_experiment
from grpoplus.lab.runner import every_run

ENTROPY = Measure("tail_mean", "mean policy/entropy_mean over the last third", {"key": "policy/entropy_mean"})
CLIP = Measure("tail_mean", "mean loss/clip_frac_high over the last third", {"key": "loss/clip_frac_high"})

TOY = Experiment(
    name="toy_clip", title="clip-higher on a toy", source="a test", preset="dapo",
    base=("max_steps=9", "num_minibatches=2"),
    arms=(Arm("symmetric", ("eps_high=0.2",)), Arm("clip_higher", ("eps_high=0.28",))),
    comparisons=(Comparison("clip-higher keeps entropy up", "symmetric", "clip_higher", ENTROPY, Rule(+1, 0.02),
                            (Check("switch", CLIP, arm="symmetric", minus="clip_higher", at_least=1e-3),)),),
    regime="toy", plots=("policy/entropy_mean", "loss/clip_frac_high"), report=(CLIP,))


class FakeTrain:
    """Writes what a run would: config.yaml and a metrics.jsonl whose entropy falls less with a wider eps_high."""

    def __init__(self):
        self.calls = []

    def __call__(self, cfg):
        self.calls.append((cfg.algo.eps_high, cfg.run.seed))
        run = RunDir(cfg.run.out)
        run.root.mkdir(parents=True, exist_ok=True)
        cfg.save(run.config)
        decay = 0.05 if cfg.algo.eps_high > 0.25 else 0.1
        with open(run.metrics, "w") as f:
            for step in range(cfg.run.max_steps + 1):
                f.write(json.dumps({"step": step, "policy/entropy_mean": 0.5 - decay * step / 9 + 0.01 * cfg.run.seed,
                                    "loss/clip_frac_high": 0.01 if cfg.algo.eps_high > 0.25 else 0.03,
                                    "time/elapsed_s": float(step)}) + "\n")


def test_run_experiment_writes_runs_plots_and_verdict(tmp_path):
    fake = FakeTrain()
    verdict = run_experiment(TOY, tmp_path, seeds=2, train_fn=fake, log=lambda _: None)
    assert sorted(fake.calls) == [(0.2, 0), (0.2, 1), (0.28, 0), (0.28, 1)]
    (c,) = verdict.comparisons
    # tail = steps 6..9: symmetric 0.5 - 0.1 * 7.5 / 9, clip_higher 0.5 - 0.05 * 7.5 / 9 -> effect 0.05 * 7.5 / 9
    assert c.status == "reproduced" and c.effects == pytest.approx([0.05 * 7.5 / 9] * 2)
    assert c.checks[0].passed and c.checks[0].values == pytest.approx([0.02, 0.02])
    saved = json.loads((tmp_path / "verdict.json").read_text())
    assert saved["comparisons"][0]["status"] == "reproduced" and saved["seeds"] == [0, 1]
    assert saved["machine"]["cpus"] >= 1 and len(saved["runs"]) == 4
    assert all(r["load_before"] is not None for r in saved["runs"])
    assert saved["arms"]["clip_higher"]["overrides"] == ["max_steps=9", "num_minibatches=2", "eps_high=0.28"]
    md = (tmp_path / "verdict.md").read_text()
    assert "**reproduced**" in md and "plots/policy_entropy_mean.png" in md
    assert (tmp_path / "plots" / "policy_entropy_mean.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "runs" / "clip_higher-s1" / "lab_run.json").is_file()


def test_finished_runs_are_reused_and_a_foreign_run_is_refused(tmp_path):
    run_experiment(TOY, tmp_path, seeds=1, train_fn=FakeTrain(), log=lambda _: None)
    again = FakeTrain()
    run_experiment(TOY, tmp_path, seeds=1, train_fn=again, log=lambda _: None)
    assert again.calls == []
    with pytest.raises(ValueError, match="another configuration"):
        run_experiment(TOY, tmp_path, seeds=1, extra=("lr=1e-3",), train_fn=FakeTrain(), log=lambda _: None)


def test_a_bad_override_fails_before_any_run(tmp_path):
    fake = FakeTrain()
    with pytest.raises(ValueError, match="eps_hihg"):
        run_experiment(TOY, tmp_path, seeds=1, extra=("eps_hihg=0.3",), train_fn=fake, log=lambda _: None)
    assert fake.calls == []


@pytest.mark.parametrize("name", EXPERIMENTS.names())
def test_every_builtin_experiment_builds_valid_configs(name, tmp_path):
    from grpoplus.config import build_config

    experiment = EXPERIMENTS.get(name)
    if experiment.missing_keys():
        with pytest.raises(ValueError, match="needs the config key"):
            every_run(experiment, tmp_path, 1)
        return
    for arm, _, overrides in every_run(experiment, tmp_path, 1):
        build_config(arm.preset or experiment.preset, overrides=overrides)
    from grpoplus.lab.measures import MEASURES

    measures = [c.effect for c in experiment.comparisons] + list(experiment.report)
    measures += [ch.measure for c in experiment.comparisons for ch in c.checks]
    assert all(m.name in MEASURES for m in measures)


def test_every_builtin_switch_check_names_the_arms_of_its_comparison():
    """A switch check that tests an arm outside its comparison says nothing about that switch."""
    for name in EXPERIMENTS.names():
        for c in EXPERIMENTS.get(name).comparisons:
            for check in (ch for ch in c.checks if ch.kind == "switch"):
                assert {check.arm, check.minus} - {None} <= {c.control, c.treatment}, (name, c.claim)


def test_cli_list_dry_run_and_unknown_experiment(tmp_path, capsys):
    assert main(["lab", "list"]) == 0
    out = capsys.readouterr().out
    assert "clip_higher:" in out and "moe_routing:" in out and "needs" not in out
    assert main(["lab", "clip_higher", "--out", str(tmp_path), "--seeds", "2", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[0].startswith("grpoplus train --preset dapo") and "seed=1" in lines[1]
    assert main(["lab", "nope", "--out", str(tmp_path)]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()  # one line, naming every experiment there is
    assert "unknown lab experiment 'nope'" in err and all(name in err for name in EXPERIMENTS.names())


def test_an_experiment_needing_a_missing_key_is_listed_and_skipped(tmp_path, capsys, monkeypatch):
    needy = Experiment(**{**TOY.__dict__, "name": "needy", "requires": ("algo.not_a_key",)})
    monkeypatch.setitem(EXPERIMENTS._items, "needy", needy)
    assert main(["lab", "list"]) == 0
    assert "needs algo.not_a_key" in capsys.readouterr().out
    fake = FakeTrain()
    with pytest.raises(ValueError, match="needs the config key.s. algo.not_a_key"):
        run_experiment("needy", tmp_path, seeds=1, train_fn=fake, log=lambda _: None)
    assert fake.calls == []


def test_moe_routing_runs_routing_replay_against_a_differing_sampler(tmp_path):
    """(f): the replay arms switch algo.routing_replay, and the sampler differs from the learner
    (otherwise R2 and R3 replay the same experts and give the same run)."""
    from grpoplus.config import build_config

    experiment = EXPERIMENTS.get("moe_routing")
    configs = {arm.name: build_config(arm.preset or experiment.preset, overrides=o)
               for arm, _, o in every_run(experiment, tmp_path, 1)}
    assert {name: c.algo.routing_replay for name, c in configs.items()} == {
        "grpo_token": "off", "grpo_r2": "r2", "grpo_r3": "r3", "gspo": "off"}
    assert {c.rollout.quantization for c in configs.values()} == {"int8"}
    # every arm, GSPO included, takes the same number of updates per rollout batch (several, so routing can flip)
    assert {(c.algo.num_minibatches, c.algo.num_iterations) for c in configs.values()} == {(8, 2)}
    assert {c.learner.model for c in configs.values()} == {"tiny-moe"}
    assert configs["gspo"].algo.loss == "gspo" and configs["grpo_token"].algo.loss != "gspo"



def test_a_real_experiment_runs_through_the_trainer(nano_dir, tmp_path):
    small = (f"model={nano_dir}", "max_steps=2", "eval_every=0", "prompts_per_step=2", "group_size=4",
             "max_new_tokens=6", "eval_size=4", "eval_samples=0", "micro_batch_size=8", "doctor_every=0")
    toy = Experiment(**{**TOY.__dict__, "base": small + ("num_minibatches=2",)})
    verdict = run_experiment(toy, tmp_path, seeds=1, log=lambda _: None)
    (c,) = verdict.comparisons
    assert c.status in ("reproduced", "not reproduced", "inconclusive", "switch inactive")
    assert len(c.effects) == 1 and verdict.steps == 2
    assert (Path(tmp_path) / "runs" / "symmetric-s0" / "metrics.jsonl").is_file()
