"""Routing replay in the learner (ALGORITHMS.md section 8): R3 reproduces the sampler's log-probs,
R2 replays the learner's own recorded routing, gradients reach the router under both, the
routing-mismatch metrics see a routing flip, and bad settings are refused by name."""

import copy

import pytest
import torch

from grpoplus.algo import AlgoConfig
from grpoplus.config import build_config
from grpoplus.config.rules import RULES
from grpoplus.containers import Rollouts, SamplingParams, ScoredGroups
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.learner.prepare import LearnerPlan, prepare
from grpoplus.learner.replay import LearnerRouting, RoutingTally, check_replay, input_mask, moe_spec
from grpoplus.learner.update import update_policy
from grpoplus.models.routing import NATURAL, RoutingSpec, moe_routers, record_routing, routing_spec
from grpoplus.models.tiny import tiny_model, tiny_moe_model
from grpoplus.plan.run import logp_old_mode
from grpoplus.rollout.base import EngineOptions
from grpoplus.rollout.hf import HFEngine

PROMPTS = ["12+3=", "7=", "100-9=", "4*5="]


pytestmark = pytest.mark.usefixtures("one_thread")


def sharp_moe(tok, seed=1):
    """moe-nano (2 layers, top-2 of 4 experts) with a sharper router, so routings vary token to token."""
    model = tiny_moe_model(tok, size="moe-nano", seed=seed)
    with torch.no_grad():
        for router in moe_routers(model):
            router.weight.mul_(20.0)
    return model


def sample(engine_model, tok, n=4, max_new_tokens=8) -> Rollouts:
    engine = HFEngine(engine_model, tok, EngineOptions(record_routing=True))
    return engine.generate(PROMPTS, SamplingParams(n=n, max_new_tokens=max_new_tokens),
                           generator=torch.Generator().manual_seed(0))


def scored(rollouts: Rollouts) -> ScoredGroups:
    n = len(rollouts.texts)
    rewards = torch.randn(n, generator=torch.Generator().manual_seed(1))
    return ScoredGroups(rollouts, rewards, torch.zeros(n, dtype=torch.bool), {})


def learner_logp(model, r: Rollouts, routing):
    return response_logprobs(model, r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask,
                             micro_batch_size=5, routing=routing)[0]


def train(model, rollouts, mode, *, lr=1e-2, num_minibatches=2, micro=8, micro_tokens=0):
    """prepare + update_policy with SGD; returns (batch, metrics, router grads of the last step)."""
    algo = AlgoConfig.preset("grpo", beta=0.0, aggregation="token_mean", num_minibatches=num_minibatches,
                             routing_replay=mode, max_len=8)
    plan = LearnerPlan(temperature=1.0, micro_batch_size=micro, max_grad_norm=1e9, logp_old=logp_old_mode(algo,
                       "auto", False), micro_batch_tokens=micro_tokens,
                       routing_replay=mode, routing_spec=routing_spec(model))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    grads = {}
    hooks = [r.weight.register_post_accumulate_grad_hook(lambda p, i=i: grads.__setitem__(i, p.grad.clone()))
             for i, r in enumerate(moe_routers(model))]
    batch, _, _ = prepare(scored(rollouts), model, None, algo, plan)
    metrics = update_policy(model, optimizer, scheduler, batch, algo, plan).metrics
    for hook in hooks:
        hook.remove()
    return batch, metrics, grads


def test_engine_routing_is_aligned_with_the_rollout_tokens(tok):
    model = sharp_moe(tok)
    r = sample(model, tok)
    N, P, T = r.response_ids.shape[0], r.prompt_ids.shape[1], r.response_ids.shape[1]
    assert r.routing.shape == (N, P + T, 2, 2) and r.routing.dtype == torch.int16
    real = input_mask(r.prompt_mask, r.response_mask).bool()
    assert bool((r.routing[real] >= 0).all()) and bool((r.routing[~real] == NATURAL).all())
    # On every real token it is the learner's own routing at the same weights (same ids and positions).
    assert torch.equal(natural_routing(model, r)[real], r.routing[real])


def test_r3_with_equal_weights_gives_the_samplers_logprobs(tok):
    model = sharp_moe(tok)
    r = sample(model, tok)
    mask = input_mask(r.prompt_mask, r.response_mask)
    replayed = LearnerRouting(model, r.routing, mask, replay=True, tally=RoutingTally(routing_spec(model)))
    logp = learner_logp(model, r, replayed)
    # The same sampled tokens, weights and experts: the dense model's tolerance (KV-cached vs full forward).
    assert (logp - r.logp_roll).abs().max() < 1e-5
    assert replayed.tally.metrics()["moe/routing_mismatch"] == 0.0
    # Control: the routing one column off (every token gets its neighbour's experts) moves the log-probs.
    shifted = torch.where(mask.bool()[:, :, None, None], r.routing.roll(1, dims=1), NATURAL)
    off = learner_logp(model, r, LearnerRouting(model, shifted, mask, replay=True))
    assert (off - r.logp_roll).abs().max() > 1e-2


def perturbed(learner):
    """A sampler whose layer-1 router differs: its layer-1 choices differ, layer 0 (before it) cannot."""
    sampler = copy.deepcopy(learner)
    with torch.no_grad():
        router = moe_routers(sampler)[1]
        router.weight.add_(torch.randn(router.weight.shape, generator=torch.Generator().manual_seed(5)))
    return sampler


def natural_routing(model, r: Rollouts) -> torch.Tensor:
    """[N, P + T, L, k] the model's own routing of the rollouts in one full forward."""
    ids, mask = torch.cat([r.prompt_ids, r.response_ids], 1), input_mask(r.prompt_mask, r.response_mask)
    with torch.no_grad(), record_routing(model) as record:
        model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0))
    return record.routing


def test_r2_replays_the_learner_routing_and_r3_the_samplers(tok):
    learner = sharp_moe(tok)
    r = sample(perturbed(learner), tok)
    real = input_mask(r.prompt_mask, r.response_mask).bool()
    own = natural_routing(learner, r)
    assert not torch.equal(own[real], r.routing[real])
    r2, m2, _ = train(copy.deepcopy(learner), r, "r2")
    # R2 replays what the learner chose at pi_old (recorded in the logp_old pass), not the sampler's.
    assert torch.equal(r2.routing[real], own[real]) and bool((r2.routing[~real] == NATURAL).all())
    assert m2["moe/routing_mismatch_first"] == 0.0  # the first step replays its own routing
    assert m2["moe/routing_mismatch"] > 0.0  # after the first update the router wants other experts
    r3, m3, _ = train(copy.deepcopy(learner), r, "r3")
    assert torch.equal(r3.routing, r.routing)
    assert m3["moe/routing_mismatch_first"] > 0.0  # the learner's own choice differs from the sampler's


@pytest.mark.parametrize("mode", ["r2", "r3"])
def test_gradients_reach_the_router_under_replay(tok, mode):
    model = sharp_moe(tok)
    r = sample(model, tok)
    before = [router.weight.detach().clone() for router in moe_routers(model)]
    _, metrics, grads = train(model, r, mode)
    assert sorted(grads) == [0, 1]
    for layer, grad in grads.items():
        assert torch.isfinite(grad).all() and grad.abs().max() > 0, layer
        assert not torch.equal(moe_routers(model)[layer].weight, before[layer])
    assert metrics["optim/skipped_updates"] == 0.0


@pytest.mark.parametrize("micro_tokens", [0, 60])  # rows in order / by token budget (rows regrouped)
def test_a_routing_flip_shows_in_the_metrics_with_replay_off(tok, micro_tokens):
    learner = sharp_moe(tok)
    unchanged = sample(learner, tok)
    _, same, _ = train(copy.deepcopy(learner), unchanged, "off", lr=0.0, num_minibatches=1)
    assert same["moe/routing_mismatch"] == 0.0 and same["moe/routing_mismatch_first"] == 0.0
    flipped = sample(perturbed(learner), tok)
    _, metrics, _ = train(copy.deepcopy(learner), flipped, "off", lr=0.0, num_minibatches=1,
                          micro_tokens=micro_tokens)
    # Expected: the share of real token-layer choices where the learner's own top-2 set differs.
    mask = input_mask(flipped.prompt_mask, flipped.response_mask)
    own = natural_routing(learner, flipped)
    differs = (own.sort(-1).values != flipped.routing.sort(-1).values).any(-1)[mask.bool()]  # [n, L]
    expected = differs.double().mean(0)
    assert metrics["moe/routing_mismatch/layer0"] == 0.0
    assert metrics["moe/routing_mismatch/layer1"] == pytest.approx(float(expected[1]), abs=1e-6)
    assert expected[1] > 0.05
    assert metrics["moe/routing_mismatch"] == pytest.approx(float(expected.mean()), abs=1e-6)
    assert metrics["moe/routing_mismatch_first"] == metrics["moe/routing_mismatch"]  # one step


