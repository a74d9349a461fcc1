"""A learned reward: a sequence-classification reward model's score of each (prompt, completion).

Spec: ``reward_model[:weight]:path=DIR[,device=cpu,batch_size=16,max_length=1024,normalize=none,template=auto]``.

The score, from the model's ``num_labels``:

- 1: the logit (``normalize=sigmoid``: its sigmoid, a probability);
- 2: the log-odds of label 1 over label 0, ``logit_1 - logit_0`` (``normalize=sigmoid``: the probability of label 1,
  the softmax of the two logits);
- any other count is refused when the model loads.

The text scored: with ``template=auto``, the conversation [user: prompt, assistant: completion] rendered by the reward
model's chat template when its tokenizer has one, else prompt + completion as one string; ``chat`` or ``plain``
forces either. The prompt is the one the policy was given: a task of chat prompts (``data.chat_template``) has already
put it through the *policy's* template, so its user message then carries the policy's chat markup; ``template=plain``
scores the policy's own rendering (prompt + completion) instead. Longer texts keep their last ``max_length`` tokens:
the end of the response, where its answer is, and where a causal reward model reads its score.

The model is loaded once per process and device (:mod:`grpoplus.rewards.classifier`) and scores whole batches here
(``in_process``): a pool worker would load its own copy and score one sample per call.
"""

from __future__ import annotations

import torch

from grpoplus.rewards.classifier import ClassifierError, load_classifier
from grpoplus.rewards.registry import REWARDS

NORMALIZE = ("none", "sigmoid")
TEMPLATES = ("auto", "chat", "plain")


@REWARDS.register("reward_model")
def reward_model(prompts: list[str], completions: list[str], *, path: str | None = None, device: str = "cpu",
                 batch_size: int = 16, max_length: int = 1024, normalize: str = "none",
                 template: str = "auto") -> list[float]:
    """The reward model in ``path``'s score of each completion (module docstring)."""
    _check_options(path, batch_size, max_length, normalize, template)
    model, tokenizer = load_classifier("sequence", path, device, "reward_model")
    texts, chat = reward_texts(tokenizer, prompts, completions, template)
    scores: list[float] = []
    for start in range(0, len(texts), batch_size):
        logits = _logits(model, tokenizer, texts[start:start + batch_size], max_length, chat)
        scores += sequence_scores(logits, normalize).tolist()
    return scores


reward_model.in_process = True  # RewardPipeline: batched on this process's device, never sent to a pool worker


def _check_options(path, batch_size: int, max_length: int, normalize: str, template: str, **_) -> None:
    """The reward model's parameters no sample can be scored with, refused before it loads: by the reward itself, and
    by the reward pipeline as it parses the specs (``reward_model.check_options``: the config rule ``rewards``)."""
    if not path:
        raise ClassifierError("reward_model needs path=DIR: a local Hugging Face directory holding an "
                              "AutoModelForSequenceClassification and its tokenizer")
    if normalize not in NORMALIZE or template not in TEMPLATES:
        raise ClassifierError(f"reward_model: normalize must be one of {', '.join(NORMALIZE)} (got {normalize!r}) "
                              f"and template one of {', '.join(TEMPLATES)} (got {template!r})")
    if batch_size < 1 or max_length < 1:
        raise ClassifierError(f"reward_model: batch_size and max_length must be >= 1, got {batch_size} and "
                              f"{max_length}")


reward_model.check_options = _check_options


def reward_texts(tokenizer, prompts: list[str], completions: list[str], template: str) -> tuple[list[str], bool]:
    """(the texts the reward model reads, whether they are chat-rendered: they then carry their special tokens)."""
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if template == "chat" and not has_template:
        raise ClassifierError("reward_model: template=chat, but the reward model's tokenizer has no chat template")
    if template == "plain" or not has_template:
        return [p + c for p, c in zip(prompts, completions, strict=True)], False
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}, {"role": "assistant", "content": c}],
                                          tokenize=False) for p, c in zip(prompts, completions, strict=True)], True


@torch.inference_mode()
def _logits(model: torch.nn.Module, tokenizer, texts: list[str], max_length: int, chat: bool) -> torch.Tensor:
    """[B, num_labels] float32 logits of one padded batch, on the CPU."""
    device = next(model.parameters()).device
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_length, add_special_tokens=not chat,
                      return_tensors="pt")
    out = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
    return out.logits.float().cpu()


def sequence_scores(logits: torch.Tensor, normalize: str = "none") -> torch.Tensor:
    """[B] scores from [B, num_labels] logits: the logit (1 label) or the log-odds of label 1 over 0 (2 labels);
    ``sigmoid`` maps either to a probability.

    >>> sequence_scores(torch.tensor([[2.0, 3.0]])), sequence_scores(torch.tensor([[0.0]]), "sigmoid")
    (tensor([1.]), tensor([0.5000]))
    """
    if logits.shape[-1] == 1:
        score = logits[:, 0]
    elif logits.shape[-1] == 2:
        score = logits[:, 1] - logits[:, 0]
    else:
        raise ValueError(f"a reward model's score needs num_labels 1 or 2, got {logits.shape[-1]}")
    return torch.sigmoid(score) if normalize == "sigmoid" else score
