"""Tokens per step for a dry run: the response budget from the config, the prompt tokens measured on the
training prompts where a tokenizer can be had without loading a model (the built-in character tokenizer,
or the tokenizer files of a model on disk)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from grpoplus.data.lengths import prompt_tokens
from grpoplus.models.vision import image_counter, processor_of
from grpoplus.plan import RunPlan

PROMPT_SAMPLE = 256
"""Training prompts tokenized to estimate the prompt length (the first ones of the training split)."""


@dataclass(frozen=True)
class Tokens:
    """One rollout batch's size in responses and tokens, and the optimizer steps it feeds."""

    rows: int  # responses per rollout batch: prompts_per_step x group_size
    budget: int  # most tokens per response: max_new_tokens, or the episode budget of a multi-turn run
    multi_turn: bool
    prompt_mean: float | None  # tokens of a training prompt (None: not estimable here)
    prompt_max: int | None
    prompt_source: str  # how the prompt length was measured, or why it was not
    prompt_fit: str | None  # what the run does with prompts past the limit (data.long_prompts); None: all fit
    max_rounds: int  # sampling rounds per step (dynamic sampling refills up to this many)
    updates_per_batch: int  # optimizer steps per rollout batch
    minibatch_rows: int
    micro_batches: int  # per mini-batch (all ranks together)

    @property
    def response_tokens(self) -> int:
        """The most response tokens one sampling round of a step generates."""
        return self.rows * self.budget

    @property
    def prompt_tokens(self) -> int | None:
        """Prompt tokens of one sampling round (each response is scored with its prompt)."""
        return None if self.prompt_mean is None else round(self.rows * self.prompt_mean)

    @property
    def longest_row(self) -> int | None:
        """The longest prompt + response a row can be (what one KV cache row holds at the end)."""
        return None if self.prompt_max is None else self.prompt_max + self.budget


def token_budget(plan: RunPlan) -> Tokens:
    """The token budget of the plan's rollout batches (prompt lengths measured where a tokenizer is at hand)."""
    c, algo, update = plan.collection, plan.learner.algo, plan.learner.update
    rows = c.prompts_per_step * c.group_size
    minibatch = rows // algo.num_minibatches
    by_rows = not update.micro_batch_tokens and update.micro_batch_size != "auto"
    micro = -(-minibatch // update.micro_batch_size) if by_rows else 0
    mean, longest, source, fit = prompt_lengths(plan)
    return Tokens(rows, c.response_budget, c.env is not None, mean, longest, source, fit,
                  algo.max_sampling_rounds if algo.dynamic_sampling else 1, algo.updates_per_batch, minibatch, micro)


def prompt_lengths(plan: RunPlan) -> tuple[float | None, int | None, str, str | None]:
    """(mean, max, how, fit): the token lengths of the first training prompts, as the engine is handed them, and what
    the run will do with the prompts past the model's context (:func:`prompt_fit`)."""
    from grpoplus.assemble.data import build_data

    tokenizer, why = _tokenizer(plan.learner.policy.model)
    if tokenizer is None:
        return None, None, why, None
    try:
        _, train, test = build_data(plan.data, tokenizer, plan.seed)
    except (ValueError, ImportError, OSError, KeyError) as err:
        return None, None, f"unknown (the training prompts could not be read here: {str(err).splitlines()[0]})", None
    prompts = [_text(ex.prompt) for ex in train[:PROMPT_SAMPLE]]
    if not prompts:
        return None, None, "unknown (no training prompts)", None
    images = [getattr(ex, "images", ()) for ex in train[:PROMPT_SAMPLE]]  # their tokens counted (the processor's)
    lengths = prompt_tokens(tokenizer, prompts, images, image_counter(tokenizer))  # as the engines encode them
    turn = ", first turn" if plan.collection.env is not None else ""
    if any(images) and processor_of(tokenizer) is not None:
        turn += ", their images' tokens included"
    return (statistics.fmean(lengths), max(lengths), f"measured on {len(lengths)} training prompts{turn}",
            prompt_fit(plan, tokenizer, train, test))


def prompt_fit(plan: RunPlan, tokenizer, train: list, test: list) -> str | None:
    """The run's own rule (:func:`grpoplus.assemble.data.fit_prompt_lengths`) on every prompt: its refusal, or how
    many prompts it drops or cuts; None when all fit (or the model's context is not known here and no limit is set)."""
    from grpoplus.assemble.data import fit_prompt_lengths

    try:
        fit = fit_prompt_lengths(plan.data, tokenizer, model_context_here(plan.learner.policy.model), train, test)
    except ValueError as err:
        return f"the run would stop: {err}"
    if fit.dropped or fit.truncated:
        return f"{fit.dropped} dropped, {fit.truncated} cut from the left (data.long_prompts={plan.data.long_prompts})"
    return None


def model_context_here(model: str | None) -> int | None:
    """The model's positions read without its weights: the built-in tiny models' config, or a model directory's
    config.json; None elsewhere."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from grpoplus.data.lengths import model_context
    from grpoplus.models.load import is_builtin

    if is_builtin(model):
        from grpoplus.models.tiny import tiny_config
        from grpoplus.models.tokenizer import char_tokenizer

        return model_context(tiny_config(len(char_tokenizer())))  # every built-in tiny model takes as many
    config = Path(model).expanduser() / "config.json"
    return model_context(SimpleNamespace(**json.loads(config.read_text()))) if config.is_file() else None


def _tokenizer(model: str | None):
    """(tokenizer, None), or (None, why not): the built-in character tokenizer, or a model's tokenizer files
    on disk (never its weights)."""
    from pathlib import Path

    from grpoplus.models.load import SMOLLM2, TINY_VISION, TINY_VISION_FAMILY, is_builtin, load_tokenizer

    if model == TINY_VISION:  # its processor's tokenizer, carrying the processor (image tokens counted)
        from grpoplus.models.tiny_vision import VISION_FAMILIES
        from grpoplus.models.vision import with_processor

        processor = VISION_FAMILIES[TINY_VISION_FAMILY]()[1]
        return with_processor(processor.tokenizer, processor), None
    if is_builtin(model):
        from grpoplus.models.tokenizer import char_tokenizer

        return char_tokenizer(), None
    if model != SMOLLM2 and not Path(model).expanduser().exists():
        return None, "unknown (no tokenizer here: the model is not on disk)"
    try:
        return load_tokenizer(model), None
    except (ValueError, ImportError, OSError) as err:
        return None, f"unknown (the tokenizer could not be read: {str(err).splitlines()[0]})"


def _text(prompt) -> str:
    """A prompt as text: a string as it is, chat messages as their contents."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in prompt)
    return str(prompt)
