"""A local teacher: its scores equal independent forwards, the learner's distillation forward equals the log-prob
forward and the divergence computed row by row, a teacher with another vocabulary is refused, and the property
on-policy distillation exists for: a student distilled from a teacher that differs from it moves toward it."""

import pytest
import torch

from grpoplus.algo import reverse_kl
from grpoplus.config import build_config
from grpoplus.containers import SamplingParams
from grpoplus.entry.cli import main
from grpoplus.learner.distill import distill_forward
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.learner.precision import autocast
from grpoplus.metrics import read_metrics
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.rollout.hf import HFEngine
from grpoplus.teacher import check_vocabulary, load_teacher
from grpoplus.teacher.local import LocalTeacher

SMALL = ["prompts_per_step=8", "group_size=8", "max_new_tokens=10", "eval_size=4", "eval_samples=1",
         "progress=false", "loggers=[]", "micro_batch_size=64", "eval_every=1000", "save_every=1000"]


@pytest.fixture(scope="module")
def sharp_teacher_dir(tmp_path_factory, tok) -> str:
    """A nano model unlike the student (another seed) and far more certain (its final norm scaled by 8)."""
    model = tiny_model(tok, size="nano", seed=1)
    with torch.no_grad():
        model.model.norm.weight.mul_(8.0)
    path = tmp_path_factory.mktemp("sharp-teacher")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def rollouts(tok):
    student = tiny_model(tok, size="nano", seed=0)
    prompts = [tok(text, add_special_tokens=False).input_ids for text in ("1+2=", "13+4=", "7=")]
    return HFEngine(student, tok).generate(prompts, SamplingParams(n=3, max_new_tokens=6),
                                           generator=torch.Generator().manual_seed(0))


def test_local_teacher_scores_equal_its_own_logprob_forward_and_argmax(tok, rollouts):
    model = tiny_model(tok, size="nano", seed=1)
    logp, top1 = LocalTeacher(model).token_logprobs(rollouts)
    r = rollouts
    want, _ = response_logprobs(model, r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask)
    assert torch.allclose(logp, want, atol=1e-5)
    for i in range(len(r.texts)):  # row by row, unpadded: the argmax of the next-token distribution
        prompt = r.prompt_ids[i][r.prompt_mask[i].bool()]
        n = int(r.response_mask[i].sum())
        ids = torch.cat([prompt, r.response_ids[i, :n]])[None]
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1]
        assert torch.equal(top1[i, :n], logits.argmax(-1) == r.response_ids[i, :n])
        assert not top1[i, n:].any()


def test_distill_forward_gives_the_logprob_forward_and_the_per_row_divergence(tok, rollouts):
    student, teacher = tiny_model(tok, size="nano", seed=0), tiny_model(tok, size="nano", seed=1)
    r = rollouts
    logp, entropy, div = distill_forward(student, teacher, r.prompt_ids, r.prompt_mask, r.response_ids,
                                         r.response_mask, temperature=0.7, loss="reverse_kl", beta=0.5,
                                         with_entropy=True)
    want, want_entropy = response_logprobs(student, r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask,
                                           temperature=0.7, with_entropy=True)
    assert torch.allclose(logp, want, atol=1e-5) and torch.allclose(entropy, want_entropy, atol=1e-5)
    for i in range(len(r.texts)):
        prompt = r.prompt_ids[i][r.prompt_mask[i].bool()]
        n = int(r.response_mask[i].sum())
        ids = torch.cat([prompt, r.response_ids[i, :n]])[None]
        with torch.no_grad():
            s, t = (m(input_ids=ids).logits[0, len(prompt) - 1:-1] / 0.7 for m in (student, teacher))
        assert torch.allclose(div[i, :n], reverse_kl(s, t), atol=1e-5)
        assert (div[i, n:] == 0).all()
    div.sum().backward()  # the divergence's gradient reaches the student only
    assert student.lm_head.weight.grad is not None and teacher.lm_head.weight.grad is None


