"""Prompts with images are measured with their image tokens (each image's placeholder becomes the tokens its size
gives), as the engine encodes them: the prompt-length check and the dry run count what the model will read, and a
prompt with images is never cut apart."""

import dataclasses

import numpy as np
import pytest
from PIL import Image

from grpoplus.data.lengths import Limit, fit_prompts, prompt_tokens
from grpoplus.models.tiny_vision import VISION_FAMILIES
from grpoplus.models.vision import encode_prompts, image_counter, with_processor


@dataclasses.dataclass(frozen=True)
class Row:
    prompt: str
    images: tuple = ()
    origin: str = ""


def _image(height: int, width: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8))


def _prompt(processor, images: int) -> str:
    content = [{"type": "image"}] * images + [{"type": "text", "text": "how many?"}]
    return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=False)


@pytest.mark.parametrize("family", sorted(VISION_FAMILIES))
def test_a_prompts_length_counts_the_tokens_its_images_become(family, tmp_path):
    processor = VISION_FAMILIES[family]()[1]
    tokenizer = with_processor(processor.tokenizer, processor)
    saved = tmp_path / "wide.png"
    _image(56, 112).save(saved)  # a file: its size read from the header
    shown = [[], [_image(56, 56)], [saved, _image(84, 56)]]
    prompts = [_prompt(processor, len(images)) for images in shown]
    _, mask, _ = encode_prompts(processor, prompts, [[Image.open(s) if not hasattr(s, "size") else s for s in images]
                                                     for images in shown], 0)
    counted = prompt_tokens(tokenizer, prompts, shown, image_counter(tokenizer))
    assert counted == mask.sum(1).tolist()
    assert counted[1] > prompt_tokens(tokenizer, prompts)[1]  # the text alone: fewer


def test_a_prompt_with_images_past_the_limit_is_dropped_or_refused_never_cut():
    processor = VISION_FAMILIES["qwen2_5_vl"]()[1]
    tokenizer = with_processor(processor.tokenizer, processor)
    short, long = Row(_prompt(processor, 1), (_image(56, 56),)), Row(_prompt(processor, 1), (_image(224, 224),), "l3")
    counter = image_counter(tokenizer)
    limit = Limit(prompt_tokens(tokenizer, [short.prompt], [short.images], counter)[0], "data.max_prompt_tokens")
    fit = fit_prompts([short, long], [short], tokenizer, limit, "drop", counter)
    assert fit.train == [short] and fit.dropped == 1  # the text alone would have fit: its image tokens did not
    with pytest.raises(ValueError, match="l3: a prompt with images is not cut"):
        fit_prompts([short, long], [short], tokenizer, limit, "truncate_left", counter)


def test_the_dry_run_measures_the_visual_tasks_prompts_with_their_image_tokens():
    from grpoplus.dryrun import dry_run

    run = dry_run(overrides=["model=tiny-vlm", "task=shapes"])
    assert "images' tokens included" in run.tokens.prompt_source
    # every generated picture is 56 x 56: 4 image tokens (2 x 2 merged patches of 14 x 14 pixels each) where the
    # chat template writes one placeholder
    processor = VISION_FAMILIES["qwen2_5_vl"]()[1]
    assert prompt_tokens(processor.tokenizer, ["<|image_pad|>"])[0] + 3 == \
        prompt_tokens(processor.tokenizer, ["<|image_pad|>"], [[_image(56, 56)]],
                      image_counter(with_processor(processor.tokenizer, processor)))[0]
    from grpoplus.assemble.data import build_data
    from grpoplus.config import build_config
    from grpoplus.data.images import load_image
    from grpoplus.plan import resolve

    tokenizer = with_processor(processor.tokenizer, processor)
    _, train, _ = build_data(resolve(build_config(overrides=["model=tiny-vlm", "task=shapes"])).data, tokenizer, 0)
    _, mask, _ = encode_prompts(processor, [ex.prompt for ex in train[:8]],
                                [[load_image(s) for s in ex.images] for ex in train[:8]], 0)
    assert run.tokens.prompt_max == mask.sum(1).max()  # what the engine's encoding gives
