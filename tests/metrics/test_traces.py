"""Rollout traces (grpoplus.metrics.traces) of real runs on the nano model: what the learner saw, token by token;
the disk budget; exact resume; and the page of ``grpoplus traces`` in a headless browser."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys

import pytest
import torch

from grpoplus import algo as A
from grpoplus.assemble import assemble
from grpoplus.config import build_config
from grpoplus.entry.cli import main
from grpoplus.learner.prepare import learner_logprobs
from grpoplus.loop.driver import run_step
from grpoplus.metrics.traces import read_trace, thin, trace_path, trace_rows, traced_steps
from grpoplus.plan import resolve

SMALL = ["prompts_per_step=4", "group_size=4", "max_new_tokens=10", "eval_size=6", "eval_samples=2",
         "progress=false", "loggers=[]", "doctor_every=0", "micro_batch_size=8", "threads=1"]


@pytest.fixture(scope="module")
def run(nano_dir, tmp_path_factory):
    """A 4-step run, checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("traced") / "run"
    assert main(["train", "--model", nano_dir, "--out", str(out), "max_steps=4", "save_every=2", "eval_every=0",
                 "keep_checkpoints=3", *SMALL]) == 0
    return out


@pytest.mark.parametrize("logp_old, given", [("forward", ["num_minibatches=1"]),  # pi_old from the training forward
                                             ("recompute", ["num_minibatches=2"]), ("rollout", ["logp_old=rollout"])])
def test_a_step_traces_what_the_learner_trained_on(nano_dir, tmp_path, logp_old, given):
    """Each sample's learner log-probs are pi_old's (recomputed here on a copy of the weights that sampled them), the
    engine's differ from them by no more than the sampler/learner mismatch, the masks are the rollouts' and the
    advantages the batch's (recomputed from the rewards)."""
    cfg = build_config(overrides=[f"learner.model={nano_dir}", f"run.out={tmp_path}", "preset=grpo", *given, *SMALL])
    c = assemble(resolve(cfg))
    assert c.learner.plan.logp_old == logp_old
    try:
        before = copy.deepcopy(c.learner.parts.policy)
        out = run_step(c, 1)
    finally:
        c.close()
    r = out.groups.rollouts
    rows = trace_rows(out.groups, out.learned, 1, limit=10_000)
    assert len(rows) == len(r.texts) == 16
    expected_adv = A.compute_advantages(out.groups.rewards, r.group_ids, estimator=cfg.algo.adv_estimator,
                                        eps=cfg.algo.adv_eps)
    assert [row["advantage"] for row in rows] == pytest.approx(expected_adv.tolist(), abs=1e-6)
    recomputed, _ = learner_logprobs(before, r, c.learner.plan, with_entropy=False)
    for i, row in enumerate(rows):
        n = int(r.response_mask[i].sum())
        assert row["response_ids"] == r.response_ids[i, :n].tolist()
        assert row["mask"] == "".join(str(int(v)) for v in r.sampled_mask[i, :n].tolist())
        assert row["finish"] == ("stop" if r.finished[i] else "length") and row["version"] == r.policy_version
        engine = torch.tensor(row["logp_engine_e6"]) / 1e6  # micro-nats
        assert engine.tolist() == pytest.approx(r.logp_roll[i, :n].tolist(), abs=1e-6)
        if logp_old == "rollout":  # pi_old is the sampler's: the learner computed none
            assert row["logp_learner_e6"] is None
            continue
        learner = torch.tensor(row["logp_learner_e6"]) / 1e6
        assert learner.tolist() == pytest.approx(recomputed[i, :n].tolist(), abs=1e-5)
        assert (engine - learner).abs().max() < 1e-3  # same weights, both float32 on the CPU: only the kernels differ


def test_a_multi_turn_trace_marks_environment_tokens_and_says_how_each_trajectory_ended():
    from grpoplus.containers import LearnerTrace, Rollouts, ScoredGroups

    n, t = 3, 5
    model_mask = torch.tensor([[1, 1, 0, 0, 1], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.float32)
    response_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.float32)
    r = Rollouts(torch.ones(n, 2, dtype=torch.long), torch.ones(n, 2, dtype=torch.long), torch.arange(n * t).view(n, t),
                 response_mask, -0.5 * model_mask, torch.tensor([True, False, False]), torch.zeros(n, dtype=torch.long),
                 ["a", "b", "c"], [7], model_mask=model_mask, end_reasons=["done", "timeout", "max_turns"])
    groups = ScoredGroups(r, torch.tensor([1.0, 0.0, 0.5]), torch.tensor([True, False, False]),
                          {"task": [1.0, None, 0.0], "env": [0.0, 0.0, 0.5]})
    learned = LearnerTrace(torch.tensor([1.0, -1.0, 0.0]), model_mask, -0.25 * torch.ones(n, t))
    rows = trace_rows(groups, learned, 5, limit=10)
    assert [row["mask"] for row in rows] == ["11001", "100", "111"]  # the response's tokens only, padding cut
    assert [row["finish"] for row in rows] == ["env", "error", "length"]
    assert [row["end"] for row in rows] == ["done", "timeout", "max_turns"]
    assert rows[0]["logp_engine_e6"] == [-500000, -500000, 0, 0, -500000]  # environment tokens: 0
    assert rows[0]["logp_learner_e6"] == [-250000, -250000, 0, 0, -250000]
    assert rows[1]["rewards"] == {"task": None, "env": 0.0} and rows[1]["advantage"] == -1.0
    assert len(trace_rows(groups, None, 5, limit=2)) == 2 and trace_rows(groups, None, 5, 2)[0]["trained"] is False


