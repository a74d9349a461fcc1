"""Process rewards: a process reward model (PRM) scores each step of a response, for ``algo.turn_credit=process``.

A response's steps are cut on the policy's own sampled ids, so the step ends are exact indices of the tokens the
learner trains on (those ``Rollouts.turn_ends`` holds): a step ends at the token whose decoded text completes an
occurrence of ``step_separator``, and the last step at the response's last sampled token (its eos included). A
separator at the very end of the text opens no empty step: the last step absorbs it. A response without a separator
is one step.

Each step is scored by a token classifier at the last character of the step, in one forward per response over the
prompt + response text re-tokenized by the PRM's own tokenizer (the two tokenizers may differ): the step's last
character is mapped to the PRM token that holds it through the tokenizer's character offsets (when that token also
holds the next characters, the score reads them too). Score, from the PRM's ``num_labels``: 1, the logit (``sigmoid``:
its sigmoid); 2, the probability of label 1 (the softmax of the two logits). An empty response (eos only) is one
step, scored at the prompt's last character.
"""

from __future__ import annotations

import bisect

import torch

from grpoplus.rewards.classifier import load_classifier


def check_step_separator(step_separator: str) -> None:
    """Refuse an empty step separator: the one statement of this refusal, for :class:`ProcessRewardModel` and the
    config rule ``environments`` (data.prm_step_separator)."""
    if not step_separator:
        raise ValueError("config key data.prm_step_separator must be a non-empty string (where a response's steps "
                         "end)")


class ProcessRewardModel:
    """A token-classification PRM in a local Hugging Face directory, loaded once per process and device."""

    def __init__(self, path: str, *, step_separator: str = "\n", device: str = "cpu", batch_size: int = 16,
                 sigmoid: bool = False):
        check_step_separator(step_separator)
        if batch_size < 1:
            raise ValueError(f"ProcessRewardModel: batch_size must be >= 1, got {batch_size}")
        self.model, self.tokenizer = load_classifier("token", path, device, "data.prm")
        self.step_separator, self.batch_size, self.sigmoid = step_separator, batch_size, sigmoid

    def score(self, prompt_texts: list[str], response_ids: list[list[int]], policy_tokenizer
              ) -> tuple[list[list[float]], list[list[int]]]:
        """(step rewards, step ends) of each response: the ends are indices into its sampled ids (``turn_ends``)."""
        if len(prompt_texts) != len(response_ids):
            raise ValueError(f"got {len(prompt_texts)} prompts for {len(response_ids)} responses")
        steps = [split_steps(ids, policy_tokenizer, self.step_separator) for ids in response_ids]
        texts = [p + text for p, (text, _, _) in zip(prompt_texts, steps)]
        # the PRM reads each step's last character: its position in prompt + response
        positions = [[len(p) + c - 1 for c in char_ends] for p, (_, char_ends, _) in zip(prompt_texts, steps)]
        rewards: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            rewards += self._score_batch(texts[start:start + self.batch_size], positions[start:start + self.batch_size])
        return rewards, [token_ends for _, _, token_ends in steps]

    @torch.inference_mode()
    def _score_batch(self, texts: list[str], positions: list[list[int]]) -> list[list[float]]:
        batch = self.tokenizer(texts, padding=True, return_offsets_mapping=True, return_tensors="pt")
        device = next(self.model.parameters()).device
        logits = self.model(input_ids=batch["input_ids"].to(device),
                            attention_mask=batch["attention_mask"].to(device)).logits.float().cpu()
        scores = token_scores(logits, self.sigmoid)  # [B, L]
        return [[float(scores[row, token_at(offsets, pos)]) for pos in row_positions]
                for row, (offsets, row_positions) in enumerate(zip(batch["offset_mapping"].tolist(), positions))]


def token_scores(logits: torch.Tensor, sigmoid: bool = False) -> torch.Tensor:
    """[B, L] scores from [B, L, num_labels] logits: the logit (1 label; ``sigmoid``: its sigmoid) or the probability
    of label 1 (2 labels).

    >>> token_scores(torch.tensor([[[0.0, 0.0], [1.0, 1.0]]])), token_scores(torch.tensor([[[0.0]]]), sigmoid=True)
    (tensor([[0.5000, 0.5000]]), tensor([[0.5000]]))
    """
    if logits.shape[-1] == 1:
        return torch.sigmoid(logits[..., 0]) if sigmoid else logits[..., 0]
    if logits.shape[-1] == 2:
        return logits.softmax(-1)[..., 1]
    raise ValueError(f"a process reward model's score needs num_labels 1 or 2, got {logits.shape[-1]}")


def token_at(offsets: list[list[int]], position: int) -> int:
    """The index of the last token (of non-empty span) that starts at or before character ``position``: the token
    holding it. Special and padding tokens have empty spans and are skipped; a position before every token maps to
    the first token.

    >>> token_at([[0, 0], [0, 2], [2, 3], [0, 0]], 1), token_at([[0, 0], [0, 2], [2, 3], [0, 0]], 2)
    (1, 2)
    """
    real = [(start, i) for i, (start, end) in enumerate(offsets) if end > start]
    k = bisect.bisect_right([start for start, _ in real], position) - 1
    return real[k][1] if k >= 0 else 0


def split_steps(ids: list[int], tokenizer, separator: str) -> tuple[str, list[int], list[int]]:
    """(the response's decoded text, each step's end in characters of that text (exclusive), each step's last token
    index in ``ids``). See the module docstring for where a step ends.

    The token that completes the k-th separator is the shortest prefix of ``ids`` whose decoded text holds k of them
    (found by bisection: a prefix's separator count only grows with its length), so the search decodes
    O(steps x log(tokens)) prefixes, not one per token.
    """
    if not ids:
        return "", [], []
    text = tokenizer.decode(ids, skip_special_tokens=True)
    char_ends = separator_ends(text, separator)
    if char_ends and char_ends[-1] == len(text):
        char_ends.pop()  # a separator at the very end: the last step absorbs it
    token_ends, low = [], 0
    for k in range(1, len(char_ends) + 1):
        low = _shortest_prefix(ids, tokenizer, separator, k, low)
        token_ends.append(low - 1)
    return text, char_ends + [len(text)], token_ends + [len(ids) - 1]


def separator_ends(text: str, separator: str) -> list[int]:
    """Character positions just after each non-overlapping occurrence of ``separator`` (as ``str.count`` counts them).

    >>> separator_ends("a\\nb\\n\\nc", "\\n"), separator_ends("a\\nb\\n\\nc", "\\n\\n")
    ([2, 4, 5], [5])
    """
    ends, at = [], text.find(separator)
    while at >= 0:
        ends.append(at + len(separator))
        at = text.find(separator, at + len(separator))
    return ends


def _shortest_prefix(ids: list[int], tokenizer, separator: str, count: int, low: int) -> int:
    """The least n >= ``low`` (n >= 1) such that ``ids[:n]`` decodes to a text holding ``count`` separators (one
    token may complete several: ``\\n\\n`` with separator ``\\n``)."""
    lo, hi = max(low, 1), len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if tokenizer.decode(ids[:mid], skip_special_tokens=True).count(separator) >= count:
            hi = mid
        else:
            lo = mid + 1
    return lo
