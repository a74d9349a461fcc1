"""rollout.compile: the hf engine's decode step at fixed shapes, compiled, gives the eager engine's rollouts."""

import pytest
import torch

from grpoplus.config import build_config
from grpoplus.models.tiny import tiny_model
from grpoplus.rollout import EngineOptions, HFEngine, SamplingParams
from grpoplus.rollout.compiled_step import bucket_capacity, bucket_rows, forward_step


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_same_rollouts(a, b):
    # Same seed, same tokens; log-probs to float32 rounding (the static step computes ended rows too, and attends
    # over the whole capacity under a mask, so its sums may round differently).
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_mask, b.response_mask) and torch.equal(a.finished, b.finished)
    torch.testing.assert_close(a.logp_roll, b.logp_roll, atol=1e-5, rtol=0)


def uncompiled(engine: HFEngine) -> HFEngine:
    """The engine's static-shape step run as it is (the decode state of rollout.compile without the compiler)."""
    engine.step.fn = forward_step
    return engine


@pytest.mark.parametrize("pack", [True, False])
def test_static_step_gives_the_eager_rollouts(model, tok, prompts, favour_eos, pack):
    # Rows end at different steps (favour_eos), so the eager loop compacts its batch while the static one keeps
    # every row: the sampled slots, their random numbers and their log-probs must still match.
    favour_eos(model, 2.5)
    params = SamplingParams(n=4, max_new_tokens=14)
    eager = HFEngine(model, tok, EngineOptions(extra={"pack_weights": pack})).generate(prompts, params,
                                                                                      generator=seeded(3))
    assert 0 < eager.finished.sum() < len(eager.finished)
    static = uncompiled(HFEngine(model, tok, EngineOptions(compile=True, extra={"pack_weights": pack})))
    assert_same_rollouts(static.generate(prompts, params, generator=seeded(3)), eager)


def test_compiled_step_gives_the_eager_rollouts_and_is_reused(model, tok, prompts, favour_eos):
    favour_eos(model, 2.5)
    params = SamplingParams(n=4, max_new_tokens=10)
    eager = HFEngine(model, tok)
    compiled = HFEngine(model, tok, EngineOptions(compile=True))
    for seed in (4, 5):  # a second rollout runs the same compiled step (new cache, new packed weights)
        assert_same_rollouts(compiled.generate(prompts, params, generator=seeded(seed)),
                             eager.generate(prompts, params, generator=seeded(seed)))
    assert not compiled.step.failed


def test_rows_and_positions_come_in_buckets():
    assert [bucket_rows(n) for n in (1, 2, 3, 5, 9, 16, 17, 33, 64, 65)] == [1, 2, 4, 8, 16, 16, 32, 48, 64, 80]
    assert [bucket_capacity(p) for p in (1, 255, 256, 257, 600)] == [256, 256, 256, 512, 768]


def test_rollouts_of_other_widths_and_row_counts_in_a_bucket_reuse_the_graph(model, tok, prompts, favour_eos):
    # 16 rows, then 12 (a refill of three groups) and 16 again with the prompts one character wider: one bucket of
    # rows and one of positions, so the step compiled for the first rollout serves the others, and the rows added to
    # fill the bucket change no sampled token
    from torch._dynamo.utils import counters

    favour_eos(model, 2.5)
    params = SamplingParams(n=4, max_new_tokens=10)
    eager, compiled = HFEngine(model, tok), HFEngine(model, tok, EngineOptions(compile=True))
    wider = [p.replace("=", " =") for p in prompts]
    for i, batch in enumerate((prompts, prompts[:3], wider)):
        assert_same_rollouts(compiled.generate(batch, params, generator=seeded(6)),
                             eager.generate(batch, params, generator=seeded(6)))
        if i == 0:
            graphs = counters["stats"]["unique_graphs"]
    assert counters["stats"]["unique_graphs"] == graphs and not compiled.step.failed


def test_a_failing_compiled_step_goes_on_eagerly_in_one_line(model, tok, prompts, capsys):
    def broken(*args):
        raise RuntimeError("inductor could not lower the step\nmore detail")

    params = SamplingParams(n=2, max_new_tokens=6)
    engine = HFEngine(model, tok, EngineOptions(compile=True))
    engine.step.fn = broken
    got = engine.generate(prompts, params, generator=seeded(6))
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["grpoplus: rollout.compile: the compiled decode step failed (RuntimeError: inductor could not "
                   "lower the step); decoding eagerly from here"]
    assert engine.step.failed
    assert_same_rollouts(got, HFEngine(model, tok).generate(prompts, params, generator=seeded(6)))