def test_traces_are_thinned_to_their_budget_odd_steps_first_oldest_first(tmp_path):
    for step in range(1, 11):
        trace_path(tmp_path, step).write_bytes(b"x" * 100)
    sizes = traced_steps(tmp_path)
    assert thin(tmp_path, sizes, 650) == [1, 3, 5, 7]  # 1000 bytes: four odd steps go, oldest first
    assert thin(tmp_path, sizes, 250) == [9, 2, 6, 4]  # then 9, then those not a multiple of 4, then of 8
    assert sorted(traced_steps(tmp_path)) == [8, 10]  # 10, the newest, always stays
    assert thin(tmp_path, traced_steps(tmp_path), 10) == [8]


def test_a_run_writes_one_trace_file_per_step_within_its_budget(nano_dir, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--model", nano_dir, "--out", str(out), "max_steps=4", "eval_every=0",
                 "traces_max_mb=0.0025", "traces=6", *SMALL]) == 0
    sizes = traced_steps(out / "traces")
    assert 4 in sizes and sum(sizes.values()) <= 0.0025 * 2**20 < sum(sizes.values()) + 1200
    assert all(len(read_trace(out / "traces", step)) == 6 for step in sizes)
    assert main(["train", "--model", nano_dir, "--out", str(tmp_path / "off"), "max_steps=1", "eval_every=0",
                 "traces=false", *SMALL]) == 0
    assert not (tmp_path / "off" / "traces").exists()


def test_a_resumed_run_rewrites_the_traces_after_its_checkpoint_exactly(run, tmp_path):
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-4")  # the run resumes from step 2
    (resumed / "traces" / "step-000004.jsonl.gz").write_bytes(b"not a trace")
    assert main(["train", "--resume", str(resumed)]) == 0
    assert sorted(traced_steps(resumed / "traces")) == [1, 2, 3, 4]
    for step in (3, 4):
        assert read_trace(resumed / "traces", step) == read_trace(run / "traces", step)


def test_the_traces_command_names_a_run_without_traces_and_a_missing_step(run, tmp_path, capsys):
    assert main(["traces", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {tmp_path} has no rollout traces ({tmp_path / 'traces'} is "
                                               "missing or empty): train with run.traces=true (the default) to "
                                               "write them")
    assert main(["traces", str(run), "--step", "9"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: step 9 has no trace in {run / 'traces'} (traced steps: 1-4): "
                                               "pick one of them with --step")


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if found := shutil.which(name):
            return found
    return None


def _dom(page, fragment: str, profile) -> str:
    browser = [_chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom",
               f"{page.as_uri()}#{fragment}"]
    done = subprocess.run(browser, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(_chromium() is None, reason="no chromium binary found (Debian: apt-get install -y chromium)")
def test_the_trace_page_shows_the_samples_and_filters_them_in_a_browser(run, tmp_path, capsys):
    page = tmp_path / "page.html"
    assert main(["traces", str(run), "--step", "3", "--out", str(page)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {page}"
    assert "http" not in re.sub(r"<script id='data'.*?</script>", "", page.read_text(), flags=re.S)  # nothing fetched
    rows = read_trace(run / "traces", 3)
    everything = _dom(page, "", tmp_path / "profile")
    assert len(re.findall(r'<tr class="sample[^"]*" data-row="\d+"', everything)) == len(rows) == 16
    assert f'data-shown="{len(rows)}"' in everything
    assert "tokens decoded by the tokenizer of" in everything
    wrong = _dom(page, "status=incorrect&row=0&colour=gap", tmp_path / "profile")
    hidden = {int(m) for m in re.findall(r'data-row="(\d+)"[^>]*hidden', wrong)}
    assert hidden == {row["row"] for row in rows if row["correct"]}
    assert f'data-shown="{sum(not row["correct"] for row in rows)}"' in wrong
    tokens = re.search(r'<h2>row 0 \(group 0.*?<div class="tokens">(.*?)</div>', wrong, re.S).group(1)
    assert tokens.count('class="tok ') == len(rows[0]["prompt_ids"]) + len(rows[0]["response_ids"])
    rewarded = _dom(page, "min=0.5", tmp_path / "profile")
    assert f'data-shown="{sum(row["reward"] >= 0.5 for row in rows)}"' in rewarded


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-x", "-q"]))
