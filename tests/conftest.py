"""Fixtures shared by every test directory."""

import pytest

from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer


@pytest.fixture(scope="module")
def nano_dir(tmp_path_factory) -> str:
    """The built-in nano model (untrained, seed 0) saved as a Hugging Face model directory."""
    path = tmp_path_factory.mktemp("nano")
    tok = char_tokenizer()
    tiny_model(tok, size="nano", seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture
def one_thread():
    """torch on one thread for the test (restored after): exact comparisons and steady timings."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