def test_a_teacher_with_another_vocabulary_is_refused(tok, tmp_path):
    other = char_tokenizer()
    other.add_tokens(["<extra>"])
    model = tiny_model(other, size="nano", seed=1)
    model.save_pretrained(tmp_path)
    other.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="another tokenizer than the policy"):
        check_vocabulary(str(tmp_path), tok)


def test_a_teacher_with_padding_rows_past_the_tokenizer_distils_over_the_rows_both_have(tok, rollouts, tmp_path):
    padded = tiny_model(tok, size="nano", seed=1)
    padded.resize_token_embeddings(len(tok) + 8)  # one tokenizer, a wider output layer (padding rows)
    padded.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    check_vocabulary(str(tmp_path), tok)  # the tokens are the policy's
    teacher = load_teacher(str(tmp_path), "cpu")
    student = tiny_model(tok, size="nano", seed=0)
    r = rollouts
    _, _, div = distill_forward(student, teacher.model, r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask,
                                temperature=1.0, loss="reverse_kl", beta=0.5)
    i, n = 0, int(r.response_mask[0].sum())
    prompt = r.prompt_ids[i][r.prompt_mask[i].bool()]
    ids = torch.cat([prompt, r.response_ids[i, :n]])[None]
    with torch.no_grad():
        s = student(input_ids=ids).logits[0, len(prompt) - 1:-1]
        t = teacher.model(input_ids=ids).logits[0, len(prompt) - 1:-1, :len(tok)]
    assert torch.allclose(div[i, :n], reverse_kl(s, t), atol=1e-5)


def test_a_bf16_mixed_teacher_stores_its_linears_in_bf16_and_scores_as_the_float32_one(tok, rollouts, sharp_teacher_dir):
    # the learner scores with the teacher under bf16 autocast, which casts every linear weight to bf16 anyway
    whole, lowered = load_teacher(sharp_teacher_dir, "cpu"), load_teacher(sharp_teacher_dir, "cpu", "bf16_mixed")
    linears = [m.weight.dtype for m in lowered.model.modules() if isinstance(m, torch.nn.Linear)]
    assert torch.bfloat16 in linears and all(p.dtype == torch.float32 for p in whole.model.parameters())
    with autocast("bf16_mixed", "cpu"):
        expected, got = whole.token_logprobs(rollouts), lowered.token_logprobs(rollouts)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert not torch.equal(got[0], load_teacher(sharp_teacher_dir, "cpu").token_logprobs(rollouts)[0])  # bf16 ran


@pytest.mark.parametrize("overrides,match", [
    (["lambda_opd=1.0"], "name one with learner.teacher"),
    (["teacher=/some/dir"], "loaded for nothing"),
    (["teacher=http://127.0.0.1:9/v1", "distill_loss=gjsd"], "an endpoint"),
    (["teacher=/some/dir", "distill_loss=reverse_kl", "data_parallel=2", "strategy=fsdp2"], "replicated learners"),
    (["teacher=tiny-teacher", "lambda_opd=1", "data=rows.jsonl", "model=some/dir"],
     "^learner.teacher=tiny-teacher with data.data=rows.jsonl: .* is warm-started on a built-in task"),
    (["teacher=tiny-untrained", "lambda_opd=1"], "knows nothing to teach"),
    (["run.stage=sft", "sft.demo_model=tiny-untrained"], "knows nothing to teach"),
])
def test_teacher_settings_that_do_not_fit_are_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        build_config("grpo", overrides=overrides)


def test_pure_distillation_turns_the_reward_filters_off_with_a_note(capfd):
    cfg = build_config("dapo", overrides=["teacher=/some/dir", "lambda_opd=1.0", "opd_outcome=false"])
    assert not cfg.algo.dynamic_sampling
    assert "algo.dynamic_sampling turned off" in capfd.readouterr().err


def _distil(nano_dir, teacher, out, *extra) -> list[float]:
    assert main(["train", "--preset", "grpo", "--model", nano_dir, f"teacher={teacher}", "--out", str(out),
                 "max_steps=24", "warmup_steps=0", "lr_schedule=constant", *SMALL, *extra]) == 0
    return [r["opd/reverse_kl"] for r in read_metrics(out) if "opd/reverse_kl" in r]


