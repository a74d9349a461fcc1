"""Rollout traces: every trained sample of a step, token by token, in ``RUN/traces/step-NNNNNN.jsonl.gz``.

One JSON object per sample (one line), gzip'ed, written once per step after the update:

- ``step``, ``row`` (its row in the step's batch), ``group`` (its group in the batch), ``prompt_index``,
  ``version`` (the policy version whose weights sampled it: optimizer steps so far, the oldest of the batch),
  ``trained`` (false: the step trained on nothing, every group was filtered out);
- ``prompt_ids``, ``response_ids``: the unpadded token ids;
- ``scored``: false where the sample has no score (a reward failed on it, or its environment broke: it is left out
  of its group's statistics and of the loss);
- ``mask``: one character per response token, ``1`` sampled by the policy, ``t`` a tool's result and ``0`` the
  environment's own text (the observations of a multi-turn trajectory); ``loss_mask``: ``1`` on the tokens that carried loss
  (after the overlong, GFPO and entropy filters);
- ``logp_engine_e6``: the sampler's log-prob of each response token times 10^6, rounded to an integer (micro-nats:
  integers keep the file small and quick to write); ``logp_learner_e6``: the learner's pi_old log-prob of the same
  token, alike (null when the run takes pi_old from the sampler, ``learner.logp_old=rollout``); both 0 on
  environment tokens;
- ``reward`` (the trained total), ``rewards`` (each component, null where it does not apply), ``correct``
  (the verifier's verdict), ``advantage`` (a number, or one per response token with token-level advantages);
- ``finish``: ``stop`` (the end token), ``length`` (the token, turn or context limit), ``env`` (the environment
  ended the trajectory) or ``error`` (the environment raised, timed out or answered malformed); ``end``: a
  multi-turn trajectory's reason (grpoplus.envs.episodes), else null; ``text``: the decoded completion.

The directory stays under a byte budget by thinning older steps (:func:`thin`), and a resumed run removes the
steps after its checkpoint (:class:`TraceWriter`), as it does with metrics.jsonl and samples.jsonl.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from grpoplus.metrics.signals import ENV_FAULTS

if TYPE_CHECKING:  # the page and the reader need no torch
    import torch

    from grpoplus.containers import LearnerTrace, ScoredGroups

FILE = re.compile(r"step-(\d+)\.jsonl\.gz")
LIMIT_ENDS = ("max_turns", "length", "context")


def trace_path(directory: Path, step: int) -> Path:
    return Path(directory) / f"step-{step:06d}.jsonl.gz"


def traced_steps(directory: str | Path) -> dict[int, int]:
    """{step: file size in bytes} of the trace files in ``directory`` (empty when it does not exist)."""
    if not Path(directory).is_dir():
        return {}
    with os.scandir(directory) as entries:
        return {int(m.group(1)): e.stat().st_size for e in entries if (m := FILE.fullmatch(e.name))}


def read_trace(directory: str | Path, step: int) -> list[dict]:
    """The samples of one step's trace file."""
    with gzip.open(trace_path(Path(directory), step), "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def _micro(x: "torch.Tensor") -> list[list[int]]:
    """Log-probs in micro-nats (times 10^6, rounded to integers), as nested lists."""
    import numpy as np

    return np.rint(x.numpy().astype(np.float64) * 1e6).astype(np.int64).tolist()  # numpy: no thread pool to wake


def _finish(finished: bool, end: str | None) -> str:
    if end is None:
        return "stop" if finished else "length"
    return "env" if end == "done" else "error" if end in ENV_FAULTS else "length"


def _bits(mask: "torch.Tensor") -> list[bytes]:
    """[N, T] mask -> each row's ``0``/``1`` characters (ASCII bytes; a row's first t of them are its string)."""
    return [row.tobytes() for row in ((mask > 0).byte() + ord("0")).numpy()]


def _sources(mask: str, sources: list[str] | None) -> str:
    """``mask`` with the runs of ``0`` that hold a tool's result turned to ``t`` (``sources``: one per run)."""
    if not sources or "tool" not in sources:
        return mask
    runs = re.split(r"(0+)", mask)
    k = 0
    for j, run in enumerate(runs):
        if run.startswith("0"):
            runs[j] = "t" * len(run) if k < len(sources) and sources[k] == "tool" else run
            k += 1
    return "".join(runs)


def trace_rows(groups: "ScoredGroups", learned: "LearnerTrace | None", step: int, limit: int) -> list[dict]:
    """The first ``limit`` samples of ``groups`` as trace records; ``learned``: the learner's part, for the rows it
    trained on (None: the step trained on nothing)."""
    r = groups.rollouts
    n = min(limit, len(r.texts))
    prompt_len, response_len = r.prompt_mask[:n].sum(1).tolist(), r.response_mask[:n].sum(1).long().tolist()
    sampled = r.sampled_mask[:n].float()
    prompts, responses = r.prompt_ids[:n].tolist(), r.response_ids[:n].tolist()
    mask, engine = _bits(sampled), _micro(r.logp_roll[:n] * sampled)
    learner = loss = advantages = None
    if learned is not None:
        loss, advantages = _bits(learned.loss_mask[:n]), learned.advantages[:n].tolist()
        learner = None if learned.logp is None else _micro(learned.logp[:n] * sampled)
    rewards, correct, finished = groups.rewards[:n].tolist(), groups.correct[:n].tolist(), r.finished[:n].tolist()
    groups_of, scored = r.group_ids[:n].tolist(), groups.scored_mask[:n].tolist()
    rows = []
    for i in range(n):
        t, p = response_len[i], int(prompt_len[i])
        end = None if r.end_reasons is None else r.end_reasons[i]
        adv = None if advantages is None else advantages[i]
        rows.append({
            "step": step, "row": i, "group": groups_of[i], "prompt_index": r.prompt_index[groups_of[i]],
            "version": r.policy_version, "trained": learned is not None, "scored": bool(scored[i]),
            "prompt_ids": prompts[i][len(prompts[i]) - p:], "response_ids": responses[i][:t],
            "mask": _sources(mask[i][:t].decode(), None if r.observation_sources is None else
                             r.observation_sources[i]), "loss_mask": None if loss is None else loss[i][:t].decode(),
            "logp_engine_e6": engine[i][:t], "logp_learner_e6": None if learner is None else learner[i][:t],
            "reward": rewards[i], "correct": bool(correct[i]),
            "rewards": {k: None if v[i] is None else float(v[i]) for k, v in groups.components.items()},
            "advantage": adv[:t] if isinstance(adv, list) else adv,
            "finish": _finish(bool(finished[i]), end), "end": end, "text": r.texts[i]})
    return rows


def thin(directory: Path, sizes: dict[int, int], max_bytes: int) -> list[int]:
    """Remove trace files until ``sizes`` (step -> bytes, updated in place) is within ``max_bytes``: the steps least
    divisible by 2 first (odd steps, then those not a multiple of 4, of 8, ...), the oldest first among them, so the
    run stays covered at a stride that doubles as it grows; the newest step is never removed. Returns the steps
    removed."""
    total, newest = sum(sizes.values()), max(sizes, default=0)
    removed = []
    for step in sorted((s for s in sizes if s != newest), key=lambda s: ((s & -s).bit_length(), s)):
        if total <= max_bytes:
            break
        trace_path(directory, step).unlink(missing_ok=True)
        total -= sizes.pop(step)
        removed.append(step)
    return removed


class TraceWriter:
    """Writes a step's trace file and keeps the directory within its budget. ``limit``: samples per step (0: none
    written); ``resume_step``: a resumed run's checkpoint step, whose later steps' files are removed (the resumed run
    writes them again)."""

    def __init__(self, directory: str | Path, limit: int, max_bytes: int, resume_step: int | None = None):
        self.directory, self.limit, self.max_bytes = Path(directory), limit, max_bytes
        self.sizes = traced_steps(self.directory)
        for step in [s for s in self.sizes if resume_step is not None and s > resume_step]:
            trace_path(self.directory, step).unlink()
            del self.sizes[step]

    def write(self, step: int, groups: "ScoredGroups", learned: "LearnerTrace | None") -> Path | None:
        """The step's samples to ``step-NNNNNN.jsonl.gz`` (written whole, then renamed: a killed run leaves no
        partial file), then older steps thinned to the budget; None when traces are off."""
        if not self.limit:
            return None
        rows = trace_rows(groups, learned, step, self.limit)
        self.directory.mkdir(parents=True, exist_ok=True)
        path = trace_path(self.directory, step)
        text = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)
        partial = path.with_name(path.name + ".partial")
        partial.write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=1, mtime=0))
        partial.replace(path)
        self.sizes[step] = path.stat().st_size
        thin(self.directory, self.sizes, self.max_bytes)
        return path
