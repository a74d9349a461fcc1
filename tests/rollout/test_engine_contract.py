"""One contract, every registered engine: the same tests run against hf and vllm (when installed).

The model is a nano Llama with heads of size 32 (vLLM's CPU attention needs 32, 64, ...),
briefly fine-tuned on the arithmetic task so that it ends responses with EOS on its own.
"""

import copy
import importlib.util

import pytest
import torch

from grpoplus.learner.logprobs import response_logprobs_from_rollouts
from grpoplus.models.tiny import tiny_model
from grpoplus.rollout import ENGINES, EngineOptions, SamplingParams
from grpoplus.sft.warmstart import sft_targets, train_sft
from grpoplus.tasks import get_task

HAS_VLLM = importlib.util.find_spec("vllm") is not None
ENGINE_NAMES = [pytest.param(name, marks=pytest.mark.skipif(name == "vllm" and not HAS_VLLM,
                                                            reason="vllm not installed: pip install -e '.[vllm]'"))
                for name in ENGINES.names()]
# Gap allowed between the engine's logp_roll and the learner's logp with the same fp32 weights:
# the hf engine runs the learner's own kernels; vLLM's differ in summation order (measured ~5e-7).
KERNEL_GAP = {"hf": 1e-5, "vllm": 1e-4}
PROMPTS = ["3+4=", "9-2+1=", "5=", "8-8+7-1="]


@pytest.fixture(scope="module")
def trained(tok):
    """A nano model that has seen 60 SFT steps of arithmetic: it answers and stops with EOS."""
    torch.manual_seed(0)
    model = tiny_model(tok, size="nano", seed=0, num_attention_heads=2, num_key_value_heads=2)
    task = get_task("arithmetic", difficulty=2, seed=0, n_train=300, n_test=10)
    train = task.split("train")
    with torch.random.fork_rng(devices=[]):
        train_sft(model, tok, [e.prompt for e in train], sft_targets(task, train, 0.5, 0), steps=60, batch_size=32,
                  lr=3e-3, seed=0)
    return model.eval()


@pytest.fixture(scope="module")
def engines(trained, tok):
    """One engine per name, built once for the module: vLLM takes seconds to start, and its in-process
    engine keeps process-wide state, so one process holds one vLLM engine at a time."""
    built = {}

    def get(name):
        if name not in built:
            built[name] = ENGINES.get(name)(trained, tok, EngineOptions(max_model_len=128))
        return built[name]

    yield get
    for engine in built.values():
        engine.close()


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_layout_groups_and_eos(name, engines, tok):
    engine = engines(name)
    r = engine.generate(PROMPTS, SamplingParams(n=3, max_new_tokens=12), prompt_index=[7, 8, 9, 10],
                        generator=seeded(0))
    assert r.response_ids.shape[0] == r.prompt_ids.shape[0] == len(r.texts) == 12
    assert r.group_ids.tolist() == [g for g in range(4) for _ in range(3)] and r.prompt_index == [7, 8, 9, 10]
    assert r.finished.any(), "the fixture model should end some responses with EOS"
    for i in range(12):
        n = int(r.lengths[i])
        assert r.response_mask[i, :n].eq(1).all() and r.response_mask[i, n:].eq(0).all()
        assert r.logp_roll[i, n:].eq(0).all() and (r.logp_roll[i, :n] <= 0).all()
        assert bool(r.finished[i]) == (r.response_ids[i, n - 1].item() == tok.eos_token_id)
        assert n == 12 or r.finished[i]
        assert r.texts[i] == tok.decode(r.response_ids[i, :n], skip_special_tokens=True)
    assert torch.equal(r.prompt_ids[0], r.prompt_ids[2]) and r.prompt_mask[6].sum() == len("5=") + 1


