"""Routing capture and replay: replay of a forward's own routing is exact, gradients reach the
router, mismatch and load count what they claim, and bad routings are refused by name."""

import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM

from grpoplus.learner.logprobs import response_logprobs
from grpoplus.models.routing import (
    NATURAL,
    expert_load,
    moe_routers,
    pad_routing,
    record_routing,
    replay_routing,
    rollout_routing,
    routing_metrics,
    routing_mismatch,
    routing_spec,
)
from grpoplus.models.tiny import tiny_model, tiny_moe_model
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.rollout.base import SamplingParams
from grpoplus.rollout.hf import decode

pytestmark = pytest.mark.usefixtures("one_thread")


def make_batch(tok):
    """3 left-padded prompts and right-padded responses (lengths 4, 2, 4), no all-padding column."""
    enc = tok(["12+3=", "7=", "100-9="], padding=True, return_tensors="pt")
    T = 4
    response_ids = torch.full((3, T), tok.pad_token_id)
    response_mask = torch.zeros(3, T)
    for i, text in enumerate(["15#1", "8", "91#9"]):
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids = ids[:T]
        response_ids[i, : len(ids)] = torch.tensor(ids)
        response_mask[i, : len(ids)] = 1
    return enc["input_ids"], enc["attention_mask"], response_ids, response_mask


def forward_inputs(prompt_ids, prompt_mask, response_ids, response_mask):
    """The learner's forward inputs (grpoplus/learner/logprobs.py): ids, mask and position ids [B, P + T]."""
    input_ids = torch.cat([prompt_ids, response_ids], 1)
    attention_mask = torch.cat([prompt_mask, response_mask.long()], 1)
    return dict(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=(attention_mask.cumsum(1) - 1).clamp(min=0))


@pytest.fixture
def setup():
    tok = char_tokenizer()
    model = tiny_moe_model(tok, size="moe-nano", seed=1)
    with torch.no_grad():  # a sharper router, so routings differ from token to token
        for router in moe_routers(model):
            router.weight.mul_(20.0)
    batch = make_batch(tok)
    return model, batch, forward_inputs(*batch)


def recorded(model, inputs):
    with torch.no_grad(), record_routing(model) as record:
        logits = model(**inputs).logits
    return logits, record.routing


def complement(routing, num_experts=4):
    """For top-2 of 4 experts: the other two experts of every token (a disjoint set)."""
    taken = torch.zeros(*routing.shape[:3], num_experts, dtype=torch.bool)
    taken.scatter_(-1, routing.long(), True)
    return (~taken).nonzero()[:, -1].view(routing.shape).to(routing.dtype)


def test_record_is_the_router_top_k_of_every_token_and_layer(setup):
    model, _, inputs = setup
    _, routing = recorded(model, inputs)
    with record_routing(model) as with_grad:
        model(**inputs).logits.sum().backward()
    assert torch.equal(with_grad.routing, routing)
    B, S = inputs["input_ids"].shape
    assert routing.shape == (B, S, 2, 2) and not routing.dtype.is_floating_point
    # Reference: the router logits transformers itself returns ([B*S, E] per layer, rows in
    # input order), top-2 of their float64 softmax, compared as sets.
    with torch.no_grad():
        router_logits = model(**inputs, output_router_logits=True).router_logits
    for layer, logits in enumerate(router_logits):
        top2 = logits.double().softmax(-1).topk(2, -1).indices.view(B, S, 2)
        assert torch.equal(top2.sort(-1).values, routing[:, :, layer].long().sort(-1).values)


def test_replaying_own_routing_gives_bit_identical_logprobs(setup):
    # torch.equal, not a tolerance: under replay the router computes the same logits, and the
    # gate weights are the same float32 softmax values (gathered at the recorded ids instead of
    # returned by top-k, same renormalisation), so the experts see identical inputs and ids.
    model, batch, inputs = setup
    _, routing = recorded(model, inputs)
    with torch.no_grad():
        plain, _ = response_logprobs(model, *batch)
        with replay_routing(model, routing) as natural:
            replayed, _ = response_logprobs(model, *batch)
    assert torch.equal(plain, replayed)
    per_layer, overall = routing_mismatch(natural.routing, routing, inputs["attention_mask"])
    assert per_layer.tolist() == [0.0, 0.0] and float(overall) == 0.0


