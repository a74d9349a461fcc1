"""Held-out evaluation: greedy accuracy, and from n sampled responses per prompt, at the evaluation's own sampling,
the sampled accuracy and pass@k by the unbiased estimator."""

import pytest
import torch

from grpoplus.containers import Rollouts
from grpoplus.loop.evaluation import evaluate
from grpoplus.tasks.base import Example


class ScriptedEngine:
    """Answers prompt p's j-th sampled response from ``script[p][j]`` (greedy: its first), and records the
    SamplingParams of every call."""

    name = "scripted"

    def __init__(self, script: list[list[str]]):
        self.script = script
        self.calls = []

    def generate(self, prompts, params, prompt_index=None, generator=None) -> Rollouts:
        self.calls.append(params)
        texts = [self.script[p][j] for p in prompt_index for j in range(params.n)]
        n = len(texts)
        ones = torch.ones(n, 1)
        return Rollouts(prompt_ids=torch.ones(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1, dtype=torch.long),
                        response_ids=torch.ones(n, 1, dtype=torch.long), response_mask=ones, logp_roll=-ones,
                        finished=torch.ones(n, dtype=torch.bool), group_ids=torch.arange(n) // params.n,
                        texts=texts, prompt_index=list(prompt_index))


class ExactTask:
    """Full marks for a completion equal to the answer."""

    def reward(self, prompts, completions, answer, **_):
        return [float(c == a) for c, a in zip(completions, answer)]


EXAMPLES = [Example("p0", "a"), Example("p1", "a"), Example("p2", "a")]
# 4 samples each: 0, 1 and 4 correct; greedy (the first) is right on p2 only
SCRIPT = [["x", "x", "x", "x"], ["x", "a", "x", "x"], ["a", "a", "a", "a"]]


def _evaluate(engine, **kw):
    args = dict(max_new_tokens=5, temperature=0.6, top_p=0.9, samples=4, ks=(1, 2, 4), seed=0)
    return evaluate(engine, ExactTask(), EXAMPLES, **{**args, **kw})


def test_pass_at_k_is_the_unbiased_estimate_from_n_samples():
    out = _evaluate(ScriptedEngine(SCRIPT))
    assert out["eval/accuracy"] == pytest.approx(1 / 3)  # greedy: p2 only
    assert out["eval/accuracy_sampled"] == pytest.approx(5 / 12)  # 0 + 1 + 4 of 12
    assert out["eval/pass@1"] == pytest.approx(5 / 12)  # c/n averaged: (0 + 1/4 + 1) / 3
    # pass@2 per problem: 0, 1 - C(3,2)/C(4,2) = 1/2, 1 -> (0 + 0.5 + 1) / 3
    assert out["eval/pass@2"] == pytest.approx(0.5)
    assert out["eval/pass@4"] == pytest.approx(2 / 3)  # n = k: any of the 4 correct, p1 and p2
    assert not {"eval/pass@3"} & out.keys()  # only the k asked for


def test_sampling_uses_the_evaluation_settings_and_greedy_its_length():
    engine = ScriptedEngine(SCRIPT)
    _evaluate(engine, temperature=0.25, top_p=0.5, max_new_tokens=7)
    greedy, sampled = engine.calls
    assert greedy.greedy and greedy.n == 1 and greedy.max_new_tokens == 7
    assert (sampled.n, sampled.temperature, sampled.top_p, sampled.max_new_tokens) == (4, 0.25, 0.5, 7)
    assert not sampled.greedy


def test_no_samples_is_greedy_only():
    engine = ScriptedEngine(SCRIPT)
    out = _evaluate(engine, samples=0, ks=())
    assert len(engine.calls) == 1 and not [k for k in out if k.startswith("eval/pass@") or k.endswith("sampled")]


def test_a_run_evaluates_at_rollout_eval_temperature_not_the_rollouts():
    from types import SimpleNamespace

    from grpoplus.config import build_config
    from grpoplus.loop.driver import run_eval
    from grpoplus.plan import resolve

    cfg = build_config(overrides=["temperature=1.2", "top_p=0.95", "eval_temperature=0.3", "eval_samples=4",
                                  "eval_k=2", "max_new_tokens=9"])
    engine = ScriptedEngine(SCRIPT)
    c = SimpleNamespace(demos=None, engine=engine, task=ExactTask(), test=EXAMPLES,
                        collect_plan=SimpleNamespace(episodes=None), plan=resolve(cfg))
    out = run_eval(c, step=0)
    sampled = engine.calls[1]
    assert (sampled.temperature, sampled.top_p, sampled.n, sampled.max_new_tokens) == (0.3, 0.95, 4, 9)
    assert out["eval/pass@2"] == pytest.approx(0.5) and "eval/pass@4" not in out  # eval_k replaces [1, n]
