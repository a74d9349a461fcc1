"""Local Hugging Face classifiers that score text (a reward model, a process reward model), loaded once per process.

A reward is called once per rollout batch: reloading a model on every call would cost more than scoring with it, so a
classifier stays loaded for the life of the process, keyed by (kind, path, device). A directory that does not hold the
expected kind of model is refused before any weight is read: ``AutoModelFor*Classification`` would otherwise load a
causal LM with a freshly initialised (random) head and score with it, with only a warning.
"""

from __future__ import annotations

from pathlib import Path

import torch

from grpoplus.rewards.pipeline import RewardError

KINDS = {"sequence": "ForSequenceClassification", "token": "ForTokenClassification"}
"""Kind -> the suffix of the model class the directory's config.json must name."""

LABELS = (1, 2)
"""The label counts a score is defined for (module docstrings of reward_model and prm)."""

_LOADED: dict[tuple[str, str, str], tuple[torch.nn.Module, object]] = {}


class ClassifierError(RewardError, ValueError):
    """A classifier setting no sample can be scored with (a missing directory, the wrong kind of model): the reward
    pipeline stops the run at once with this one line instead of retrying every sample."""


def load_classifier(kind: str, path: str, device: str, what: str) -> tuple[torch.nn.Module, object]:
    """(model in eval mode on ``device``, its tokenizer), loaded at the first call for (kind, path, device) and kept.

    ``what`` names the user's setting in errors (``reward_model``, ``data.prm``). The tokenizer pads on the right (a
    causal model's scores of the real tokens are then those of the unpadded text) and truncates on the left (the end
    of a response, where its answer is, is kept); a tokenizer without a pad token pads with its eos token.
    """
    if kind not in KINDS:
        raise ClassifierError(f"unknown classifier kind {kind!r}; choose one of: {', '.join(KINDS)}")
    key = (kind, str(path), str(device))
    if key not in _LOADED:
        _LOADED[key] = _load(kind, str(path), str(device), what)
    return _LOADED[key]


def _expected(kind: str) -> str:
    return f"a local Hugging Face directory holding an AutoModel{KINDS[kind]} (num_labels 1 or 2) and its tokenizer"


def _load(kind: str, path: str, device: str, what: str) -> tuple[torch.nn.Module, object]:
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoModelForTokenClassification

    if not Path(path).is_dir():
        raise ClassifierError(f"{what}: {path!r} is not a directory; expected {_expected(kind)}")
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as err:
        reason = " ".join(str(err).split())[:200]
        raise ClassifierError(f"{what}: {path!r} has no readable model config ({reason}); "
                              f"expected {_expected(kind)}") from None
    names = list(getattr(config, "architectures", None) or [])
    if not any(name.endswith(KINDS[kind]) for name in names):
        raise ClassifierError(f"{what}: {path!r} holds {', '.join(names) or 'no named architecture'}, not a "
                              f"*{KINDS[kind]} model; expected {_expected(kind)}")
    if config.num_labels not in LABELS:
        raise ClassifierError(f"{what}: {path!r} has num_labels={config.num_labels}; expected {_expected(kind)}")
    cls = AutoModelForSequenceClassification if kind == "sequence" else AutoModelForTokenClassification
    model = cls.from_pretrained(path).to(device).eval()
    return model, _tokenizer(path, model, what)


def _tokenizer(path: str, model: torch.nn.Module, what: str):
    """The directory's tokenizer, padding with a token the model's pooling knows as padding."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ClassifierError(f"{what}: the tokenizer in {path!r} has neither a pad nor an eos token to pad "
                                  "batches with")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side, tokenizer.truncation_side = "right", "left"
    # a sequence classifier pools at the last token that is not its config's pad id: make that the padding we add
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    return tokenizer


def loaded() -> dict[tuple[str, str, str], tuple[torch.nn.Module, object]]:
    """The classifiers this process holds, by (kind, path, device) (a copy: for tests and diagnostics)."""
    return dict(_LOADED)