def test_gradients_reach_the_router_under_replay_and_equal_the_unreplayed_ones(setup):
    model, batch, inputs = setup
    _, routing = recorded(model, inputs)
    gates = [router.weight for router in moe_routers(model)]

    def router_grads(replay):
        model.zero_grad()
        if replay:
            with replay_routing(model, routing):
                logp, _ = response_logprobs(model, *batch)
        else:
            logp, _ = response_logprobs(model, *batch)
        logp.sum().backward()
        return [g.grad.clone() for g in gates]

    replayed, plain = router_grads(True), router_grads(False)
    assert all(float(g.abs().sum()) > 0 for g in replayed)
    for a, b in zip(replayed, plain):  # top-k values and gathered values have the same gradient
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_flipped_router_shows_as_mismatch(setup):
    model, _, inputs = setup
    _, routing = recorded(model, inputs)
    with torch.no_grad():
        moe_routers(model)[0].weight.neg_()  # layer 0 now prefers its two least likely experts
        with replay_routing(model, routing) as natural:
            model(**inputs)
    per_layer, overall = routing_mismatch(natural.routing, routing, inputs["attention_mask"])
    # Top-2 of the negated logits is the bottom-2 of the old ones: disjoint from every
    # recorded top-2 of layer 0, so every real token of layer 0 mismatches. Layer 1 is
    # replayed and its router unchanged, but its input changed, so it may differ too.
    assert float(per_layer[0]) == 1.0
    assert float(overall) >= 0.5


def test_replaying_other_experts_changes_the_output(setup):
    model, _, inputs = setup
    logits, routing = recorded(model, inputs)
    with torch.no_grad(), replay_routing(model, complement(routing)):
        other = model(**inputs).logits
    assert float((other - logits).abs().max()) > 1e-3


def test_replayed_gate_weights_are_the_softmax_restricted_to_the_replayed_experts():
    tok = char_tokenizer()
    for renormalise in (True, False):
        model = tiny_moe_model(tok, size="moe-nano", seed=2, norm_topk_prob=renormalise)
        inputs = forward_inputs(*make_batch(tok))
        _, routing = recorded(model, inputs)
        forced = complement(routing)
        seen = []
        experts = model.model.layers[0].mlp.experts
        handle = experts.register_forward_hook(lambda m, args, out: seen.append((args[1], args[2])))  # noqa: B023
        with torch.no_grad(), replay_routing(model, forced):
            router_logits = model(**inputs, output_router_logits=True).router_logits[0]  # [B*S, 4]
        handle.remove()
        ids, weights = seen[0]
        assert torch.equal(ids, forced[:, :, 0].long().flatten(0, 1))
        # float64 reference: p = softmax over all 4 experts, taken at the 2 forced ones;
        # renormalised, p_i / (p_a + p_b) = exp(z_i) / (exp(z_a) + exp(z_b)), the softmax
        # of the logits restricted to the forced experts.
        probs = router_logits.double().softmax(-1).gather(-1, ids)
        expected = probs / probs.sum(-1, keepdim=True) if renormalise else probs
        torch.testing.assert_close(weights.double(), expected, rtol=1e-6, atol=1e-7)


def test_natural_marker_keeps_the_model_choice(setup):
    model, _, inputs = setup
    logits, routing = recorded(model, inputs)
    partly = complement(routing)
    partly[0] = NATURAL  # row 0 keeps its own experts, the others are forced elsewhere
    with torch.no_grad(), replay_routing(model, torch.full_like(routing, NATURAL)) as natural:
        same = model(**inputs).logits
    assert torch.equal(same, logits)
    assert float(routing_mismatch(natural.routing, torch.full_like(routing, NATURAL), inputs["attention_mask"])[1]) == 0
    with torch.no_grad(), replay_routing(model, partly):
        mixed = model(**inputs).logits
    # Row 0 attends only to itself and keeps its natural experts: unchanged up to float
    # rounding (the experts now batch other tokens with it); row 1 is not.
    torch.testing.assert_close(mixed[0], logits[0], rtol=0, atol=1e-6)
    assert not torch.allclose(mixed[1], logits[1], atol=1e-3)


def test_model_is_unchanged_after_the_block_also_on_an_exception(setup):
    model, _, inputs = setup
    logits, routing = recorded(model, inputs)
    with pytest.raises(RuntimeError, match="boom"):
        with replay_routing(model, complement(routing)):
            raise RuntimeError("boom")
    assert not model._forward_pre_hooks and not any(r._forward_hooks for r in moe_routers(model))
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, logits)


@pytest.mark.parametrize("change, message", [
    (lambda r: r[..., 0], "4 dims"),
    (lambda r: r[:, :, :1], "1 layers .* 2 MoE layers"),
    (lambda r: torch.cat([r, r[..., :1]], -1), "k=3 .* top_k=2"),
    (lambda r: r.clone().fill_(4), "num_experts=4"),
    (lambda r: r.clone().fill_(-2), "valid ids"),
    (lambda r: torch.stack([r[..., 0], torch.full_like(r[..., 0], NATURAL)], -1), "some but not all"),
    (lambda r: torch.stack([r[..., 0], r[..., 0]], -1), "repeats an expert"),
    (lambda r: r.float(), "integer tensor"),
])
def test_bad_routing_is_refused_on_entry(setup, change, message):
    model, _, inputs = setup
    _, routing = recorded(model, inputs)
    with pytest.raises(ValueError, match=message):
        with replay_routing(model, change(routing)):
            pass