@pytest.mark.parametrize("name", ENGINE_NAMES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logp_roll_is_the_sampling_distributions_logprob(name, temperature, engines, trained):
    # With equal fp32 weights the sampler's log-prob of each sampled token equals the learner's
    # log softmax(logits / temperature) at that token, up to the kernels' gap.
    r = engines(name).generate(PROMPTS, SamplingParams(n=4, temperature=temperature, max_new_tokens=12),
                               generator=seeded(1))
    logp, _ = response_logprobs_from_rollouts(trained, r, temperature=temperature)
    torch.testing.assert_close(logp, r.logp_roll, atol=KERNEL_GAP[name], rtol=0)


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_top_p_logprob_is_renormalised_over_the_nucleus(name, engines, trained):
    # Under top_p < 1 the sampled token's probability is renormalised over the nucleus, so
    # logp_roll >= the learner's full-softmax logp, with equality where the nucleus is everything.
    r = engines(name).generate(PROMPTS, SamplingParams(n=4, temperature=1.0, top_p=0.5, max_new_tokens=8),
                               generator=seeded(2))
    logp, _ = response_logprobs_from_rollouts(trained, r, temperature=1.0)
    on = r.response_mask.bool()
    assert (r.logp_roll[on] >= logp[on] - KERNEL_GAP[name]).all()
    assert (r.logp_roll[on] > logp[on] + 1e-3).any()


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_the_generator_decides_every_draw(name, engines):
    engine = engines(name)
    params = SamplingParams(n=4, max_new_tokens=10)
    a, b, c = (engine.generate(PROMPTS, params, generator=seeded(s)) for s in (5, 5, 6))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logp_roll, b.logp_roll)
    assert not torch.equal(a.response_ids, c.response_ids)


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_greedy_is_argmax_with_temperature_one_logprobs(name, engines, trained):
    r = engines(name).generate(PROMPTS, SamplingParams(n=1, greedy=True, max_new_tokens=10))
    logp, _ = response_logprobs_from_rollouts(trained, r, temperature=1.0)
    torch.testing.assert_close(logp, r.logp_roll, atol=KERNEL_GAP[name], rtol=0)
    ids = torch.cat([r.prompt_ids[:1, r.prompt_mask[0].bool()], r.response_ids[:1, :1]], 1)
    with torch.no_grad():
        first = trained(ids[:, :-1]).logits[0, -1].argmax()
    assert first.item() == r.response_ids[0, 0].item()


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_sync_weights_loads_the_learners_new_weights(name, engines, trained):
    # After an update and a sync, the engine's log-probs of its samples equal the NEW learner's
    # (to the kernel gap) and differ from the old learner's: the weights really moved.
    engine, learner = engines(name), copy.deepcopy(trained)
    with torch.no_grad():
        for p in learner.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.sync_weights(learner, version=3)
    try:
        r = engine.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=10), generator=seeded(7))
    finally:
        engine.sync_weights(trained, version=0)  # the module's other tests expect the fixture's weights
    assert r.policy_version == 3
    new_logp, _ = response_logprobs_from_rollouts(learner, r)
    old_logp, _ = response_logprobs_from_rollouts(trained, r)
    torch.testing.assert_close(new_logp, r.logp_roll, atol=KERNEL_GAP[name], rtol=0)
    assert (old_logp - r.logp_roll).abs().max() > 100 * KERNEL_GAP[name]


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_a_batch_larger_than_one_scheduler_step_samples_and_repeats_exactly(name, engines):
    # 120 prompts of 37 tokens x 2 samples: ~8,900 prompt tokens, over vLLM's 4,096 per step, so its prefills span
    # steps (chunked prefill rewinds a seeded generator, which a CPU generator cannot: it crashed there).
    prompts = [f"{i}+{i % 7}=" * (36 // len(f"{i}+{i % 7}=")) for i in range(120)]
    params = SamplingParams(n=2, max_new_tokens=6)
    first = engines(name).generate(prompts, params, generator=seeded(3))
    again = engines(name).generate(prompts, params, generator=seeded(3))
    assert first.response_ids.shape[0] == 240 and first.prompt_mask.sum() > 2 * 4096
    assert torch.equal(first.response_ids, again.response_ids) and torch.equal(first.logp_roll, again.logp_roll)


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_bad_requests_name_the_problem(name, engines):
    engine = engines(name)
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(PROMPTS, SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(PROMPTS, SamplingParams(temperature=0.0))
    with pytest.raises(ValueError, match="prompt_index"):
        engine.generate(PROMPTS, SamplingParams(), prompt_index=[0])
    with pytest.raises(ValueError, match="prompts"):
        engine.generate([], SamplingParams())


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_an_unavailable_quantization_is_refused_before_loading(name, trained, tok):
    with pytest.raises(ValueError, match="quantization"):
        ENGINES.get(name)(trained, tok, EngineOptions(quantization="fp8"))


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_an_engine_leaves_the_processs_thread_count_alone(name, engines):
    """The learner shares the process: vLLM's CPU worker lowers torch's thread count and replaces
    ``torch.set_num_threads`` with a no-op as it starts; the engine must undo both."""
    threads = torch.get_num_threads()
    engine = engines(name)
    engine.generate(["3+4="], SamplingParams(n=2, max_new_tokens=4), generator=seeded(0))
    assert torch.get_num_threads() == threads
    torch.set_num_threads(threads + 1)
    try:
        assert torch.get_num_threads() == threads + 1
    finally:
        torch.set_num_threads(threads)


class _Echo:
    """A two-turn environment: answers the first turn with a fixed observation."""

    def __init__(self, **row):
        self.turns = 0

    def reset(self, **row):
        return None

    def step(self, action):
        self.turns += 1
        return "=> ok", 0.0, self.turns == 2, {}


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_multi_turn_trajectories_continue_from_the_ids_they_hold(name, engines, trained, tok):
    """Each turn is sampled from the trajectory's ids as they are (interior EOS and observation ids included):
    the learner, teacher-forcing the whole trajectory, gets the engine's own log-prob for every sampled token."""
    from grpoplus.envs.episodes import EpisodeLimits, run_episodes
    from grpoplus.envs.render import observation_ids

    engine = engines(name)
    rows = [{"prompt": p, "answer": ""} for p in PROMPTS]
    r, m = run_episodes(engine, tok, _Echo, rows, SamplingParams(n=2, max_new_tokens=12),
                        EpisodeLimits(max_turns=3, timeout_s=10.0, max_context=128), seeded(5))
    assert m["env/ended/done"] > 0, "the fixture model should end some turns with EOS"
    obs = observation_ids(tok, "=> ok")
    for row in range(r.response_ids.shape[0]):
        if len(r.turn_ends[row]) == 2:  # turn 1, its EOS, the observation's ids exactly, then turn 2
            end = r.turn_ends[row][0]
            assert r.response_ids[row, end].item() == tok.eos_token_id
            assert r.response_ids[row, end + 1:end + 1 + len(obs)].tolist() == obs
    logp, _ = response_logprobs_from_rollouts(trained, r)
    sampled = r.model_mask > 0
    assert (logp[sampled] - r.logp_roll[sampled]).abs().max() < KERNEL_GAP[name]
    assert (r.logp_roll[~sampled] == 0).all()


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_identical_prompts_in_one_request_draw_independently(name, engines):
    """A group's trajectories continue as separate prompts (n=1 each) from the same ids: they must not draw the
    same tokens."""
    r = engines(name).generate(["3+4="] * 8, SamplingParams(n=1, max_new_tokens=8), generator=seeded(2))
    assert len({tuple(row.tolist()) for row in r.response_ids}) > 1
