"""A character-level tokenizer for the built-in tasks.

One token per character, so a model never has to learn how a number was split into
sub-words, and ``decode`` gives back the exact string (no spaces between characters).
It is a ``PreTrainedTokenizerFast``: it saves with ``save_pretrained`` and reloads with
``AutoTokenizer.from_pretrained(dir)`` offline, like any Hugging Face tokenizer.

Encoding a prompt (``add_special_tokens=True``, the default) prepends ``<bos>``; the warm
start and the trainer both tokenize prompts that way and responses without special
tokens, followed by ``<eos>``.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
"""Ids 0..3, in this order."""

ALPHABET = string.digits + "+-*/()=#,.:;?!'\"_<>%^&|[]{}$@~ \n" + string.ascii_lowercase + string.ascii_uppercase
"""Every character the built-in tasks (and short prompt words) use; anything else is ``<unk>``."""


def char_tokenizer() -> PreTrainedTokenizerFast:
    """Build the character tokenizer: ``<pad>``=0, ``<bos>``=1, ``<eos>``=2, ``<unk>``=3, then ``ALPHABET``.

    Left padding (for batched generation). ``decode(ids, skip_special_tokens=True)`` is the
    exact inverse of encoding for text over ``ALPHABET``.

    >>> tok = char_tokenizer()
    >>> ids = tok("12+3=")["input_ids"]
    >>> ids[0] == tok.bos_token_id, len(ids)
    (True, 6)
    >>> tok.decode(ids, skip_special_tokens=True)
    '12+3='
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in ALPHABET:
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # One pre-token per character, whitespace included (isolated, never dropped).
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Fuse joins tokens with no separator, so decoding is the exact inverse.
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A",
        pair="<bos> $A $B",
        special_tokens=[("<bos>", vocab["<bos>"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )
