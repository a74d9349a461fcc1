"""Training from Python (grpoplus.Trainer): data sets, rewards, environments and models as Python objects, callbacks,
the result, resume, and the errors a notebook user gets for what cannot work."""

import json

import pytest
import torch

import grpoplus
from grpoplus import Trainer
from grpoplus.envs.base import StepResult
from grpoplus.metrics import read_metrics
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer

SMALL = dict(prompts_per_step=4, group_size=4, max_new_tokens=6, eval_size=4, eval_samples=1, progress=False,
             loggers=[], chat_template=False, micro_batch_size=16)
ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(6) for b in range(6)]


def test_a_notebook_run_on_rows_with_its_own_reward_and_a_callback_that_stops_it(nano_dir, tmp_path):
    def short(prompts, completions, **fields):  # defined in a function: not importable, registered in-process
        return [1.0 if len(c) < 4 else 0.0 for c in completions]

    seen = []

    def watch(record):
        seen.append(record["step"])
        return record["step"] == 2

    out = tmp_path / "run"
    trainer = Trainer(nano_dir, train_dataset=ROWS, reward_funcs=["math", short], reward_weights=[1.0, 0.5],
                      out=str(out), max_steps=5, callbacks=[watch], **SMALL)
    assert trainer.config.data.rewards == [{"name": "math", "weight": 1.0}, {"name": "short", "weight": 0.5}]
    result = trainer.train()
    assert seen == [0, 1, 2]  # step 0 is the first evaluation; True at step 2 stops the run
    assert [r["step"] for r in result.metrics] == [0, 1, 2] == [r["step"] for r in read_metrics(out)]
    assert result.checkpoint == out / "checkpoints" / "step-2"
    assert 0.0 <= result.final["reward/short/mean"] <= 1.0
    written = [json.loads(line) for line in (out / "inputs" / "train.jsonl").read_text().splitlines()]
    assert written == ROWS
    model, tokenizer = result.load_model()
    assert model.config.vocab_size == len(tokenizer)


def importable_reward(prompts, completions, **fields):
    return [0.0 for _ in completions]


def test_a_module_level_reward_is_named_by_its_import_path():
    trainer = Trainer(train_dataset="unused.jsonl", reward_funcs=[importable_reward], model="m", out="/tmp/x")
    assert trainer.config.data.rewards == [f"{__name__}:importable_reward"]


def test_a_transformers_model_is_saved_into_the_run_and_trained(tmp_path):
    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=3)
    out = tmp_path / "run"
    result = grpoplus.train(model, tokenizer=tok, train_dataset=ROWS, out=str(out), max_steps=1, **SMALL)
    assert result.final["step"] == 1
    saved = out / "inputs" / "model"
    assert (saved / "config.json").is_file() and result.config.learner.model == str(saved)
    with pytest.raises(ValueError, match="needs its tokenizer"):
        Trainer(model, train_dataset=ROWS, out=str(tmp_path / "other"))


class Countdown:
    """A one-number environment: the episode ends at the first turn; reward 1 when the answer holds a digit."""

    def __init__(self, answer: str):
        self.answer = answer

    def reset(self, **row):
        return None

    def step(self, text: str) -> StepResult:
        return StepResult(None, float(any(ch.isdigit() for ch in text)), True, {})


def test_an_environment_factory_defined_in_a_test_runs_a_multi_turn_run(short_turns_dir, tmp_path):
    def make(answer):
        return Countdown(answer)

    result = Trainer(short_turns_dir, train_dataset=ROWS, env=make, out=str(tmp_path / "run"), max_steps=1,
                     max_turns=2, **SMALL).train()
    assert result.config.data.env == "make"
    assert "env/turns_mean" in result.final and "env/return_mean" in result.final


def test_resume_continues_a_run_to_more_steps(nano_dir, tmp_path):
    out = tmp_path / "run"
    Trainer(nano_dir, train_dataset=ROWS, out=str(out), max_steps=2, save_every=2, **SMALL).train()
    result = Trainer.resume(out, overrides=["max_steps=3"]).train()
    assert [r["step"] for r in result.metrics] == [3]
    assert [r["step"] for r in read_metrics(out)] == [0, 1, 2, 3]


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(max_stepz=3), ValueError, "unknown config key 'max_stepz'"),
    (dict(reward_funcs=[lambda p, c: [0.0] * len(c)]), ValueError, "define it with def"),
    (dict(reward_funcs=["math"], reward_weights=[1.0, 2.0]), ValueError, "2 weights for 1 reward_funcs"),
    (dict(reward_funcs=["format:0.2"], reward_weights=[1.0]), ValueError, "has its own weight"),
    (dict(train_dataset=[["2+2=", "4"]]), TypeError, "row 0 is a list, not a mapping"),
    (dict(train_dataset={"prompt": ["2+2="]}), TypeError, "a list of dicts, a datasets.Dataset"),
])
def test_what_cannot_work_fails_when_the_trainer_is_made(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        Trainer("some/model", out=str(tmp_path / "run"), **kwargs)


def test_a_function_only_this_process_knows_is_refused_on_ray(tmp_path):
    pytest.importorskip("ray", reason="cluster=ray needs the ray extra: pip install -e '.[ray]'")
    def mine(prompts, completions, **fields):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match="reward 'mine' is defined where other processes cannot import it"):
        Trainer("some/model", train_dataset=ROWS, reward_funcs=[mine], cluster="ray", out=str(tmp_path / "run"))


