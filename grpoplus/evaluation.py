"""Held-out evaluation and the per-step rollout health metrics."""

from __future__ import annotations

import time

import torch

from grpoplus.rollout.base import SamplingParams
from grpoplus.tasks.base import is_correct, reward_fields


def _percentile(values: torch.Tensor, q: float) -> float:
    return float(torch.quantile(values.float(), q)) if values.numel() else 0.0


@torch.no_grad()
def evaluate(engine, task, examples: list, *, max_new_tokens: int, temperature: float, top_p: float,
             samples: int, seed: int) -> dict[str, float]:
    """Greedy pass@1 (``eval/accuracy``), and with ``samples = k > 0`` the sampled pass@1
    (``eval/accuracy_sampled``, mean over all k samples) and pass@k."""
    t0 = time.perf_counter()
    prompts = [ex.prompt for ex in examples]
    index = list(range(len(examples)))
    greedy = engine.generate(prompts, SamplingParams(n=1, max_new_tokens=max_new_tokens, greedy=True),
                             prompt_index=index)
    correct = _correct(task, greedy.texts, examples)
    out = {"eval/accuracy": float(correct.mean()), "eval/length_mean": float(greedy.lengths.float().mean())}
    if samples > 0:
        gen = torch.Generator().manual_seed(seed)
        params = SamplingParams(n=samples, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)
        sampled = engine.generate(prompts, params, prompt_index=index, generator=gen)
        hits = _correct(task, sampled.texts, [examples[g] for g in sampled.group_ids.tolist()])
        hits = hits.view(len(examples), samples)
        out["eval/accuracy_sampled"] = float(hits.float().mean())
        out[f"eval/pass@{samples}"] = float(hits.any(dim=1).float().mean())
    out["time/eval_s"] = time.perf_counter() - t0
    return out


def _correct(task, completions: list[str], examples: list) -> torch.Tensor:
    """[n] float 1/0: the task verifier's verdict on each completion of its example."""
    scores = task.reward([ex.prompt for ex in examples], completions, **reward_fields(examples))
    return torch.tensor([is_correct(s) for s in scores], dtype=torch.float32)


def rollout_metrics(drawn: list, entropy: torch.Tensor | None, mask: torch.Tensor | None) -> dict[str, float]:
    """Reward, group-spread and length statistics over every response sampled this step."""
    rewards = torch.cat([s.rewards for s in drawn])
    correct = torch.cat([s.correct for s in drawn])
    lengths = torch.cat([s.rollouts.lengths for s in drawn]).float()
    finished = torch.cat([s.rollouts.finished for s in drawn])
    out = {"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
           "reward/accuracy": float(correct.float().mean()),
           "length/mean": float(lengths.mean()), "length/max": float(lengths.max()),
           "length/truncated_frac": float((~finished).float().mean()),
           "batch/responses": float(len(rewards))}
    if correct.any():
        out["length/correct_mean"] = float(lengths[correct].mean())
    if (~correct).any():
        out["length/incorrect_mean"] = float(lengths[~correct].mean())
    for name in drawn[0].components:
        values = [v for s in drawn for v in s.components[name] if v is not None]
        if values:
            out[f"reward/{name}/mean"] = sum(values) / len(values)
    out.update(_group_spread(drawn))
    if entropy is not None and mask is not None:
        tokens = entropy[mask > 0]
        out.update({"policy/entropy_mean": float(tokens.mean()) if tokens.numel() else 0.0,
                    "policy/entropy_p10": _percentile(tokens, 0.10),
                    "policy/entropy_p25": _percentile(tokens, 0.25)})
    return out


def _group_spread(drawn: list) -> dict[str, float]:
    n_groups = zero = all_right = all_wrong = 0
    for s in drawn:
        for g in torch.unique(s.rollouts.group_ids):
            rows = s.rollouts.group_ids == g
            n_groups += 1
            if torch.all(s.rewards[rows] == s.rewards[rows][0]):
                zero += 1
            all_right += bool(s.correct[rows].all())
            all_wrong += bool((~s.correct[rows]).all())
    return {"groups/zero_std_frac": zero / n_groups, "groups/all_correct_frac": all_right / n_groups,
            "groups/all_wrong_frac": all_wrong / n_groups, "batch/prompts": float(n_groups)}
