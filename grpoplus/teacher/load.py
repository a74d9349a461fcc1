"""Which teacher ``learner.teacher`` names, loaded once where the learner runs; and the vocabulary check."""

from __future__ import annotations

import torch

ENDPOINT_SCHEMES = ("http://", "https://")


def is_endpoint(spec: str | None) -> bool:
    """True when the teacher is a server's base URL rather than a model to load."""
    return isinstance(spec, str) and spec.startswith(ENDPOINT_SCHEMES)


def load_teacher(spec: str, device: str | torch.device, precision: str = "fp32", task: str | None = None,
                 difficulty: int | None = None):
    """The teacher ``spec`` names: an :class:`~grpoplus.teacher.endpoint.EndpointTeacher` for a URL, else a
    :class:`~grpoplus.teacher.local.LocalTeacher` loaded as ``--model`` loads the policy (a local HF dir, a .gguf
    file, ``smollm2``, a built-in tiny model warm-started on ``task``: :func:`load_model`) on ``device``, its linear
    weights stored in the compute dtype of ``precision`` as the reference's are (it scores under the learner's
    autocast: the same numbers, half the memory). Its output layer
    may have more rows than the policy's (padding rows: Qwen2.5-7B has 152064, Qwen2.5-0.5B 151936, one
    tokenizer): :func:`check_vocabulary` compares the tokens themselves, and a full-vocabulary loss compares the
    rows both have."""
    if is_endpoint(spec):
        from grpoplus.teacher.endpoint import EndpointTeacher

        return ServedTeacher(EndpointTeacher(spec))
    from grpoplus.learner.precision import lower_frozen_linears
    from grpoplus.teacher.local import LocalTeacher

    model, _ = load_model(spec, device, task, difficulty)
    return LocalTeacher(lower_frozen_linears(model, precision))


def load_model(spec: str, device: str | torch.device, task: str | None, difficulty: int | None):
    """``(model, tokenizer)`` of a second model that is not trained (a teacher, a demonstration writer): a built-in
    tiny model (``tiny-teacher``, ...) warm-started on the run's ``task``, else as ``--model`` loads one."""
    from grpoplus.models.footprint import Footprint
    from grpoplus.models.load import is_builtin, load_policy

    if is_builtin(spec):
        from grpoplus.sft.warmstart import load_builtin

        return load_builtin(spec, task, difficulty, device=device)
    return load_policy(spec, device=device, footprint=Footprint(trains=False))


def check_vocabulary(spec: str | None, tokenizer) -> None:
    """Refuse a local teacher whose tokenizer maps any token to another id than the policy's (ALGORITHMS.md
    section 11: a mismatch is an error, never a silent re-tokenization). An endpoint is not checked: it is
    told token ids and answers for them."""
    if spec is None or is_endpoint(spec):
        return
    from grpoplus.models.load import is_builtin, load_tokenizer
    from grpoplus.models.tokenizer import char_tokenizer

    theirs, ours = (char_tokenizer() if is_builtin(spec) else load_tokenizer(spec)).get_vocab(), tokenizer.get_vocab()
    if theirs != ours:
        differ = sorted(set(theirs.items()) ^ set(ours.items()), key=str)[:3]
        raise ValueError(f"teacher {spec!r} has another tokenizer than the policy ({len(theirs)} vs {len(ours)} "
                         f"tokens; e.g. {differ}): on-policy distillation needs the policy's tokenizer")


class ServedTeacher:
    """An endpoint teacher seen as the learner sees a local one: rollouts in, [N, T] tensors out. Each row is sent
    as its prompt's ids and its response's ids (observation tokens of a multi-turn row included: they are context,
    and the learner masks their scores out)."""

    device = "cpu"

    def __init__(self, endpoint):
        self.endpoint = endpoint

    def token_logprobs(self, rollouts) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp_T [N, T] float32, top1 [N, T] bool), zero / False on padding."""
        r = rollouts
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(r.prompt_ids, r.prompt_mask)]
        scores, firsts = self.endpoint.token_logprobs(prompts, r.response_lists())
        logp, top1 = torch.zeros(r.response_ids.shape), torch.zeros(r.response_ids.shape, dtype=torch.bool)
        for i, (row, first) in enumerate(zip(scores, firsts)):
            logp[i, :len(row)] = torch.tensor(row, dtype=torch.float32)
            top1[i, :len(first)] = torch.tensor(first, dtype=torch.bool)
        return logp, top1
