"""The preflight: what a run checks before its first step, so that a mistake costs seconds, not a night.

When the run is assembled, every data row has been read (a bad row skipped or refused with its line) and every
prompt measured against the model's context (``data.max_prompt_tokens``, ``data.long_prompts``). Then, before
step 1, the rewards are called once on real completions: the policy samples ``health.preflight_prompts`` of the
first training prompts a group each (its own generator: the run's draws are unchanged), and the reward pipeline
scores them. A reward that raises on every completion or returns a non-number stops the run there
(:class:`grpoplus.rewards.RewardError`, one line); one that fails on some, or scores every completion alike, is
named in one line each. ``grpoplus train --check`` runs the preflight alone and exits 1 on such a finding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from grpoplus.collect import sample

PREFLIGHT_SEED = 7_919_019
"""Added to run.seed for the preflight's own sampling generator."""


@dataclass
class Preflight:
    """What the reward check saw: its facts (always printed by ``--check``) and its findings (printed always)."""

    facts: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)


def reward_findings(totals: list[float | None], metrics: dict[str, float], prompts: int) -> list[str]:
    """One line per reward that failed on some completions (its ``reward/NAME/errors`` and ``/timeouts``), and one
    when every scored completion got the same total; ``totals`` holds None for a completion whose reward failed (left
    out of its group)."""
    n = len(totals)
    lines = []
    for key in sorted(k for k in metrics if k.startswith("reward/") and k.endswith("/errors") and k.count("/") == 2):
        name = key.split("/")[1]
        timeouts = int(metrics.get(f"reward/{name}/timeouts", 0))
        lines.append(f"reward {name!r} failed on {int(metrics[key])} of {n} completions ({timeouts} timed out; the rest "
                     "raised or gave no finite number; left out of their groups, the first error is logged above): fix "
                     "the reward, or raise data.reward_timeout_s")
    scored = [t for t in totals if t is not None]
    if len(scored) >= 2 and max(scored) == min(scored):
        lines.append(f"every one of the {len(scored)} scored completions of the first {prompts} prompts got reward "
                     f"{scored[0]:g}: a group learns only where its rewards differ; check that the reward can tell "
                     "answers apart (RUN/samples.jsonl once it trains), use prompts the policy sometimes solves, or a "
                     "warm start (grpoplus sft)")
    return lines


def check_rewards(c, prompts: int, seed: int) -> Preflight:
    """Sample a group for each of the first ``prompts`` training prompts with the run's engine and score them with the
    run's scorer (``c``: the assembled components)."""
    k = min(prompts, len(c.train))
    if k <= 0:
        return Preflight()
    generator = torch.Generator().manual_seed(seed + PREFLIGHT_SEED)
    rollouts, _ = sample(c.engine, c.train, list(range(k)), c.collect_plan.params, c.collect_plan.episodes, generator)
    scored, metrics = c.scorer(rollouts)
    totals = [float(r) if keep else None for r, keep in zip(scored.rewards.tolist(), scored.scored_mask.tolist())]
    present = [t for t in totals if t is not None]
    facts = [f"rewards: {len(totals)} completions of the first {k} prompts scored by {', '.join(scored.components)}: "
             f"totals {min(present, default=math.nan):.3g} to {max(present, default=math.nan):.3g}, "
             f"{float(scored.rollouts.finished.float().mean()):.0%} ended before rollout.max_new_tokens"]
    findings = reward_findings(totals, metrics, k)
    if not bool(scored.rollouts.finished.any()):
        findings.append(f"every one of the {len(totals)} completions was cut at rollout.max_new_tokens="
                        f"{c.collect_plan.params.max_new_tokens}: raise it, or check that the model can end its answer "
                        "(its chat template and stop token)")
    return Preflight(facts, findings)