@pytest.mark.parametrize("how", [["lambda_opd=1.0", "opd_outcome=false", "lr=1e-3"],
                                 ["distill_loss=reverse_kl", "lr=1e-2"]], ids=["opd_advantage", "reverse_kl_loss"])
def test_a_distilled_student_moves_toward_its_teacher(nano_dir, sharp_teacher_dir, tmp_path, how):
    kl = _distil(nano_dir, sharp_teacher_dir, tmp_path / "run", *how)
    assert len(kl) == 24
    early, late = sum(kl[:4]) / 4, sum(kl[-4:]) / 4
    assert late < 0.9 * early, (early, late)  # 0.76-0.84 over seeds 1-3 (opd), 0.35-0.45 (reverse_kl)


def test_rl_with_a_dense_teacher_signal_trains_and_reports_agreement(nano_dir, sharp_teacher_dir, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--model", nano_dir, f"teacher={sharp_teacher_dir}", "lambda_opd=0.1", "--out", str(out),
                 "max_steps=2", *SMALL]) == 0
    last = read_metrics(out)[-1]
    assert 0.0 <= last["opd/top1_agreement"] <= 1.0 and last["opd/reverse_kl"] == last["opd/reverse_kl"]
    assert "loss/distill" not in last


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")  # recorded, not stepped
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_the_distillation_loss_accumulated_over_micro_batches_is_the_whole_batchs(tok, rollouts, aggregation):
    import copy

    from grpoplus.assemble.learner import build_learner_parts, build_learner_plan
    from grpoplus.containers import ScoredGroups
    from grpoplus.distributed.learner import learn_step
    from grpoplus.plan import resolve

    rewards = torch.randn(len(rollouts.texts), generator=torch.Generator().manual_seed(2))
    scored = ScoredGroups(rollouts, rewards, rewards > 0, {})
    gradients = []
    for micro in (9, 2):
        cfg = build_config("grpo", overrides=["teacher=/unused", "distill_loss=gjsd", "distill_coef=0.7",
                                              f"aggregation={aggregation}", f"micro_batch_size={micro}"])
        cfg.learner.teacher = None  # the teacher is handed in below, not loaded
        student = tiny_model(tok, size="nano", seed=0)
        parts, plan = build_learner_parts(resolve(cfg).learner, student), build_learner_plan(resolve(cfg).learner, student)
        parts.teacher = LocalTeacher(tiny_model(tok, size="nano", seed=1))
        seen = {}
        parts.optimizer.step = lambda seen=seen, model=student: seen.update(
            {n: p.grad.clone() for n, p in model.named_parameters()})
        result = learn_step(parts, copy.deepcopy(scored), 1, cfg.algo, plan)
        assert result.metrics["loss/distill"] > 0
        gradients.append(seen)
    for key, whole in gradients[0].items():
        assert torch.allclose(whole, gradients[1][key], rtol=1e-4, atol=1e-7), key


def test_the_builtin_teacher_is_loaded_on_the_runs_task_with_the_policys_tokenizer(tok, sharp_teacher_dir, monkeypatch):
    """tiny-teacher names a built-in model: check_vocabulary reads the character tokenizer, and the teacher loaded
    is the built-in teacher's warm start of the run's task (the medium model, seed 0 whatever the run's)."""
    import grpoplus.sft.warmstart as warmstart
    from grpoplus.teacher import check_vocabulary

    check_vocabulary("tiny-teacher", tok)  # no error: the same character tokenizer
    asked = []
    monkeypatch.setattr(warmstart, "build_warmstart", lambda *a, **kw: asked.append((a, kw)) or sharp_teacher_dir)
    teacher = load_teacher("tiny-teacher", "cpu", task="arithmetic", difficulty=3)
    assert asked == [(("arithmetic", 3), dict(size="medium", steps=3 * warmstart.DEFAULT_STEPS, direct_frac=0.0, seed=0))]
    assert isinstance(teacher, LocalTeacher)
