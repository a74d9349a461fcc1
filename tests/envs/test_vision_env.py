"""A vision-language policy in an environment (grpoplus.envs.vision_turns): observations that show images reach the
engine and the learner with the pixels the engine saw, on every family of the tiny vision matrix; an image a text
policy is shown, or one that does not decode, ends its trajectory counted."""

import numpy as np
import pytest
import torch
from PIL import Image

from grpoplus.containers import SamplingParams
from grpoplus.envs.base import MalformedStep, check_observation
from grpoplus.envs.episodes import EpisodeLimits, run_episodes
from grpoplus.learner.logprobs import response_logprobs_from_rollouts
from grpoplus.learner.update import update_policy
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tiny_vision import VISION_FAMILIES, tiny_vision_model
from grpoplus.models.vision import placeholder_ids, with_processor
from grpoplus.rollout.hf import HFEngine
from grpoplus.selftest import fixtures as F

FAMILIES = sorted(VISION_FAMILIES)
STOPS = "abcdefghijklmnopqrstuvwxyz "


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test of this file on one thread."""


def picture(seed: int, height: int = 56, width: int = 56) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8))


class LookAgain:
    """Opens with a picture and a question; answers the first turn with another picture (of its own size), the
    second with text, and ends after the third."""

    def __init__(self, seed: int = 0, bad: bytes | None = None):
        self.seed, self.turn, self.bad = seed, 0, bad

    def reset(self, **row):
        return {"role": "user", "content": [{"type": "image", "image": picture(self.seed)},
                                            {"type": "text", "text": "count?"}]}

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            shown = self.bad if self.bad is not None else picture(self.seed + 10, 56, 84)
            return [{"role": "user", "content": [{"type": "text", "text": "and here?"},
                                                 {"type": "image", "image": shown}]}], 0.5, False, {}
        return "last one.", 1.0, self.turn >= 3, {}


def short_turns(model, processor):
    """Turns that end at any lower-case letter or space as well as the end token (the generation config's stop ids), so an
    episode of the untrained model has several short turns."""
    tokenizer = processor.tokenizer
    model.generation_config.eos_token_id = [tokenizer.eos_token_id] + tokenizer.convert_tokens_to_ids(list(STOPS))
    return model


def _play(model, processor, factory, n=2, seed=0, limits=None):
    short_turns(model, processor)
    tokenizer = with_processor(processor.tokenizer, processor)
    engine = HFEngine(model, processor)
    return run_episodes(engine, tokenizer, factory, [{"prompt": "unused", "answer": "1"}] * 2,
                        SamplingParams(n=n, max_new_tokens=6), limits or EpisodeLimits(max_turns=3, max_context=400),
                        generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_learner_scores_every_turn_with_the_images_the_engine_saw(family):
    model, processor = tiny_vision_model(family)
    rows = iter(range(100))
    rollouts, metrics = _play(model, processor, lambda **row: LookAgain(seed=next(rows)))
    assert metrics["env/errors"] == 0 and metrics["env/turns_mean"] > 1
    placeholders = torch.tensor(placeholder_ids(model.config))
    for i, shown in enumerate(rollouts.vision):
        observed = (rollouts.response_mask[i] - rollouts.model_mask[i]).bool()
        image_ids = torch.isin(rollouts.response_ids[i], placeholders) & rollouts.response_mask[i].bool()
        if len(rollouts.turn_ends[i]) > 1:  # the second picture is in the response, never sampled, carrying no loss
            assert image_ids.any() and not (image_ids & rollouts.model_mask[i].bool()).any()
            assert observed[image_ids].all()
            assert bool(shown.response_tokens) == bool(shown.tokens)  # Qwen's and Gemma's per-token values there too
    sampled = rollouts.model_mask.bool()
    logp, _ = response_logprobs_from_rollouts(model, rollouts)
    torch.testing.assert_close(logp[sampled], rollouts.logp_roll[sampled], atol=1e-5, rtol=0)
    # the observation's pixels matter: blanking them changes what the later turns score
    blank = [type(v)(tokens=v.tokens, response_tokens=v.response_tokens,
                     images={k: torch.full_like(t, 0.5) if k == "pixel_values" else t for k, t in v.images.items()})
             for v in rollouts.vision]
    other, _ = response_logprobs_from_rollouts(model, rollouts, vision=blank)
    assert (other - logp)[sampled].abs().max() > 1e-4


def test_two_updates_train_on_multi_turn_trajectories_with_images():
    model, processor = tiny_vision_model("qwen2_5_vl")
    rollouts, _ = _play(model, processor, lambda **row: LookAgain())
    plan = F.learner_plan(micro_batch_size=3)
    opt, sched = F.optimizer(model)
    before = model.lm_head.weight.detach().clone()
    model.train()
    losses = [update_policy(model, opt, sched, F.batch(model, rollouts, plan, seed=step), F.algo(), plan,
                            first_step=step).metrics["loss/total"] for step in range(2)]
    assert all(np.isfinite(losses)) and not torch.equal(before, model.lm_head.weight)


def test_an_image_that_does_not_decode_ends_its_trajectory_counted(capsys):
    model, processor = tiny_vision_model("qwen2_5_vl")
    rollouts, metrics = _play(model, processor, lambda **row: LookAgain(bad=b"not an image"))
    assert metrics["env/ended/malformed"] == 1.0 and metrics["env/turns_mean"] == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "an environment's step MalformedStep: an observation: " not in err
    assert "does not decode as an image" in err and "counted in env/ended/malformed" in err
    assert torch.isfinite(rollouts.logp_roll).all()


def test_an_image_shown_to_a_text_policy_ends_its_trajectory_in_one_line(tok, capsys):
    model = tiny_model(tok, size="nano", seed=0)
    model.generation_config.eos_token_id = [tok.eos_token_id] + tok.convert_tokens_to_ids(list(STOPS.upper() + STOPS))
    engine = HFEngine(model, tok)

    class Shows(LookAgain):
        def reset(self, **row):
            return None

    rollouts, metrics = run_episodes(engine, tok, lambda **row: Shows(), [{"prompt": "1+1=", "answer": "2"}],
                                     SamplingParams(n=2, max_new_tokens=4), EpisodeLimits(max_turns=3),
                                     generator=torch.Generator().manual_seed(0))
    assert metrics["env/ended/malformed"] == 1.0
    assert rollouts.vision is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the observation shows an image, and the policy is a text model" in err


def test_observations_take_text_and_image_parts_and_nothing_else():
    check_observation({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image", "image": b"x"}]})
    for bad in ({"role": "user", "content": [{"type": "image"}]}, {"role": "user", "content": []},
                {"role": "user", "content": [{"type": "video", "video": "v.mp4"}]}):
        with pytest.raises(MalformedStep, match=r"is not text or a chat message with text content \(or a list of "):
            check_observation(bad)


LOOK_FILE = '''
from PIL import Image


class Look:
    """Shows the row's picture again, larger, after the first turn; ends after the second."""

    def __init__(self, images):
        self.images, self.turns = images, 0

    def reset(self, **row):
        return None  # the row's prompt, with its picture

    def step(self, action):
        self.turns += 1
        if self.turns == 1:
            big = self.images[0].resize((84, 84)) if isinstance(self.images[0], Image.Image) else self.images[0]
            return {"role": "user", "content": [{"type": "image", "image": big}, {"type": "text", "text": "again?"}]}, \\
                0.0, False, {}
        return None, 0.0, True, {}


def make(images):
    return Look(images)
'''


def test_train_runs_a_vision_language_policy_in_an_environment_that_shows_images(tmp_path, monkeypatch):
    import grpoplus.models.tiny_vision as tiny_vision
    from grpoplus.entry.cli import main
    from grpoplus.metrics import read_metrics

    built = tiny_vision.tiny_vision_model

    def ending_turns(*args, **kwargs):  # tiny-vlm as initialised, its turns ending at a letter (so the game goes on)
        model, processor = built(*args, **kwargs)
        return short_turns(model, processor), processor

    monkeypatch.setattr(tiny_vision, "tiny_vision_model", ending_turns)
    (tmp_path / "look.py").write_text(LOOK_FILE)
    out = tmp_path / "run"
    assert main(["train", "--model", "tiny-vlm", "task=shapes", "--out", str(out), f"env={tmp_path / 'look.py'}:make",
                 "max_turns=2", "max_steps=2", "prompts_per_step=2", "group_size=2", "max_new_tokens=6", "eval_size=2",
                 "eval_samples=0", "progress=false", "loggers=[]", "doctor_every=0", "save_every=0"]) == 0
    drawn = [r for r in read_metrics(out) if "env/turns_mean" in r]
    assert len(drawn) == 2 and all(r["env/errors"] == 0 for r in drawn)
    assert any(r["env/obs_token_frac"] > 0 for r in drawn)  # an observation with its picture's tokens was appended


def crop(left: int) -> Image.Image:
    """Crop the picture from the left.

    Args:
        left: columns to drop
    """
    return picture(5).crop((left, 0, 56, 56))


def test_a_tool_that_returns_a_picture_shows_it_to_a_vision_language_policy():
    from grpoplus.envs.tools import ToolEnv
    from grpoplus.envs.vision_turns import vision_observation, vision_opening

    model, processor = tiny_vision_model("qwen2_5_vl")
    env = ToolEnv([crop])
    opening = env.reset(prompt="what is left?", images=(picture(1),))  # the row's image, shown before its text
    assert [p["type"] for p in opening[0]["content"]] == ["image", "text"]
    prompt, shown = vision_opening(processor, opening, env.tool_schemas)
    result = env.step('<tool_call>{"name": "crop", "arguments": {"left": 28}}</tool_call>')
    assert result.observation[0]["role"] == "tool" and result.observation[0]["content"][0]["type"] == "image"
    ids, seen = vision_observation(processor, result.observation)
    placeholders = placeholder_ids(model.config)
    assert sum(i in placeholders for i in prompt) == 4 and sum(i in placeholders for i in ids) == 2  # 56x56, 56 high x 28 wide
    assert seen.images["image_grid_thw"].tolist() == [[1, 4, 2]] and int(seen.tokens["mm_token_type_ids"].sum()) == 2


@pytest.mark.parametrize("prompt", ["count?", [{"role": "user", "content": [{"type": "image"},
                                                                               {"type": "text", "text": "count?"}]}]])
def test_a_rows_images_open_its_trajectory_from_a_text_or_chat_prompt(prompt):
    # a data row's images (an environment whose reset gives no opening): before a text prompt, or in the image
    # entries of a chat prompt, in order
    class Once:
        def reset(self, **row):
            return None

        def step(self, action):
            return None, 1.0, True, {}

    model, processor = tiny_vision_model("qwen2_5_vl")
    engine = HFEngine(short_turns(model, processor), processor)
    rollouts, metrics = run_episodes(engine, with_processor(processor.tokenizer, processor), lambda **row: Once(),
                                     [{"prompt": prompt, "answer": "1", "images": (picture(3),)}],
                                     SamplingParams(n=2, max_new_tokens=6), EpisodeLimits(max_turns=2, max_context=400),
                                     generator=torch.Generator().manual_seed(0))
    assert metrics["env/ended/malformed"] == 0
    assert all(v.images["image_grid_thw"].tolist() == [[1, 4, 4]] for v in rollouts.vision)  # one 56x56 picture
    placeholders = torch.tensor(placeholder_ids(model.config))
    assert (torch.isin(rollouts.prompt_ids, placeholders).sum(1) == 4).all()
