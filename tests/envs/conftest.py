"""Fixtures of the environment tests: the character tokenizer and a nano model that takes short turns."""

import pytest

from grpoplus.models.tiny import tiny_model


@pytest.fixture(scope="module")
def short_turns(tok):
    """``make(**config)``: the untrained nano model whose turns end at any digit, vowel or space as well as <eos>
    (its generation config's stop ids), so an episode has several short turns."""
    def make(**config):
        model = tiny_model(tok, size="nano", seed=0, **config)
        model.generation_config.eos_token_id = [tok.eos_token_id] + tok.convert_tokens_to_ids(list("0123456789aeiou "))
        return model

    return make
