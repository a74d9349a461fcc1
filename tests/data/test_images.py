"""Rows with images (``images``: paths, bytes, datasets Image values, PIL images): checked where they are read (a
missing or broken image is a bad row, skipped with its line), shown in the prompt through the model's chat template,
and trained on by a vision-language policy loaded from its directory (``grpoplus train model=DIR``)."""

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from grpoplus.data import load_records
from grpoplus.data.images import image_messages, image_sources, load_image
from grpoplus.entry.cli import main
from grpoplus.metrics import read_metrics
from grpoplus.models.load import load_policy
from grpoplus.models.tiny_vision import tiny_vision_model
from grpoplus.models.vision import VISION_PARTS, processor_of

SMALL = ["prompts_per_step=2", "group_size=3", "max_new_tokens=6", "eval_size=2", "eval_samples=0", "progress=false",
         "loggers=[]", "doctor_every=0", "save_every=0", "micro_batch_size=6", "max_steps=2"]


def picture(seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (56, 56, 3), dtype=np.uint8))


def png_bytes(seed: int) -> bytes:
    buffer = io.BytesIO()
    picture(seed).save(buffer, format="PNG")
    return buffer.getvalue()


def test_every_source_of_an_image_decodes_to_the_same_pixels(tmp_path):
    picture(1).save(tmp_path / "a.png")
    sources = image_sources(["a.png", png_bytes(1), {"bytes": png_bytes(1), "path": None}, picture(1)], base=tmp_path)
    arrays = [np.asarray(load_image(s)) for s in sources]
    assert all(np.array_equal(a, arrays[0]) for a in arrays[1:]) and arrays[0].shape == (56, 56, 3)


def test_a_missing_or_broken_image_is_a_bad_row_named_by_its_line(tmp_path):
    picture(0).save(tmp_path / "ok.png")
    (tmp_path / "broken.png").write_bytes(b"not an image")
    rows = [{"prompt": "how many?", "answer": "3", "images": ["ok.png"]},
            {"prompt": "how many?", "answer": "3", "images": ["missing.png"]},
            {"prompt": "how many?", "answer": "3", "images": "broken.png"},
            {"prompt": "how many?", "answer": "3", "images": [42]}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load_records(tmp_path / "rows.jsonl")
    assert len(data.records) == 1 and data.records[0]["fields"]["images"] == (tmp_path / "ok.png",)
    reasons = dict(data.skipped)
    assert reasons[2] == f"image 0 ({tmp_path / 'missing.png'}) does not exist"
    assert reasons[3].startswith(f"image 0 ({tmp_path / 'broken.png'}) does not decode as an image: ")
    assert reasons[4] == "an image must be a path, bytes, a datasets Image value or a PIL image, got int"
    with pytest.raises(ValueError, match=r"rows.jsonl: line 2: image 0 .* does not exist$"):
        load_records(tmp_path / "rows.jsonl", on_bad_row="error")


def test_a_prompt_shows_its_images_before_its_text_and_counts_must_agree():
    assert image_messages("how many?", 2) == [
        {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "how many?"}]}]
    shown = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "this?"}]}]
    assert image_messages(shown, 1) == shown
    with pytest.raises(ValueError, match=r"^the prompt's messages show 1 image\(s\) and the row has 2$"):
        image_messages(shown, 2)


@pytest.fixture
def vlm_dir(tmp_path):
    model, processor = tiny_vision_model("qwen2_5_vl")
    path = tmp_path / "vlm"
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def test_a_vision_language_model_loads_from_its_dir_with_its_processor(vlm_dir):
    model, tokenizer = load_policy(str(vlm_dir))
    processor = processor_of(tokenizer)
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    out = processor(text=[processor.apply_chat_template(image_messages("hi", 1), add_generation_prompt=True,
                                                        tokenize=False)], images=[[picture(0)]], return_tensors="pt")
    assert "pixel_values" in out and (out["input_ids"] == model.config.image_token_id).sum() == 4


def test_train_runs_a_vision_language_policy_on_rows_with_images(vlm_dir, tmp_path):
    for k in range(6):
        picture(k).save(tmp_path / f"{k}.png")
    rows = [{"prompt": f"how many dots? {k}", "answer": str(k % 3), "images": [f"{k}.png"]} for k in range(6)]
    rows[2:2] = [{"prompt": "gone?", "answer": "1", "images": ["gone.png"]}, {"prompt": "no images", "answer": "1"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "spread.py").write_text("def spread(prompts, completions, **fields):\n"
                                        "    return [sum(map(ord, c)) % 7 / 7 for c in completions]\n")
    out = tmp_path / "run"
    before = {k: v.clone() for k, v in load_policy(str(vlm_dir))[0].state_dict().items()}
    assert main(["train", "--model", str(vlm_dir), "--data", str(tmp_path / "rows.jsonl"), "--out", str(out),
                 f"data.rewards=[{tmp_path / 'spread.py'}:spread]", *SMALL, "save_every=2"]) == 0
    records = read_metrics(out)
    assert [r["step"] for r in records][-1] == 2 and records[-1]["reward/errors"] == 0.0
    assert records[0]["data/bad_rows"] == 1  # the missing image's row, left out (a text-only row is a fine row)
    trained, _ = load_policy(str(out / "checkpoints" / "step-2"))  # a model dir: its processor saved with it
    moved = {k for k, v in trained.state_dict().items() if not torch.equal(v, before[k])}
    assert moved and not any(f".{part}." in f".{k}." for k in moved for part in VISION_PARTS)  # the tower frozen


def test_the_dry_run_counts_no_optimizer_state_for_the_frozen_vision_tower(vlm_dir, tmp_path):
    from grpoplus.dryrun import dry_run
    from grpoplus.models.tiny_vision import tiny_vision_model
    from grpoplus.models.vision import vision_parameters

    model, _ = tiny_vision_model("qwen2_5_vl")
    total, tower = sum(p.numel() for p in model.parameters()), vision_parameters(model)
    assert 0 < tower < total
    frozen, trained = (
        {i.what.split(" (")[0]: i.bytes for i in dry_run(overrides=[f"learner.model={vlm_dir}", "task=shapes", *extra]
                                                         ).devices[0].items}
        for extra in ([], ["learner.train_vision=true"]))
    assert frozen["gradients, fp32"] == (total - tower) * 4 and trained["gradients, fp32"] == total * 4
    assert frozen["weights, fp32 master"] == trained["weights, fp32 master"] == total * 4


@pytest.mark.parametrize("extra", [[], ["env=guess"], ["data.chat_template=false"]])
def test_rows_with_images_for_a_text_model_are_refused_in_one_line_naming_the_row(tmp_path, capsys, extra):
    # a chat template (or none), a multi-turn run (whose episodes render the prompts), or prompts as written: the
    # same line before anything loads a rollout engine
    picture(0).save(tmp_path / "a.png")
    rows = [{"prompt": "x?", "answer": "1"}, {"prompt": "y?", "answer": "1", "images": ["a.png"]}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["train", "--model", "tiny-untrained", "--data", str(tmp_path / "rows.jsonl"), "--out",
                 str(tmp_path / "run"), *SMALL, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"grpoplus train: error: {tmp_path / 'rows.jsonl'} line 2: the row shows 1 image(s), and the policy "
                   f"{'(tiny-untrained) ' if extra else ''}is a text model (it comes with no image processor): use a "
                   "vision-language model (an image-text-to-text model directory, or tiny-vlm), or rows without images")