def test_routing_of_other_columns_is_refused_at_the_forward(setup):
    model, _, inputs = setup
    _, routing = recorded(model, inputs)
    S = inputs["input_ids"].shape[1]
    with pytest.raises(ValueError, match=rf"covers \[B, S\] = \[3, {S - 1}\] but the forward's input is \[3, {S}\]"):
        with torch.no_grad(), replay_routing(model, routing[:, 1:]):
            model(**inputs)


def test_dense_model_is_refused():
    model = tiny_model(char_tokenizer(), size="nano")
    with pytest.raises(ValueError, match="LlamaForCausalLM has no mixture-of-experts router"):
        routing_spec(model)
    with pytest.raises(ValueError, match="mixture-of-experts"):
        with replay_routing(model, torch.zeros(1, 1, 2, 2, dtype=torch.long)):
            pass


def test_mismatch_and_load_by_hand():
    # 1 row, 3 tokens, 1 layer, k = 2, 3 experts; token 2 is padding.
    natural = torch.tensor([[[[0, 1]], [[2, 0]], [[1, 2]]]])
    replayed = torch.tensor([[[[1, 0]], [[2, 1]], [[0, 1]]]])
    mask = torch.tensor([[1, 1, 0]])
    per_layer, overall = routing_mismatch(natural, replayed, mask)
    # token 0: {0,1} = {0,1} (order ignored); token 1: {0,2} != {1,2}; token 2 not counted -> 1/2
    assert per_layer.tolist() == [0.5] and float(overall) == 0.5
    # natural load over tokens 0 and 1: slots 0,1,2,0 -> expert 0: 2/4, 1: 1/4, 2: 1/4
    assert expert_load(natural, mask, 3).tolist() == [[0.5, 0.25, 0.25]]
    metrics = routing_metrics(natural, replayed, mask, 3)
    assert float(metrics["routing/mismatch_layer0"]) == 0.5
    assert float(metrics["routing/load_max"]) == 1.5  # 0.5 * 3 experts
    # A NATURAL-replayed token is not counted: only token 0 is left, and it matches.
    replayed[0, 1] = NATURAL
    assert float(routing_mismatch(natural, replayed, mask)[1]) == 0.0


def test_pad_routing_pads_prompt_left_and_response_right():
    routing = torch.arange(2 * 3 * 1 * 2).view(2, 3, 1, 2).to(torch.int16)  # P = 2, T = 1
    padded = pad_routing(routing, 2, 4, 3)
    assert padded.shape == (2, 7, 1, 2)
    assert (padded[:, :2] == NATURAL).all() and torch.equal(padded[:, 2:4], routing[:, :2])
    assert torch.equal(padded[:, 4], routing[:, 2]) and (padded[:, 5:] == NATURAL).all()
    with pytest.raises(ValueError, match="cannot pad"):
        pad_routing(routing, 2, 1, 3)


def test_mixtral_routers_replay_exactly():
    tok = char_tokenizer()
    config = MixtralConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    model = MixtralForCausalLM(config).eval()
    inputs = forward_inputs(*make_batch(tok))
    logits, routing = recorded(model, inputs)
    assert routing_spec(model).num_experts == 4
    with torch.no_grad(), replay_routing(model, routing):
        assert torch.equal(model(**inputs).logits, logits)


def test_rollout_routing_is_the_routing_the_decode_loop_used(setup):
    model, (prompt_ids, prompt_mask, _, _), _ = setup
    n, T = 3, 8
    with torch.no_grad(), record_routing(model) as during:
        # A stop id that never occurs keeps every row in the batch: each step routes [N, 1] tokens.
        tokens, mask, _, _ = decode(model, prompt_ids, prompt_mask, torch.full((3,), n),
                                    SamplingParams(n=n, max_new_tokens=T), torch.tensor([-1]), 0,
                                    torch.Generator().manual_seed(0))
    prefill, *steps = during.forwards  # [3, P, L, k], then T - 1 of [N, 1, L, k]
    decoded = torch.cat([prefill.repeat_interleave(n, 0)] + steps, 1)  # response token T-1 is never fed back
    prompt_ids, prompt_mask = prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0)
    routing = rollout_routing(model, prompt_ids, prompt_mask, tokens, mask, micro_batch_size=4)
    P = prompt_ids.shape[1]
    assert routing.shape == (3 * n, P + T, 2, 2)
    real = torch.cat([prompt_mask, mask[:, :-1].long()], 1)
    # Equal up to near-ties of router probabilities (float rounding of cached vs full attention).
    assert float(routing_mismatch(decoded, routing[:, :-1], real)[1]) <= 0.01
