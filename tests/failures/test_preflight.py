"""The failure gallery, before step 1: a reward that fails or cannot tell completions apart is named on real
completions before training starts, and ``grpoplus train --check`` runs that preflight alone."""

from grpoplus.entry.cli import main
from grpoplus.loop.preflight import reward_findings
from grpoplus.metrics import read_metrics

SMALL = ["prompts_per_step=4", "group_size=4", "max_new_tokens=10", "eval_size=4", "eval_samples=0",
         "progress=false", "loggers=[]", "micro_batch_size=8", "threads=1"]
REWARDS = """
def constant(prompts, completions, **fields):
    return [0.0] * len(completions)

def flaky(prompts, completions, **fields):
    if any(len(c) % 3 == 0 for c in completions):  # the batch call fails; scored one by one, some fail again
        if len(completions) == 1:
            raise ValueError("cannot parse")
    return [float(len(c)) for c in completions]

def words(prompts, completions, **fields):
    return ["good" for _ in completions]
"""


def _rewards(tmp_path, name: str) -> str:
    (tmp_path / "rewards.py").write_text(REWARDS)
    return f"rewards=[{tmp_path / 'rewards.py'}:{name}]"


def test_check_names_a_reward_that_scores_every_completion_alike_and_writes_nothing(nano_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--check", "--preset", "grpo", "--model", nano_dir, "--out", str(out),
                 _rewards(tmp_path, "constant"), *SMALL])
    printed = capsys.readouterr().out
    assert code == 1
    assert "check: data: " in printed and "check: rewards: 8 completions of the first 2 prompts scored by constant" \
        in printed
    assert "check: finding: every one of the 8 scored completions of the first 2 prompts got reward 0" in printed
    assert not out.exists()  # --check trains nothing and writes nothing


def test_check_passes_the_built_in_task(tmp_path, capsys):
    code = main(["train", "--check", "--out", str(tmp_path / "run"), "eval_size=4", "threads=1"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert printed.rstrip().endswith("check: ok: nothing found that stops the run or makes it learn nothing")


def test_a_reward_that_returns_words_stops_before_step_1_in_one_line(nano_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--model", nano_dir, "--out", str(out), _rewards(tmp_path, "words"), *SMALL])
    err = capsys.readouterr().err
    assert code == 2 and "reward 'words' returned a str at index 0; rewards must be float or None" in err
    assert "Traceback" not in err
    assert not (out / "metrics.jsonl").exists()  # before any step: not even the step-0 evaluation


def test_a_run_names_the_preflight_findings_and_trains_as_it_would_without_them(nano_dir, tmp_path, capsys):
    common = ["--preset", "grpo", "--model", nano_dir, "max_steps=2", "health.stop_after=0",
              _rewards(tmp_path, "constant"), *SMALL]
    assert main(["train", "--out", str(tmp_path / "with"), *common]) == 0
    err = capsys.readouterr().err
    assert "preflight: every one of the 8 scored completions of the first 2 prompts got reward 0" in err
    assert main(["train", "--out", str(tmp_path / "without"), "health.preflight_prompts=0", *common]) == 0
    assert "preflight:" not in capsys.readouterr().err

    def same(records):
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in records]
    assert same(read_metrics(tmp_path / "with")) == same(read_metrics(tmp_path / "without"))  # the draws unchanged


def test_a_reward_failing_on_some_completions_is_named_with_its_count():
    lines = reward_findings([1.0, None, 2.0, None], {"reward/flaky/errors": 2.0, "reward/flaky/timeouts": 1.0,
                                                     "reward/errors": 2.0, "reward/flaky/mean": 1.5}, prompts=1)
    assert lines == ["reward 'flaky' failed on 2 of 4 completions (1 timed out; the rest raised or gave no finite "
                     "number; left out of their groups, the first error is logged above): fix the reward, or raise "
                     "data.reward_timeout_s"]
    assert reward_findings([1.0, 1.0, None], {}, prompts=1)[0].startswith("every one of the 2 scored completions")
    assert reward_findings([1.0, 2.0], {}, prompts=1) == []
