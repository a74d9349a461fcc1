"""Vision-language policies (tiny random models of each family, grpoplus.models.tiny_vision): rows with images
through the hf engine and the learner. The learner sees what the engine saw (its log-probs equal the engine's), a
left-padded batch with images equals each row alone, two updates train, and a sampled image placeholder ends its
row instead of breaking the next forward."""

import numpy as np
import pytest
import torch
from PIL import Image

from grpoplus.containers import Rollouts
from grpoplus.learner.logprobs import response_logprobs_from_rollouts
from grpoplus.learner.update import update_policy
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tiny_vision import VISION_FAMILIES, tiny_vision_model
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.models.vision import encode_prompts, forward_inputs, placeholder_ids, vision_positions
from grpoplus.rollout import HFEngine, SamplingParams
from grpoplus.selftest import fixtures as F

FAMILIES = sorted(VISION_FAMILIES)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test of this file on one thread."""


def image(seed: int, height: int = 56, width: int = 56) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8))


def chat(processor, question: str, images: int = 1) -> str:
    content = [{"type": "image"}] * images + [{"type": "text", "text": question}]
    return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=False)


def sample(model, processor, seed: int = 0, n: int = 3, new_tokens: int = 10) -> Rollouts:
    # prompts of different lengths, and images of two sizes (Qwen: 4 and 6 image tokens)
    prompts = [chat(processor, q) for q in ("what is 2+3?", "hi", "how many?")]
    engine = HFEngine(model, processor)
    return engine.generate(prompts, SamplingParams(n=n, max_new_tokens=new_tokens),
                           generator=torch.Generator().manual_seed(seed),
                           images=[[image(1)], [image(2, 56, 84)], [image(3)]])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_left_padded_batch_with_images_equals_each_row_alone(family):
    model, processor = tiny_vision_model(family)
    prompts = [chat(processor, "what is 2+3?"), chat(processor, "hi")]
    ids, mask, vision = encode_prompts(processor, prompts, [[image(1)], [image(2, 56, 84)]],
                                       processor.tokenizer.pad_token_id)
    assert mask[1].sum() < mask[0].sum()  # the second row is left-padded
    with torch.no_grad():
        extra = forward_inputs(vision, mask, 0)
        batch = model(input_ids=ids, attention_mask=mask, position_ids=vision_positions(model, ids, mask, extra),
                      **extra).logits
        for row in range(2):
            real = mask[row].bool()
            one_ids, one_mask = ids[row:row + 1, real], mask[row:row + 1, real]
            one = forward_inputs(vision[row:row + 1], one_mask, 0)
            alone = model(input_ids=one_ids, attention_mask=one_mask,
                          position_ids=vision_positions(model, one_ids, one_mask, one), **one).logits[0]
            torch.testing.assert_close(batch[row, real], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_learner_scores_what_the_engine_sampled_with_the_same_images(family):
    model, processor = tiny_vision_model(family)
    rollouts = sample(model, processor)
    assert len(rollouts.vision) == 9 and rollouts.vision[0] is rollouts.vision[2]  # a group shares its prompt's
    logp, _ = response_logprobs_from_rollouts(model, rollouts)
    sampled = rollouts.response_mask.bool()
    assert sampled.sum() > 20
    torch.testing.assert_close(logp[sampled], rollouts.logp_roll[sampled], atol=1e-5, rtol=0)
    # with other pixels the same tokens score differently: the learner really reads them
    blank = [type(v)(tokens=v.tokens, images={k: torch.full_like(t, 0.5) if k == "pixel_values" else t
                                              for k, t in v.images.items()}) for v in rollouts.vision]
    other, _ = response_logprobs_from_rollouts(model, rollouts, vision=blank)
    assert (other - logp)[sampled].abs().max() > 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_two_updates_train_a_vision_language_policy(family):
    model, processor = tiny_vision_model(family)
    rollouts = sample(model, processor, new_tokens=8)
    assert rollouts.select(torch.arange(3, 6)).vision == rollouts.vision[3:6]
    assert Rollouts.concat([rollouts, rollouts], pad_id=0).vision == rollouts.vision * 2
    plan = F.learner_plan(micro_batch_size=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt, sched = F.optimizer(model)
    losses = []
    model.train()
    for step in range(2):
        batch = F.batch(model, rollouts, plan, seed=step)
        losses.append(update_policy(model, opt, sched, batch, F.algo(), plan, first_step=step).metrics["loss/total"])
    assert all(np.isfinite(losses))
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items() if "lm_head" in k)


def test_a_sampled_image_placeholder_ends_its_row_before_it(tok=None):
    # a response holding an image placeholder could not be forwarded again (the model would look for its image's
    # features): the engine ends the row before it, unfinished, as if cut by the length limit
    model, processor = tiny_vision_model("qwen2_5_vl")
    banned = placeholder_ids(model.config)
    bias = torch.zeros(model.config.get_text_config().vocab_size)
    bias[banned[0]] = 4.0  # placeholders likely
    model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    rollouts = sample(model, processor, new_tokens=12)
    sampled = rollouts.response_mask.bool()
    assert not torch.isin(rollouts.response_ids[sampled], torch.tensor(banned)).any()
    cut = sampled.sum(1) < 12
    assert cut.any() and not rollouts.finished[cut].any()
    logp, _ = response_logprobs_from_rollouts(model, rollouts)  # every row forwards again
    torch.testing.assert_close(logp[sampled], rollouts.logp_roll[sampled], atol=1e-5, rtol=0)


def test_images_for_a_text_model_are_refused_in_one_line():
    tok = char_tokenizer()
    engine = HFEngine(tiny_model(tok, size="nano", seed=0), tok)
    with pytest.raises(ValueError, match=r"^prompts with images, but the policy \(LlamaForCausalLM\) is a text model"):
        engine.generate(["1+1="], SamplingParams(n=1, max_new_tokens=2), images=[[image(0)]])


def test_text_rows_for_a_vision_language_policy_and_a_prompt_whose_images_do_not_fit():
    model, processor = tiny_vision_model("qwen2_5_vl")
    engine, params = HFEngine(model, processor), SamplingParams(n=2, max_new_tokens=5)
    text = processor.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    rollouts = engine.generate([text], params, generator=torch.Generator().manual_seed(0))  # no image: fine
    logp, _ = response_logprobs_from_rollouts(model, rollouts)
    sampled = rollouts.response_mask.bool()
    torch.testing.assert_close(logp[sampled], rollouts.logp_roll[sampled], atol=1e-5, rtol=0)
    for family in FAMILIES:  # more images than placeholders, and fewer
        model, processor = tiny_vision_model(family)
        engine = HFEngine(model, processor)
        for shown, given in ((1, 2), (2, 1)):
            with pytest.raises(ValueError, match=rf"^prompt 0: it has {given} image\(s\) and {shown} image "
                                                 r"placeholder\(s\) \(.+\) in its text: give each image one"):
                engine.generate([chat(processor, "hi", images=shown)], params, images=[[image(0)] * given])


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3"])
def test_lora_adapts_the_language_model_alone_and_the_merged_sampler_sees_the_images(family):
    pytest.importorskip("peft", reason="LoRA: pip install -e '.[lora]'")
    from grpoplus.models.lora import add_lora
    from grpoplus.models.vision import is_vision_part

    model, processor = tiny_vision_model(family)
    policy = add_lora(model, rank=4, alpha=8.0, dropout=0.0, target_modules=["all-linear"])
    adapted = {name for name, _ in policy.named_parameters() if "lora_A" in name}
    assert adapted and not any(is_vision_part(name.replace("base_model.model.", "")) for name in adapted)
    with torch.no_grad():  # adapters that change the policy (B starts at zero)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    rollouts = sample(policy, processor)  # sampled through the merged plain module
    logp, _ = response_logprobs_from_rollouts(policy, rollouts)
    sampled = rollouts.response_mask.bool()
    torch.testing.assert_close(logp[sampled], rollouts.logp_roll[sampled], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "idefics3"])
def test_a_4bit_base_quantizes_the_language_model_and_keeps_the_vision_tower_as_loaded(family):
    """QLoRA on a vision-language policy: the language model's linear layers 4-bit under adapters, the vision tower
    and projector as loaded (the image features the published model computes; the dry run counts them so); the
    engine samples the 4-bit policy and the learner scores what it sampled."""
    pytest.importorskip("peft", reason="QLoRA: pip install -e '.[qlora]'")
    bnb = pytest.importorskip("bitsandbytes", reason="QLoRA: pip install -e '.[qlora]'")
    from grpoplus.models.lora import add_lora
    from grpoplus.models.qlora import FourBit, quantize_base
    from grpoplus.models.vision import is_vision_part

    model, processor = tiny_vision_model(family)
    policy = add_lora(quantize_base(model, FourBit("nf4", torch.float32)), 4, 8.0, 0.0, ["all-linear"])
    four_bit = {name for name, m in policy.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    vision = {name for name, m in policy.named_modules() if type(m) is torch.nn.Linear and is_vision_part(name)}
    assert four_bit and vision and not any(is_vision_part(name) for name in four_bit)
    rollouts = sample(policy, processor)
    logp, _ = response_logprobs_from_rollouts(policy, rollouts)
    sampled = rollouts.response_mask.bool()
    torch.testing.assert_close(logp[sampled], rollouts.logp_roll[sampled], atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_chunked_head_scores_rows_with_images_as_the_models_own_logits(family):
    # the learner's head path (the body with the images, then the LM head over response tokens only, chunk by chunk,
    # never the [rows, tokens, vocabulary] logits) against the model's own logits: log-probs and gradients
    from grpoplus.learner.logprobs import chunked_head

    model, processor = tiny_vision_model(family)
    rollouts = sample(model, processor, new_tokens=6)
    assert chunked_head(model) is model.lm_head
    out = []
    for hooked in (False, True):
        model.zero_grad(set_to_none=True)
        handle = model.lm_head.register_forward_hook(lambda module, inputs, logits: logits) if hooked else None
        logp, _ = response_logprobs_from_rollouts(model, rollouts)  # a hooked head takes the logits path
        (logp * torch.linspace(-1.0, 2.0, logp.shape[1])).sum().backward()
        out.append((logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
        if handle is not None:
            handle.remove()
    (head_logp, head_grads), (own_logp, own_grads) = out
    torch.testing.assert_close(head_logp, own_logp, atol=1e-5, rtol=0)
    assert head_grads.keys() == own_grads.keys()
    for name, grad in own_grads.items():
        torch.testing.assert_close(head_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def _vision_module(model) -> torch.nn.Module:
    from grpoplus.models.vision import VISION_PARTS

    return next(m for name, m in model.named_modules() if name.rpartition(".")[2] in VISION_PARTS)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_groups_prompt_and_its_images_are_computed_once_with_the_same_numbers(family):
    # learner.share_prompts: each distinct prompt (its images too) through the body once, every response against its
    # keys and values; where the model's cache cannot be shared (sliding windows, linear attention) every row whole
    from grpoplus.learner.logprobs import response_logprobs

    model, processor = tiny_vision_model(family)
    rollouts = sample(model, processor, new_tokens=6)  # 3 prompts x 3 rows
    seen = []
    _vision_module(model).register_forward_hook(lambda module, args, out: seen.append(
        sum(a.shape[0] * (a.shape[1] if a.dim() == 5 else 1) for a in args if torch.is_tensor(a))))
    out = []
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        seen.clear()
        logp, _ = response_logprobs(model, rollouts.prompt_ids, rollouts.prompt_mask, rollouts.response_ids,
                                    rollouts.response_mask, vision=rollouts.vision, share_prompts=share)
        (logp * torch.linspace(-1.0, 2.0, logp.shape[1])).sum().backward()
        out.append((logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
                    sum(seen)))
    (whole, whole_grads, whole_images), (shared, shared_grads, shared_images) = out
    torch.testing.assert_close(shared, whole, atol=1e-5, rtol=0)
    for name, grad in whole_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    cache_shared = family not in ("gemma3", "qwen3_5")  # sliding windows; linear attention
    assert (shared_images * 3 == whole_images) if cache_shared else (shared_images == whole_images)
