"""The supervised stage: its loss is the demonstrated tokens' cross-entropy whatever the micro-batches, it learns, it
resumes exactly, its checkpoint is a model RL takes, and a teacher's samples can be its demonstrations."""

import json
import subprocess
import sys

import pytest
import torch

from grpoplus.algo import AlgoConfig
from grpoplus.learner.prepare import LearnerPlan, prepare
from grpoplus.learner.update import optimizer_step
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.sft.collect import demo_batch, held_out_loss
from grpoplus.sft.demos import turns_demo


def demos(tok):
    rows = [("12+3=", [("#15", None)]), ("7*6=", [("42", "no"), ("#42", None)]), ("1+1=", [("#2", None)])]
    return [turns_demo(tok, tok(p)["input_ids"], turns) for p, turns in rows]


def hf_loss(model, tok, ds) -> torch.Tensor:
    """transformers' own causal-LM loss: right-padded rows, labels -100 except on the trained tokens."""
    rows = [list(d.prompt) + list(d.response) for d in ds]
    labels = [[-100] * len(d.prompt) + [t if k else -100 for t, k in zip(d.response, d.trained)] for d in ds]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    lab = torch.tensor([x + [-100] * (width - len(x)) for x in labels])
    return model(input_ids=ids, attention_mask=mask, labels=lab).loss


@pytest.mark.parametrize("micro", [1, 2, 8])
def test_the_loss_is_transformers_cross_entropy_whatever_the_micro_batches(micro):
    tok = char_tokenizer()
    model = tiny_model(tok, size="nano", seed=0)
    ds = demos(tok)
    plan = LearnerPlan(temperature=1.0, micro_batch_size=micro, max_grad_norm=1e9, logp_old="forward", objective="sft")
    batch, _, _ = prepare(demo_batch(ds, tok.pad_token_id), model, None, AlgoConfig(), plan)
    expected = hf_loss(model, tok, ds)
    expected.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    metrics, stepped, _ = optimizer_step(model, optimizer, batch, AlgoConfig(), plan)
    assert stepped and metrics["loss/nll"] == pytest.approx(float(expected.detach()), rel=1e-5)
    assert "loss/policy" not in metrics
    model.zero_grad()
    optimizer_step_grads = _grads_of_step(model, batch, plan)
    for name, grad in want.items():
        torch.testing.assert_close(optimizer_step_grads[name], grad, rtol=1e-4, atol=1e-6)
    assert held_out_loss(model, ds, tok.pad_token_id, plan) == pytest.approx(float(expected.detach()), rel=1e-5)


def _grads_of_step(model, batch, plan):
    """The accumulated gradient of one optimizer step (captured before the optimizer clears it)."""
    grads = {}

    class Capture(torch.optim.SGD):
        def step(self, closure=None):
            grads.update({n: p.grad.clone() for n, p in model.named_parameters()})

    optimizer_step(model, Capture(model.parameters(), lr=0.0), batch, AlgoConfig(), plan)
    return grads


def sft_trainer(out, **settings):
    from grpoplus import SFTTrainer

    base = dict(out=str(out), max_steps=6, demos_per_step=16, eval_every=0, eval_samples=0, eval_size=16,
                eval_demos=16, progress=False, loggers=[], save_every=3)
    return SFTTrainer("tiny-untrained", **{**base, **settings})


@pytest.mark.slow
def test_it_learns_and_resumes_exactly(tmp_path):
    whole = sft_trainer(tmp_path / "whole").train()
    losses = [r["loss/nll"] for r in whole.metrics if "loss/nll" in r]
    evals = [r["eval/loss"] for r in whole.metrics if "eval/loss" in r]
    assert losses[-1] < losses[0] and evals[-1] < evals[0]
    sft_trainer(tmp_path / "cut", max_steps=3).train()
    from grpoplus import Trainer

    resumed = Trainer.resume(tmp_path / "cut", ["max_steps=6"]).train()
    assert [r["loss/nll"] for r in resumed.metrics if "loss/nll" in r] == losses[3:]
    a = torch.load(whole.checkpoint / "trainer_state.pt", weights_only=False)["sampler"]
    b = torch.load(resumed.checkpoint / "trainer_state.pt", weights_only=False)["sampler"]
    assert a == b


@pytest.mark.slow
def test_its_checkpoint_is_a_model_rl_takes(tmp_path):
    from grpoplus import Trainer

    done = sft_trainer(tmp_path / "sft", max_steps=2).train()
    rl = Trainer(model=str(done.checkpoint), out=str(tmp_path / "rl"), max_steps=1, prompts_per_step=2, group_size=2,
                 eval_size=4, eval_samples=0, progress=False, loggers=[]).train()
    assert rl.final["step"] == 1


