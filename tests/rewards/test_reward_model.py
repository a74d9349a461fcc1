"""The `reward_model` reward: a sequence classifier's score, batched in-process, loaded once per process."""

import doctest
import math
import warnings

import pytest
import torch
import transformers
from transformers import LlamaForSequenceClassification

from grpoplus.config import build_config
from grpoplus.entry.cli import main
from grpoplus.metrics import read_metrics
from grpoplus.models.tiny import tiny_config
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.rewards import RewardError, RewardPipeline, parse_reward_specs
from grpoplus.rewards import reward_model as rm_module
from grpoplus.rewards.classifier import loaded
from grpoplus.rewards.reward_model import reward_model

PROMPTS = ["12+3=", "7*8=", "(1+2)*3="]
COMPLETIONS = ["15", "56 is the product", "9"]


def independent_score(path, prompt, completion, num_labels, normalize):
    """One unpadded forward of the saved model over <bos> + prompt + completion (the char tokenizer's encoding)."""
    model = LlamaForSequenceClassification.from_pretrained(path).eval()
    ids = torch.tensor([char_tokenizer()(prompt + completion)["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    score = logits[0] if num_labels == 1 else logits[1] - logits[0]
    return float(torch.sigmoid(score) if normalize == "sigmoid" else score)


@pytest.mark.parametrize("num_labels", [1, 2])
@pytest.mark.parametrize("normalize", ["none", "sigmoid"])
def test_scores_equal_an_unpadded_forward_of_each_text(classifier_dir, num_labels, normalize):
    path = classifier_dir("sequence", num_labels)
    # batch_size=2: a padded batch of two texts of different lengths, then a batch of one
    got = reward_model(PROMPTS, COMPLETIONS, path=path, batch_size=2, normalize=normalize)
    want = [independent_score(path, p, c, num_labels, normalize) for p, c in zip(PROMPTS, COMPLETIONS)]
    assert got == pytest.approx(want, abs=1e-5)
    assert len(set(round(x, 6) for x in got)) == 3  # the texts are told apart
    if normalize == "sigmoid":
        assert all(0.0 < x < 1.0 for x in got)


def test_a_long_text_keeps_its_end(classifier_dir):
    path = classifier_dir("sequence", 1)
    got = reward_model(["a long prompt: "], ["and the answer is 42"], path=path, max_length=8)
    model = LlamaForSequenceClassification.from_pretrained(path).eval()
    tok = char_tokenizer()
    kept = tok.encode("a long prompt: and the answer is 42", add_special_tokens=False)[-7:]  # "r is 42"
    ids = torch.tensor([[tok.bos_token_id] + kept])  # <bos> + the last 7 characters: 8 tokens
    with torch.no_grad():
        assert got[0] == pytest.approx(float(model(input_ids=ids).logits[0, 0]), abs=1e-5)


def test_the_model_is_loaded_once_per_process_and_device(new_classifier, monkeypatch):
    path = new_classifier("rm", "sequence", 1, seed=3)
    calls = []
    original = transformers.AutoModelForSequenceClassification.from_pretrained

    def counting(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForSequenceClassification, "from_pretrained", counting)
    first = reward_model(PROMPTS, COMPLETIONS, path=path)
    held = loaded()[("sequence", path, "cpu")]
    second = reward_model(PROMPTS[:1], COMPLETIONS[:1], path=path)
    assert calls == [path]
    assert loaded()[("sequence", path, "cpu")] is held
    assert second == pytest.approx(first[:1], abs=1e-6)


def test_a_missing_directory_is_a_one_line_error_naming_it(tmp_path):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="AutoModelForSequenceClassification") as err:
        reward_model(PROMPTS, COMPLETIONS, path=missing)
    assert missing in str(err.value) and "\n" not in str(err.value)


def test_a_model_that_is_not_a_sequence_classifier_is_refused(nano_dir, classifier_dir, new_classifier):
    with pytest.raises(ValueError, match="LlamaForCausalLM, not a \\*ForSequenceClassification") as err:
        reward_model(PROMPTS, COMPLETIONS, path=nano_dir)
    assert nano_dir in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="LlamaForTokenClassification"):
        reward_model(PROMPTS, COMPLETIONS, path=classifier_dir("token", 1))
    three = new_classifier("three", "sequence", 3)
    with pytest.raises(ValueError, match="num_labels=3"):
        reward_model(PROMPTS, COMPLETIONS, path=three)


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="needs path=DIR"):
        reward_model(PROMPTS, COMPLETIONS)
    with pytest.raises(ValueError, match="normalize must be one of none, sigmoid"):
        reward_model(PROMPTS, COMPLETIONS, path="x", normalize="tanh")