def test_tally_counts_tokens_and_expert_slots():
    spec = RoutingSpec(num_layers=1, num_experts=4, top_k=2)
    tally = RoutingTally(spec)
    natural = torch.tensor([[[[0, 1]], [[2, 3]], [[1, 0]]]])  # [1, 3, 1, 2]
    reference = torch.tensor([[[[1, 0]], [[2, 1]], [[3, 2]]]])
    tally.add(natural, reference, torch.tensor([[1, 1, 0]]))  # the third token is padding
    # Token 0: {0,1} vs {1,0} same set; token 1: {2,3} vs {1,2} differs -> 1 of 2.
    # Natural slots of the 2 real tokens: experts 0, 1, 2, 3 once each -> busiest share 1/4.
    assert tally.metrics() == {"moe/routing_mismatch": 0.5, "moe/routing_mismatch/layer0": 0.5,
                               "moe/load_max_frac": 0.25}
    tally.add(natural[:, :1], None, torch.tensor([[1]]))  # no reference: load only, {0, 1} again
    # Slots now 0: 2, 1: 2, 2: 1, 3: 1 of 6 -> busiest 2/6; the mismatch keeps its 1 of 2.
    assert tally.metrics()["moe/load_max_frac"] == pytest.approx(1 / 3)
    assert tally.metrics()["moe/routing_mismatch"] == 0.5


def test_concatenated_rollouts_keep_their_routing_aligned(tok):
    model = sharp_moe(tok)
    a = sample(model, tok, n=2, max_new_tokens=3)
    b = HFEngine(model, tok, EngineOptions(record_routing=True)).generate(
        ["123456+7=", "1="], SamplingParams(n=2, max_new_tokens=6), generator=torch.Generator().manual_seed(3))
    both = Rollouts.concat([a, b], tok.pad_token_id)
    assert both.routing.shape[1] == both.prompt_ids.shape[1] + both.response_ids.shape[1]
    real = input_mask(both.prompt_mask, both.response_mask).bool()
    assert bool((both.routing[~real] == NATURAL).all()) and bool((both.routing[real] >= 0).all())
    logp = learner_logp(model, both, LearnerRouting(model, both.routing, real.long(), replay=True))
    assert (logp - both.logp_roll).abs().max() < 1e-5


def test_bad_settings_are_refused_by_name(tok):
    dense = tiny_model(tok, size="nano")
    assert moe_spec(dense) is None and check_replay("off", dense) is None
    with pytest.raises(ValueError, match="routing_replay=r2 needs a mixture-of-experts policy.*tiny-moe"):
        check_replay("r2", dense)
    with pytest.raises(ValueError, match="no mixture-of-experts router"):
        HFEngine(dense, tok, EngineOptions(record_routing=True))
    cfg = build_config("grpo", overrides=["routing_replay=r3"])  # hf returns its routing
    cfg.rollout.engine = "vllm"  # set after validation: the vllm package need not be installed here
    with pytest.raises(ValueError, match="rollout.engine=vllm does not return them.*engines that do: hf"):
        next(r for r in RULES if r.name == "routing_replay").fn(cfg)
    with pytest.raises(ValueError, match="learner.logp_old=rollout takes pi_old from the sampler"):
        build_config("grpo", overrides=["routing_replay=r2", "logp_old=rollout"])
    assert logp_old_mode(AlgoConfig(routing_replay="r2"), "auto", False) == "recompute"  # R2 records in that pass
    with pytest.raises(ValueError, match="routing_replay.*is not valid; choose one of: off, r2, r3"):
        AlgoConfig(routing_replay="r4")
    # A routing with a top-k the model does not have (k=3 of its top-2) is refused before any update.
    model = sharp_moe(tok)
    r = sample(model, tok)
    r.routing = torch.cat([r.routing, r.routing[..., :1]], -1)
    with pytest.raises(ValueError, match="k=3 experts per token.*top_k=2"):
        train(model, r, "r3")


def test_off_from_the_command_line_or_yaml_is_the_string_off():
    # YAML 1.1 reads a bare `off` as false; the config takes it as the mode's name.
    assert build_config("grpo", overrides=["routing_replay=off"]).algo.routing_replay == "off"
    assert build_config("grpo", overrides=["routing_replay=r2"]).algo.routing_replay == "r2"