def test_a_model_it_cannot_compile_decodes_eagerly_said_in_one_line(tok, capsys):
    model = tiny_model(tok, size="nano", seed=0)
    model.set_attn_implementation("eager")
    engine = HFEngine(model, tok, EngineOptions(compile=True))
    assert engine.step is None
    assert capsys.readouterr().err.strip().splitlines() == [
        "grpoplus: rollout.compile: the decode step of this model is not compiled (its attention implementation is "
        "'eager', not sdpa); decoding eagerly"]


def test_compile_on_another_engine_is_refused_before_the_run():
    pytest.importorskip("vllm")  # without it, the missing package is what the config names first
    with pytest.raises(ValueError, match=r"^rollout.compile=true compiles the hf engine's decode step, and "
                                         r"rollout.engine=vllm decodes with its own"):
        build_config("grpo", overrides=["rollout.engine=vllm", "rollout.compile=true"])


def test_the_plan_carries_compile_to_the_engine():
    from grpoplus.plan.run import engine_plan

    assert engine_plan(build_config("grpo", overrides=["rollout.compile=true"])).compile is True
    assert engine_plan(build_config("grpo")).compile is False



def test_a_buckets_tensors_are_kept_for_the_next_rollout_and_freed_before_an_update(model, tok, prompts):
    # A captured graph replays on the addresses it was captured on: a bucket's next rollout writes into the same
    # cache, mask and positions (marked static, so a CUDA graph takes them as they are); run.release_memory frees
    # them (and the graphs) before each update, and the next rollout is the same as before.
    params = SamplingParams(n=4, max_new_tokens=6)
    kept = uncompiled(HFEngine(model, tok, EngineOptions(compile=True)))
    first = kept.generate(prompts, params, generator=seeded(7))
    tensors = dict(kept.step.pool.tensors)
    assert any(name.startswith("k") for name, *_ in tensors) and {"mask", "tokens", "positions"} <= {
        name for name, *_ in tensors}
    assert all(t._dynamo_static_input_type == "unguarded" for t in tensors.values())
    kept.offload()  # run.release_memory=off: kept
    kept.generate(prompts[:3], params, generator=seeded(7))  # 12 rows: the same bucket of 16
    assert {k: id(t) for k, t in kept.step.pool.tensors.items()} == {k: id(t) for k, t in tensors.items()}
    released = uncompiled(HFEngine(model, tok, EngineOptions(compile=True, release_memory=True)))
    released.generate(prompts, params, generator=seeded(7))
    released.offload()
    assert released.step.pool.tensors == {}
    assert_same_rollouts(released.generate(prompts, params, generator=seeded(7)), first)


def test_the_plan_carries_release_memory_to_the_engine():
    from grpoplus.plan.run import engine_plan

    assert engine_plan(build_config("grpo")).release_memory is True  # run.release_memory=phases
    assert engine_plan(build_config("grpo", overrides=["run.release_memory=off"])).release_memory is False


def test_cuda_graphs_skipped_by_torch_are_said_in_one_line(model, tok, prompts, capsys):
    # On a GPU the step is compiled for CUDA graphs; torch may compile it without them (an input it would have to
    # copy in is written to, say) and only count it: the run says so once, and goes on with the compiled step.
    from torch._dynamo.utils import counters

    engine = uncompiled(HFEngine(model, tok, EngineOptions(compile=True)))
    engine.step.graphs = True  # as on a GPU
    plain = engine.step.fn

    def skipping(*args):
        counters["inductor"]["cudagraph_skips"] += 1
        return plain(*args)

    engine.step.fn = skipping
    got = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=5), generator=seeded(8))
    assert capsys.readouterr().err.strip().splitlines() == [
        "grpoplus: rollout.compile: torch skipped CUDA graphs for the decode step (TORCH_LOGS=cudagraphs says why); "
        "it runs compiled, a kernel launch per op"]
    assert not engine.step.failed and got.response_mask.sum() > 0