def test_a_bad_path_stops_the_pipeline_with_its_message(tmp_path):
    pipe = RewardPipeline(parse_reward_specs([f"reward_model:path={tmp_path / 'nowhere'}"]))
    with pytest.raises(RewardError, match="is not a directory; expected a local Hugging Face directory") as err:
        pipe(PROMPTS, COMPLETIONS, {})
    assert str(err.value).startswith("reward_model: ")  # the run stops with the one line itself, no retry per sample


def test_with_a_worker_pool_it_still_scores_in_this_process(new_classifier):
    path = new_classifier("pooled", "sequence", 2, seed=5)
    specs = parse_reward_specs([f"reward_model:0.5:path={path}", "format"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "cannot be sent to a worker" warning either
        pipe = RewardPipeline(specs, workers=1)
    try:
        result = pipe(PROMPTS, COMPLETIONS, {"answer": ["15", "56", "9"]})
    finally:
        pipe.close()
    assert ("sequence", path, "cpu") in loaded()  # loaded here: a pool worker's copy would be in its own process
    want = reward_model(PROMPTS, COMPLETIONS, path=path)
    assert result.components["reward_model"] == pytest.approx(want, abs=1e-6)
    assert result.total == pytest.approx([0.5 * r + (f or 0.0) for r, f in zip(want, result.components["format"])])


def digit_preferring_model(path) -> str:
    """A reward model whose score is +1 when the text ends with a digit, -1 otherwise: its layers add nothing to the
    residual stream (output projections zeroed), a token's embedding is +-1 on dimension 0 (+ for digits), the final
    RMSNorm scales that to +-sqrt(hidden), and the head reads dimension 0 over sqrt(hidden)."""
    tok = char_tokenizer()
    config = tiny_config(len(tok), size="nano", num_labels=1, pad_token_id=tok.pad_token_id)
    model = LlamaForSequenceClassification(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = model.model.embed_tokens.weight
        embed.zero_()
        embed[:, 0] = -1.0
        embed[tok.convert_tokens_to_ids(list("0123456789")), 0] = 1.0
        model.score.weight.zero_()
        model.score.weight[0, 0] = 1.0 / math.sqrt(config.hidden_size)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_a_reward_model_that_prefers_a_final_digit(tmp_path):
    path = digit_preferring_model(tmp_path / "digits")
    got = reward_model(["q: "] * 4, ["12", "ab", "3 4", "4 a"], path=path, batch_size=3)
    assert got == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-4)


def test_a_spec_with_several_parameters_reads_the_same_quoted_or_not_on_the_command_line():
    want = [("reward_model", 0.5, {"path": "/rm", "normalize": "sigmoid"})]
    quoted = build_config(overrides=['rewards=[task,"reward_model:0.5:path=/rm,normalize=sigmoid"]']).data.rewards
    assert [(c.name, c.weight, c.kwargs) for c in parse_reward_specs(quoted[1:])] == want
    bare = build_config(overrides=["rewards=[task,reward_model:0.5:path=/rm,normalize=sigmoid]"]).data.rewards
    assert bare == ["task", "reward_model:0.5:path=/rm", "normalize=sigmoid"]  # YAML's list split the spec
    assert [(c.name, c.weight, c.kwargs) for c in parse_reward_specs(bare[1:])] == want


SMALL = ["prompts_per_step=4", "group_size=4", "max_new_tokens=10", "eval_size=4", "eval_samples=2",
         "progress=false", "loggers=[]", "doctor_every=0", "micro_batch_size=8"]


def test_train_with_a_reward_model(nano_dir, tmp_path):
    path = digit_preferring_model(tmp_path / "digits")
    out = tmp_path / "run"
    rewards = f'rewards=[task,"reward_model:path={path},normalize=sigmoid"]'
    assert main(["train", "--model", nano_dir, "--out", str(out), "max_steps=2", "eval_every=0", *SMALL,
                 rewards, "reward_workers=1"]) == 0
    records = [r for r in read_metrics(out) if r["step"] > 0]
    assert len(records) == 2
    for record in records:  # sigmoid(+-1): every response scores 0.269 or 0.731
        assert 0.26 < record["reward/reward_model/mean"] < 0.74
        assert all(math.isfinite(v) for v in record.values() if isinstance(v, float))


def test_docstring_examples():
    result = doctest.testmod(rm_module)
    assert result.attempted > 0 and result.failed == 0
