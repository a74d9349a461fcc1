"""``grpoplus selftest``: its checks pass on a sound machine and fail, in one line, on a broken one; a failing
check does not stop the others; the report is written as JSON; the exit code says whether a check failed."""

import json
import re

import pytest
import torch

from grpoplus.entry.cli import main
from grpoplus.selftest import CHECKS, fixtures, runner
from grpoplus.selftest.runner import Check, CheckFailed, CheckSkipped, run_checks

FAST = "engine_logprobs,engine_logprobs_bf16,chunked_head,bf16_update,lora,fsdp2_one_rank,cpu_offload,ddp_one_rank"


def test_the_fast_checks_pass_on_this_cpu_and_write_a_report(tmp_path, capsys, one_thread):
    assert main(["selftest", "--device", "cpu", "--only", FAST, "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("PASS environment  torch ")
    assert lines[-1].startswith("selftest on ") and "0 failed" in lines[-1]
    report = json.loads((tmp_path / "selftest.json").read_text())
    by_name = {r["name"]: r for r in report["results"]}
    assert set(by_name) == {"environment", *FAST.split(",")}
    assert by_name["cpu_offload"]["status"] == "skip"  # a GPU setting
    assert by_name["engine_logprobs"]["figures"]["max_gap"] <= 1e-5
    assert by_name["fsdp2_one_rank"]["figures"]["weight_gap"] <= 1e-5
    assert report["environment"]["torch"] == torch.__version__


def test_the_engine_check_fails_when_the_sampler_and_the_learner_disagree(monkeypatch, capsys, one_thread):
    # a sampler whose recorded log-probs are off by 1e-4 nats: what the check exists to catch
    sample = fixtures.sample

    def off(*args, **kwargs):
        r = sample(*args, **kwargs)
        r.logp_roll += 1e-4 * r.response_mask
        return r

    monkeypatch.setattr(fixtures, "sample", off)
    assert main(["selftest", "--only", "engine_logprobs,chunked_head"]) == 1
    out = capsys.readouterr().out
    assert "FAIL engine_logprobs" in out and "the sampler and the learner disagree" in out
    assert "PASS chunked_head" in out  # the next check still ran


def test_a_sharded_rank_that_trains_differently_fails_its_check(monkeypatch, one_thread):
    import grpoplus.selftest.rank_checks as R

    real = R.sharded_twin
    monkeypatch.setattr(R, "sharded_twin", lambda *a, **k: _nudged(real(*a, **k)))  # one shard off by 1e-3
    report = run_checks("cpu", ["fsdp2_one_rank"], echo=lambda line: None)
    assert report.failed and "fsdp2 on one rank vs the plain learner: weights differ" in report.failed[0].message


def _nudged(model):
    with torch.no_grad():
        next(model.parameters()).to_local().add_(1e-3)
    return model


def _raising(err):
    def fn(ctx):
        raise err
    return fn


def test_every_kind_of_failure_is_one_line_and_the_run_goes_on(tmp_path):
    checks = [Check("oom", "process", "", _raising(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))),
              Check("crash", "process", "", _raising(KeyError("lm_head"))),
              Check("missing", "process", "", _raising(ModuleNotFoundError("No module named 'peft'", name="peft"))),
              Check("property", "process", "", _raising(CheckFailed("loss rose: 1.0 -> 2.0"))),
              Check("absent", "process", "", _raising(CheckSkipped("a GPU setting"))),
              Check("fine", "process", "", lambda ctx: {"x": 1.0})]
    lines = []
    report = run_checks("cpu", checks=checks, out=tmp_path, echo=lines.append)
    status = {r.name: r.status for r in report.results}
    assert status == {"environment": "pass", "oom": "fail", "crash": "fail", "missing": "fail", "property": "fail",
                      "absent": "skip", "fine": "pass"}
    messages = {r.name: r.message for r in report.results}
    assert messages["oom"].startswith("out of memory on the CPU: CUDA out of memory.")
    assert messages["crash"].startswith("KeyError: 'lm_head' (at test_selftest.py:")
    assert messages["missing"] == ("LoRA adapters needs the peft package, which is not installed: "
                                   "pip install -e '.[lora]'")
    assert all("\n" not in line for line in lines) and len(lines) == len(checks) + 2  # environment, checks, summary
    # the summary counts the 6 checks that ran (1 + 4 + 1), not the environment line printed before them
    counts = re.search(r": (\d+) passed, (\d+) failed, (\d+) skipped in ", lines[-1]).groups()
    assert sum(int(n) for n in counts) == len(checks)
    assert lines[-1].endswith(": 1 passed, 4 failed, 1 skipped in 0 s: oom, crash, missing, property")
    assert json.loads((tmp_path / "selftest.json").read_text())["summary"] == lines[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a CUDA device")
def test_cuda_without_cuda_fails_the_environment_in_one_line_and_runs_nothing(capsys):
    assert main(["selftest", "--device", "cuda", "--only", "chunked_head,fsdp2_one_rank"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("FAIL environment  --device cuda: torch ") and "use --device cpu" in out[0]
    assert out[1].startswith("SKIP chunked_head") and "not run: cuda cannot run it" in out[1]
    assert out[-1].endswith(": 0 passed, 0 failed, 2 skipped in 0 s; the environment failed, so no check ran")


def test_a_gpu_without_bf16_fails_the_bf16_checks_and_says_why(monkeypatch, one_thread):
    import grpoplus.selftest.learner_checks as L

    monkeypatch.setattr(L, "bf16_problem", lambda device: "Tesla T4 (compute capability 7.5) has no native bfloat16")
    report = run_checks("cpu", ["engine_logprobs_bf16", "bf16_update", "engine_logprobs"], echo=lambda line: None)
    assert [r.name for r in report.failed] == ["engine_logprobs_bf16", "bf16_update"]
    assert all(r.message.startswith("Tesla T4") for r in report.failed)


def test_a_gpu_without_nccl_fails_the_rank_checks_in_one_line(monkeypatch, tmp_path, one_thread):
    import grpoplus.selftest.rank_checks as R
    from grpoplus.selftest.runner import Context

    class OnGpu(Context):  # the rank checks' view of the device; the models still run on the CPU
        on_gpu = True

    monkeypatch.setattr(R, "nccl_problem", lambda: "torch 2.13.0 has no NCCL backend: install a CUDA build of torch")
    for check in (R.fsdp2_one_rank, R.ddp_one_rank):
        with pytest.raises(CheckFailed, match="^torch 2.13.0 has no NCCL backend: install a CUDA build of torch$"):
            check(OnGpu(torch.device("cpu"), tmp_path))


def test_an_unknown_check_and_a_bad_device_are_refused(capsys):
    assert main(["selftest", "--only", "engine_logprobs,nope"]) == 2
    assert "unknown selftest check(s) nope; choose from: engine_logprobs" in capsys.readouterr().err
    assert main(["selftest", "--device", "tpu", "--only", "chunked_head"]) == 1
    assert "--device tpu: choose cuda, cuda:N or cpu" in capsys.readouterr().out


def test_no_check_can_take_the_environment_lines_name():
    with pytest.raises(ValueError, match="'environment' is the report's environment line"):
        runner.check("environment", "process", "")(lambda ctx: {})


def test_the_checks_run_in_stage_order():
    stages = [c.stage for c in CHECKS]
    assert stages == sorted(stages, key=("process", "rank", "trainer").index)
    assert [c.name for c in CHECKS][-2:] == ["checkpoint_resume", "main_job"]
