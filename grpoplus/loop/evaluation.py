"""Held-out evaluation: greedy pass@1 and, from n sampled responses per prompt, pass@k on the task's test split."""

from __future__ import annotations

import time

import torch

from grpoplus.collect import sample
from grpoplus.containers import SamplingParams
from grpoplus.metrics.passk import mean_pass_at_k
from grpoplus.tasks.base import is_correct, reward_fields


@torch.no_grad()
def evaluate(engine, task, examples: list, *, max_new_tokens: int, temperature: float, top_p: float,
             samples: int, ks: tuple[int, ...], seed: int, episodes=None) -> dict[str, float]:
    """Greedy pass@1 (``eval/accuracy``), and with ``samples = n > 0`` responses per prompt sampled at
    ``temperature`` and ``top_p`` the sampled pass@1 (``eval/accuracy_sampled``, mean over all n samples) and
    ``eval/pass@{k}`` for each k of ``ks`` (each <= n), Chen et al. 2021's unbiased estimator
    (:func:`~grpoplus.metrics.passk.pass_at_k`). With ``episodes`` (a multi-turn
    :class:`~grpoplus.envs.episodes.EpisodePlan`) every response is a game played to its end, and
    ``eval/turns_mean`` is the greedy games' mean number of turns."""
    t0 = time.perf_counter()
    index = list(range(len(examples)))
    params = SamplingParams(n=1, max_new_tokens=max_new_tokens, greedy=True)
    greedy, env_metrics = sample(engine, examples, index, params, episodes, None)
    correct = _correct(task, greedy.texts, examples)
    out = {"eval/accuracy": float(correct.mean()), "eval/length_mean": float(greedy.lengths.float().mean())}
    if episodes is not None:
        out["eval/turns_mean"] = env_metrics["env/turns_mean"]
        out["eval/tool_call_frac"] = env_metrics["env/tool_call_frac"]  # trajectories that called a tool
        out["eval/tool_errors"] = env_metrics["env/tool_errors"]
    if samples > 0:
        out.update(_sampled(engine, task, examples, episodes, ks, seed,
                            SamplingParams(n=samples, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)))
    out["time/eval_s"] = time.perf_counter() - t0
    return out


def _sampled(engine, task, examples: list, episodes, ks: tuple[int, ...], seed: int,
             params: SamplingParams) -> dict[str, float]:
    """``params.n`` sampled responses per example: their mean accuracy and pass@k for each k of ``ks``."""
    gen = torch.Generator().manual_seed(seed)
    sampled, _ = sample(engine, examples, list(range(len(examples))), params, episodes, gen)
    hits = _correct(task, sampled.texts, [examples[g] for g in sampled.group_ids.tolist()])
    hits = hits.view(len(examples), params.n)  # [P, n], groups contiguous
    counts = hits.sum(dim=1).long().tolist()  # c of each problem
    out = {"eval/accuracy_sampled": float(hits.mean())}
    out.update({f"eval/pass@{k}": mean_pass_at_k(params.n, counts, k) for k in ks})
    return out


def _correct(task, completions: list[str], examples: list) -> torch.Tensor:
    """[n] float 1/0: the task verifier's verdict on each completion of its example."""
    scores = task.reward([ex.prompt for ex in examples], completions, **reward_fields(examples))
    return torch.tensor([is_correct(s) for s in scores], dtype=torch.float32)