@pytest.mark.slow
def test_off_policy_distillation_trains_on_the_teachers_correct_samples(tmp_path):
    from grpoplus.sft.warmstart import build_warmstart
    from grpoplus.tasks import get_task

    teacher = build_warmstart("arithmetic")
    run = sft_trainer(tmp_path / "opd", max_steps=2, teacher=str(teacher), prompts_per_step=64, demo_samples=2,
                      task="arithmetic").train()
    rows = [json.loads(line) for line in (run.run_dir / "teacher_demos.jsonl").read_text().splitlines()]
    stats = json.loads((run.run_dir / "teacher_demos.json").read_text())
    assert stats["correct"] == len(rows) < stats["responses"]
    assert run.final["sft/demo_model_correct_frac"] == pytest.approx(len(rows) / stats["responses"])
    tok, task = char_tokenizer(), get_task("arithmetic")
    answers = {e.prompt: e.answer for e in task.split("train")}
    assert rows
    for row in rows:
        prompt = tok.decode(row["prompt"], skip_special_tokens=True)
        text = tok.decode(row["response"], skip_special_tokens=True)
        assert task.reward([prompt], [text], answer=[answers[prompt]]) == [1.0]


@pytest.mark.parametrize("args, said", [
    (["--demos", "missing.jsonl"], "does not exist"),
    (["--demos", "d.jsonl", "--teacher", "x"], "two sources of demonstrations"),
    (["demos_per_step=0"], "sft.demos_per_step must be >= 1"),
    (["sft.direct_frac=2"], "sft.direct_frac must be in [0, 1]"),
])
def test_bad_input_is_one_line(tmp_path, args, said):
    done = subprocess.run([sys.executable, "-m", "grpoplus", "sft", "--model", "tiny-untrained", "--out",
                           str(tmp_path / "r"), "progress=false", *args], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("grpoplus sft: error")]
    assert len(lines) == 1 and said in lines[0], done.stderr


def test_the_dry_run_renders_a_supervised_stage(capsys):
    from grpoplus.dryrun import print_dry_run

    assert print_dry_run(None, None, ["run.stage=sft", "sft.demos=wordproblems-calculator", "data.task=wordproblems",
                                      "data.tools=[calculator]", "learner.model=tiny-untrained",
                                      "data.chat_template=false",
                                      "sft.demos_per_step=8"], None) == 0
    out = capsys.readouterr().out
    assert "stage      supervised (run.stage=sft)" in out
    assert "8 demonstrations per optimizer step, from sft.demos=wordproblems-calculator" in out
    assert "none in training (the supervised stage)" in out
    with pytest.raises(ValueError, match="add --task wordproblems"):
        print_dry_run(None, None, ["run.stage=sft", "sft.demos=wordproblems-calculator"], None)


def test_the_dry_run_of_a_supervised_stage_from_an_rl_preset_counts_no_reference(capsys):
    """The grpo preset's beta does not act in the supervised stage: the learner builds no reference, and the dry run
    neither lists one nor counts its memory (it reads the learner's own decision)."""
    from grpoplus.dryrun import print_dry_run

    assert print_dry_run("grpo", None, ["run.stage=sft"], None) == 0
    out = capsys.readouterr().out
    assert "reference  none (the supervised stage)" in out and "reference, fp32, frozen" not in out
    assert print_dry_run("grpo", None, [], None) == 0
    out = capsys.readouterr().out
    assert "reference  a frozen copy of the policy" in out and "reference, fp32, frozen" in out


@pytest.mark.slow
@pytest.mark.parametrize("placement", [("learner.data_parallel=2",),
                                       ("learner.data_parallel=2", "learner.strategy=fsdp2")])
def test_learner_ranks_train_as_one_process_does(tmp_path, placement):
    """Data-parallel and sharded ranks take the supervised stage's batches as RL's: the same losses and weights."""
    one = sft_trainer(tmp_path / "one", max_steps=2, micro_batch_size=4, eval_demos=0, eval_accuracy=False).train()
    two = sft_trainer(tmp_path / "two", max_steps=2, micro_batch_size=4, eval_demos=0, eval_accuracy=False,
                      overrides=list(placement)).train()
    want = [r["loss/nll"] for r in one.metrics if "loss/nll" in r]
    assert [r["loss/nll"] for r in two.metrics if "loss/nll" in r] == pytest.approx(want, rel=1e-5)
    from safetensors.torch import load_file

    a, b = load_file(one.checkpoint / "model.safetensors"), load_file(two.checkpoint / "model.safetensors")
    for name, tensor in a.items():
        torch.testing.assert_close(b[name], tensor, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_lora_trains_the_adapters_alone(tmp_path):
    pytest.importorskip("peft")
    done = sft_trainer(tmp_path / "lora", max_steps=3, lora_rank=4, lr=1e-2, eval_accuracy=False).train()
    assert (done.checkpoint / "adapter_model.safetensors").is_file()
    assert not (done.checkpoint / "model.safetensors").exists()
    evals = [r["eval/loss"] for r in done.metrics if "eval/loss" in r]
    assert evals[-1] < evals[0]
