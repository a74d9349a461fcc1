"""Checkpoints: complete ones only, newest first, pruning, and exact weight round trip."""

import torch

from grpoplus.learner import checkpoint as ckpt
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer


def test_round_trip_and_partial_checkpoints_are_ignored(tmp_path):
    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=1)
    ckpt.save_checkpoint(tmp_path, 2, model, tok, {"step": 2, "x": torch.arange(3)})
    # A save killed before its marker: a temp dir, and a step dir without COMPLETE.
    (tmp_path / "checkpoints" / ".tmp-step-4-123").mkdir()
    (tmp_path / "checkpoints" / "step-6").mkdir()
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest.name == "step-2"
    other = tiny_model(tok, size="nano", seed=2)
    ckpt.load_weights(other, latest)
    for (k, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), k
    assert torch.equal(ckpt.load_state(latest)["x"], torch.arange(3))


def test_keeps_only_the_newest(tmp_path):
    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=1)
    for step in (1, 2, 3):
        ckpt.save_checkpoint(tmp_path, step, model, tok, {"step": step}, keep=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-2", "step-3"]


def test_wrong_model_is_a_clear_error(tmp_path):
    import pytest

    tok = char_tokenizer()
    ckpt.save_checkpoint(tmp_path, 1, tiny_model(tok, size="nano"), tok, {})
    with pytest.raises(ValueError, match="does not match the model"):
        ckpt.load_weights(tiny_model(tok, size="small"), ckpt.latest_checkpoint(tmp_path))
