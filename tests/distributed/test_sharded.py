"""learner.strategy=fsdp2: 2 gloo ranks shard the policy and train like one process (to float32 summation
order), with uneven micro-batch shares, resume exactly after SIGKILL, and write checkpoints any strategy resumes."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bounded import run_bounded
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from grpoplus.config import build_config
from grpoplus.entry.cli import main
from grpoplus.metrics import read_metrics

KILLER = str(Path(__file__).resolve().parents[1] / "killed.py")  # grpoplus train, SIGKILLed after step N

SMALL = ["prompts_per_step=4", "group_size=4", "max_new_tokens=10", "eval_size=6", "eval_samples=2",
         "progress=false", "loggers=[]", "threads=1", "doctor_every=0", "max_steps=4", "save_every=2",
         "eval_every=2"]
FSDP2 = ["data_parallel=2", "strategy=fsdp2"]


def _train(out, *args: str, kill_at: int | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, KILLER, str(kill_at)] if kill_at else [sys.executable, "-m", "grpoplus"]
    return run_bounded([*cmd, "train", "--out", str(out), *args])


def _resume(out, *overrides: str) -> subprocess.CompletedProcess:
    return run_bounded([sys.executable, "-m", "grpoplus", "train", "--resume", str(out), *overrides])


def _weights(run, step=4) -> dict:
    return load_file(run / "checkpoints" / f"step-{step}" / "model.safetensors")


def _comparable(records):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in records]


def _close(a: list[dict], b: list[dict], rel: float) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(_comparable(a), _comparable(b)):
        assert x.keys() == y.keys()
        for key in x:
            assert x[key] == pytest.approx(y[key], rel=rel, abs=1e-7), (x["step"], key)


@pytest.mark.slow
@pytest.mark.parametrize("micro", ["2", "3", "3,packed"])  # 3: a mini-batch of 8 rows makes 3 micro-batches, 2 on
def test_two_sharded_ranks_train_like_one_process(nano_dir, tmp_path, micro):  # one rank; packed: learner.packing=on
    size, *packed = micro.split(",")
    common = ["--model", nano_dir, *SMALL, f"micro_batch_size={size}", *(["packing=on"] if packed else [])]
    one, two = tmp_path / "one", tmp_path / "two"
    assert _train(one, *common).returncode == 0
    run = _train(two, *common, *FSDP2)
    assert run.returncode == 0, run.stderr[-2000:]
    _close(read_metrics(two), read_metrics(one), rel=1e-5)  # the same rollouts, rewards and losses
    w1, w2 = _weights(one), _weights(two)
    assert w1.keys() == w2.keys()
    moved = max(float((w1[k] - load_file(one / "checkpoints/step-2/model.safetensors")[k]).abs().max()) for k in w1)
    gap = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert gap < 1e-6 < moved, (gap, moved)


@pytest.mark.slow
def test_a_vision_language_policy_trains_on_two_ranks_like_one_process_replicated_or_sharded(tmp_path):
    """Rows with images on 2 learner ranks: replicated, bit for bit one process's run; sharded (the language model's
    layers and the vision tower each a unit), to float32 summation order; the frozen vision tower never moves."""
    common = ["--model", "tiny-vlm", "task=shapes", *SMALL, "max_steps=1", "save_every=1", "eval_every=1",
              "micro_batch_size=2"]
    one, two, sharded = tmp_path / "one", tmp_path / "two", tmp_path / "sharded"
    assert main(["train", "--out", str(one), *common]) == 0  # one process: this one
    for out, strategy in ((two, "replicate"), (sharded, "fsdp2")):
        run = _train(out, *common, "data_parallel=2", f"strategy={strategy}")
        assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert _comparable(read_metrics(two)) == _comparable(read_metrics(one))
    w1, w2, w3 = (_weights(run, step=1) for run in (one, two, sharded))
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    _close(read_metrics(sharded), read_metrics(one), rel=1e-5)
    assert max(float((w1[k] - w3[k]).abs().max()) for k in w1) < 1e-6
    from grpoplus.models.tiny_vision import tiny_vision_model
    from grpoplus.models.vision import is_vision_part

    tiny_vision_model("qwen2_5_vl", seed=0)[0].save_pretrained(tmp_path / "start")  # its checkpoint's names
    start = load_file(tmp_path / "start" / "model.safetensors")
    vision = [k for k in w3 if is_vision_part(k)]
    assert vision and all(torch.equal(w3[k], start[k]) for k in vision)  # frozen (learner.train_vision=false)
    assert any(not torch.equal(w3[k], start[k]) for k in w3 if not is_vision_part(k))


@pytest.mark.slow
def test_two_sharded_ranks_with_compiled_layers_train_like_one_eager_process(nano_dir, tmp_path):
    common = ["--model", nano_dir, *SMALL, "max_steps=3", "save_every=0", "eval_every=0", "micro_batch_size=3"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert _train(one, *common).returncode == 0
    run = _train(two, *common, *FSDP2, "learner.compile=true")  # each rank compiles its layers; FSDP2 gathers around them
    assert run.returncode == 0, run.stderr[-2000:]
    eager, compiled = read_metrics(one), read_metrics(two)
    assert [r["step"] for r in eager] == [r["step"] for r in compiled]
    trained = [(e, c) for e, c in zip(eager, compiled) if "loss/total" in e]
    assert trained and all(c["learner/compiled_graphs"] > 0 for _, c in trained)
    for e, c in trained:
        for key in ("loss/total", "optim/grad_norm"):
            assert c[key] == pytest.approx(e[key], rel=1e-5, abs=1e-7), (e["step"], key)


@pytest.mark.slow
def test_a_sharded_run_resumes_exactly_and_its_checkpoint_resumes_in_one_process(nano_dir, tmp_path):
    common = ["--model", nano_dir, *SMALL, "micro_batch_size=2", "beta=0.02"]
    whole, killed, other = tmp_path / "whole", tmp_path / "killed", tmp_path / "other"
    assert _train(whole, *common, *FSDP2).returncode == 0
    run = _train(killed, *common, *FSDP2, kill_at=3)
    assert run.returncode == -9  # rank 0 killed after step 3 was logged; its last checkpoint is step 2
    resumed = _resume(killed)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _comparable(read_metrics(killed)) == _comparable(read_metrics(whole))
    assert all(torch.equal(a, _weights(whole)[k]) for k, a in _weights(killed).items())
    # `grpoplus export`: the sharded run's newest checkpoint as a plain Hugging Face directory
    assert main(["export", str(whole), "--out", str(tmp_path / "hf")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True)
    state = exported.state_dict()
    assert all(torch.equal(state[k], w) for k, w in _weights(whole).items())
    assert not (tmp_path / "hf" / "trainer_state.pt").exists() and not (tmp_path / "hf" / "optimizer").exists()
    # Its optimizer state: each rank's shards (torch.distributed.checkpoint), never gathered whole
    saved = whole / "checkpoints" / "step-4"
    assert sorted(f.name for f in (saved / "optimizer").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert "optimizer" not in torch.load(saved / "trainer_state.pt", weights_only=False)
    # The same checkpoint (weights + the optimizer shards) resumed by one process:
    run = _train(other, *common, *FSDP2, kill_at=3)
    assert run.returncode == -9
    resumed = _resume(other, "data_parallel=1")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    _close(read_metrics(other), read_metrics(whole), rel=1e-5)
    # and the other way: one process's checkpoint (the optimizer state whole) resumed by two sharded ranks
    single = tmp_path / "single"
    assert _train(single, *common, kill_at=3).returncode == -9
    resumed = _resume(single, "data_parallel=2", "strategy=fsdp2")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    _close(read_metrics(single), read_metrics(whole), rel=1e-5)


@pytest.mark.parametrize("override, message", [
    ("routing_replay=r2", "routing_replay=r2 yet: set routing_replay=off"),
    ("ref_reset_every=5 beta=0.01", "ref_reset_every yet: set ref_reset_every=0"),
    ("strategy=zero3", "replicate, fsdp2"),
    ("cpu_offload=true", "learner.device=cpu keeps them in CPU memory already: drop learner.cpu_offload"),
])
def test_what_a_sharded_learner_does_not_run_is_refused_in_one_line(override, message):
    with pytest.raises(ValueError, match=message):
        build_config(overrides=[*FSDP2, "micro_batch_size=16", *override.split()])


@pytest.mark.slow
def test_sharded_bf16_mixed_trains_close_to_one_process_bf16(nano_dir, tmp_path):
    # Under fsdp2, bf16_mixed gathers the layers' parameters in bf16 (FSDP2's MixedPrecisionPolicy), so the
    # norms and the residual stream run in bf16 too, where one process keeps them in float32 under autocast:
    # the runs agree to bf16 rounding, not float32's.
    common = ["--model", nano_dir, *SMALL, "micro_batch_size=2", "precision=bf16_mixed"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert _train(one, *common).returncode == 0
    run = _train(two, *common, *FSDP2)
    assert run.returncode == 0, run.stderr[-2000:]
    w1, w2 = _weights(one), _weights(two)
    assert all(w.dtype == torch.float32 for w in w2.values())  # the master weights
    gap = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert 0 < gap < 2e-3, gap
    assert read_metrics(two)[-1]["mismatch/abs_p_diff_max"] > 0


def test_cpu_offload_needs_a_sharded_learner():
    with pytest.raises(ValueError, match="needs learner.strategy=fsdp2 and learner.data_parallel > 1"):
        build_config(overrides=["cpu_offload=true"])
