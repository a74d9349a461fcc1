"""Prompts against the model's context (data.max_prompt_tokens, data.long_prompts): prompts too long for the nano
model's 256 positions are refused in one line before training, dropped or cut from the left and counted; the default
limit is the context minus rollout.max_new_tokens."""

import json

import pytest

from grpoplus.assemble.data import fit_prompt_lengths
from grpoplus.config import build_config
from grpoplus.data.lengths import prompt_limit
from grpoplus.entry.cli import main
from grpoplus.metrics import read_metrics
from grpoplus.models.tiny import tiny_model
from grpoplus.plan.data import data_plan
from grpoplus.tasks.base import Example

SMALL = ["prompts_per_step=2", "group_size=2", "max_new_tokens=10", "eval_size=2", "eval_samples=0",
         "progress=false", "loggers=[]", "micro_batch_size=4", "max_steps=1", "threads=1"]
CONTEXT = 256  # the nano model's max_position_embeddings


def _data(tmp_path, lengths: list[int]):
    """Rows whose prompt is ``n`` characters: n + 1 tokens with the character tokenizer's <bos>."""
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": f"{i}+1=".rjust(n, " "), "answer": str(i + 1)} for i, n in enumerate(lengths)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _train(nano_dir, tmp_path, data, *extra) -> int:
    return main(["train", "--model", nano_dir, "--data", data, "--out", str(tmp_path / "run"), *SMALL, *extra])


def test_prompts_past_the_context_are_refused_in_one_line(nano_dir, tmp_path, capsys):
    data = _data(tmp_path, [20] * 8 + [300, 304, 250])  # line 10: 305 tokens, the longest
    assert _train(nano_dir, tmp_path, data) == 2
    full = capsys.readouterr().err
    err = full.strip().splitlines()[-1]
    assert err.startswith("grpoplus train: error: 3 of 11 prompts are longer than 246 tokens")
    assert "the model's 256 positions - rollout.max_new_tokens=10" in err
    assert "d.jsonl line 10, has 305" in err
    for key in ("data.max_prompt_tokens", "rollout.max_new_tokens", "data.long_prompts=truncate_left|drop"):
        assert key in err
    assert "Traceback" not in full and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_drop_trains_on_the_prompts_that_fit_and_counts_the_others(nano_dir, tmp_path, capsys):
    data = _data(tmp_path, [20] * 10 + [300, 300, 280])
    assert _train(nano_dir, tmp_path, data, "long_prompts=drop") == 0
    assert "note: dropped 3 prompts longer than 246 tokens" in capsys.readouterr().err
    records = read_metrics(tmp_path / "run")
    assert records[0]["data/prompts_dropped"] == 3 and records[0]["data/prompts_truncated"] == 0
    assert records[-1]["step"] == 1


def test_truncate_left_keeps_the_last_tokens_and_counts_them(nano_dir, tmp_path, capsys):
    data = _data(tmp_path, [300] * 12)
    assert _train(nano_dir, tmp_path, data, "long_prompts=truncate_left", "max_prompt_tokens=100") == 0
    err = capsys.readouterr().err
    assert "note: cut 12 prompts to their last 100 tokens (data.max_prompt_tokens=100)" in err, err
    records = read_metrics(tmp_path / "run")
    assert records[0]["data/prompts_truncated"] == 12 and records[-1]["step"] == 1


def test_a_limit_past_the_context_is_refused(nano_dir, tmp_path, capsys):
    assert _train(nano_dir, tmp_path, _data(tmp_path, [20] * 8), "max_prompt_tokens=250") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "data.max_prompt_tokens=250 + rollout.max_new_tokens=10 = 260 is past the model's context of 256" in err


def _examples(lengths):
    return [Example("x" * (n - 1), "1", {}, f"row {i}") for i, n in enumerate(lengths)]  # n - 1 chars + <bos>


def test_the_default_limit_is_the_context_minus_max_new_tokens(tok):
    config = tiny_model(tok, size="nano", seed=0).config
    assert config.max_position_embeddings == CONTEXT
    data = data_plan(build_config(overrides=["max_new_tokens=56"]))
    assert prompt_limit(CONTEXT, 56, None).tokens == 200
    fit = fit_prompt_lengths(data, tok, config.max_position_embeddings, _examples([200, 5]), _examples([200]))
    assert (len(fit.train), len(fit.test), fit.dropped, fit.truncated) == (2, 1, 0, 0)
    with pytest.raises(ValueError, match=r"^1 of 3 prompts are longer than 200 tokens .*row 0, has 201"):
        fit_prompt_lengths(data, tok, CONTEXT, _examples([201, 5]), _examples([200]))


def test_a_cut_prompt_re_encodes_within_the_limit(tok):
    data = data_plan(build_config(overrides=["max_new_tokens=56", "long_prompts=truncate_left"]))
    fit = fit_prompt_lengths(data, tok, CONTEXT, [Example("a" * 150 + "b" * 150, "1")], [])
    assert fit.truncated == 1 and fit.train[0].prompt == "a" * 49 + "b" * 150  # 199 characters + <bos> = 200 tokens
    assert len(tok(fit.train[0].prompt)["input_ids"]) == 200


def test_a_multi_turn_run_is_not_measured_here(tok):
    data = data_plan(build_config(overrides=["max_new_tokens=56", "tools=[calculator]"]))
    fit = fit_prompt_lengths(data, tok, CONTEXT, _examples([400]), [])
    assert len(fit.train) == 1 and fit.truncated == fit.dropped == 0


def test_the_dry_run_says_the_run_would_stop(nano_dir, tmp_path, capsys):
    data = _data(tmp_path, [20] * 8 + [300, 304, 250])
    assert main(["train", "--dry-run", "--model", nano_dir, "--data", data, *SMALL]) == 0
    out = capsys.readouterr().out
    assert "prompts past the model's context: the run would stop: 3 of 11 prompts are longer than 246 tokens" in out