def test_a_reward_named_like_a_built_in_is_refused():
    def math(prompts, completions, **fields):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match="already named 'math': rename your function"):
        Trainer("some/model", reward_funcs=[math], out="/tmp/unused")


def test_the_config_dict_and_keywords_set_keys_as_the_command_line_does(tmp_path):
    trainer = Trainer(preset="grpo", config={"rollout": {"group_size": 4}, "eps_high": 0.3}, lr=1e-3,
                      out=str(tmp_path / "run"))
    cfg = trainer.config
    assert (cfg.run.preset, cfg.rollout.group_size, cfg.algo.eps_high, cfg.learner.lr) == ("grpo", 4, 0.3, 1e-3)


def test_torch_values_in_rows_are_written_as_numbers(tmp_path):
    from grpoplus.entry.inputs import dataset_path

    path = dataset_path([{"prompt": "1+1=", "answer": torch.tensor(2)}], tmp_path, "train")
    assert json.loads(open(path).read()) == {"prompt": "1+1=", "answer": 2}


def test_rows_given_for_a_directory_that_holds_a_run_are_refused_before_its_inputs_are_written(nano_dir, tmp_path):
    out = tmp_path / "run"
    Trainer(nano_dir, train_dataset=ROWS, out=str(out), max_steps=1, **SMALL).train()
    kept = (out / "inputs" / "train.jsonl").read_text()
    with pytest.raises(ValueError, match="already holds a run"):
        Trainer(nano_dir, train_dataset=ROWS[:3], out=str(out), max_steps=1, **SMALL)
    assert (out / "inputs" / "train.jsonl").read_text() == kept


def test_rows_with_images_in_memory_are_written_beside_the_rows_and_trained_on(tmp_path):
    # a list of dicts holding PIL images (what a datasets Image column gives), bytes, a datasets Image value and a
    # path: the run keeps them as files and trains a vision-language policy on them
    import io

    import numpy as np
    from PIL import Image

    from grpoplus.data.images import image_sources, load_image

    def picture(seed):
        return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (56, 56, 3), dtype=np.uint8))

    def png(seed):
        buffer = io.BytesIO()
        picture(seed).save(buffer, format="PNG")
        return buffer.getvalue()

    def spread(prompts, completions, **fields):
        return [sum(map(ord, c)) % 7 / 7 for c in completions]

    picture(3).save(tmp_path / "three.png")
    shown = [picture(0), png(1), {"bytes": png(2), "path": None}, str(tmp_path / "three.png")]
    rows = [{"prompt": f"how many? {k}", "answer": "1", "images": [image]} for k, image in enumerate(shown)]
    out = tmp_path / "run"
    result = Trainer("tiny-vlm", train_dataset=rows, reward_funcs=[spread], out=str(out), max_steps=1,
                     **dict(SMALL, chat_template=True, micro_batch_size=4)).train()
    assert result.metrics[0]["data/bad_rows"] == 0
    written = [json.loads(line) for line in (out / "inputs" / "train.jsonl").read_text().splitlines()]
    names = [row["images"][0] for row in written]
    assert names[:3] == ["train-images/0-0.png", "train-images/1-0.img", "train-images/2-0.img"]
    assert names[3] == str(tmp_path / "three.png")
    for k, name in enumerate(names):
        (source,) = image_sources([name], base=out / "inputs")
        assert np.array_equal(np.asarray(load_image(source)), np.asarray(picture(k)))


def test_a_row_whose_image_is_not_an_image_is_refused_when_the_trainer_is_made(tmp_path):
    with pytest.raises(ValueError, match=r"^train row 1: its images: an image must be a path, bytes, a datasets Image "
                                         r"value or a PIL image, got int$"):
        Trainer("tiny-vlm", train_dataset=[{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "1", "images": [7]}],
                out=str(tmp_path / "run"))
