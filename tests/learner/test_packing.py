"""Packed micro-batches (learner.packing): no padding token in any layer, and the padded forward's numbers.

Rows of widely varying prompt and response lengths, so the padded forward holds more padding than real tokens.
"""

import copy
import importlib.util
from dataclasses import replace

import pytest
import torch

from grpoplus.algo import AlgoConfig
from grpoplus.config import build_config
from grpoplus.containers import Rollouts, TrainBatch
from grpoplus.learner.entropy import response_logprobs_and_entropy
from grpoplus.learner.logprobs import response_logprobs
from grpoplus.learner.microbatch import split_micro_batches
from grpoplus.learner.packing import check_packing, pack_rows, packing_pays, padding_metrics
from grpoplus.learner.prepare import LearnerPlan, decided_packing
from grpoplus.learner.replay import LearnerRouting, input_mask
from grpoplus.learner.update import optimizer_step
from grpoplus.models.families import tiny_family_model
from grpoplus.models.tiny import tiny_model, tiny_moe_model
from grpoplus.plan import resolve

from .conftest import lora_nano, three_steps

PROMPT_LENS = [9, 5, 3, 9, 7, 4, 2, 6]
RESPONSE_LENS = [12, 2, 7, 1, 10, 5, 12, 3]


def _rows(tok, seed=0):
    """Left-padded prompts and right-padded responses of the lengths above: [8, 9] and [8, 12]."""
    g = torch.Generator().manual_seed(seed)
    n, p, t = len(PROMPT_LENS), max(PROMPT_LENS), max(RESPONSE_LENS)
    pm = (torch.arange(p)[None] >= p - torch.tensor(PROMPT_LENS)[:, None]).long()
    rm = (torch.arange(t)[None] < torch.tensor(RESPONSE_LENS)[:, None]).long()
    pid = torch.where(pm.bool(), torch.randint(5, len(tok), (n, p), generator=g), tok.pad_token_id)
    rid = torch.where(rm.bool(), torch.randint(5, len(tok), (n, t), generator=g), tok.pad_token_id)
    return pid, pm, rid, rm


def _grads(model, rows, **kwargs):
    model.zero_grad(set_to_none=True)
    logp, entropy = response_logprobs(model, *rows, with_entropy=True, **kwargs)
    (logp * torch.linspace(-1.0, 2.0, logp.shape[1])).sum().backward()
    return logp.detach(), entropy, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("head", ["chunked head", "model logits"])
def test_packed_logprobs_entropy_and_gradients_equal_the_padded_ones(tok, head):
    model = tiny_model(tok, size="nano", seed=0)
    if head == "model logits":  # a hooked head takes the logits path
        model.lm_head.register_forward_hook(lambda module, inputs, out: out)
    rows = _rows(tok)
    logp, entropy, grads = _grads(model, rows, share_prompts=False)
    logp_p, entropy_p, grads_p = _grads(model, rows, packing=True)
    torch.testing.assert_close(logp_p, logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy_p, entropy, atol=1e-5, rtol=0)
    assert (logp_p[rows[3] == 0] == 0).all()
    for name, grad in grads.items():
        torch.testing.assert_close(grads_p[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_the_entropy_bonus_forward_packs_to_the_same_numbers_and_gradients(tok):
    model = tiny_model(tok, size="nano", seed=0)
    rows = _rows(tok, seed=1)
    out = []
    for packing in (False, True):
        model.zero_grad(set_to_none=True)
        logp, entropy = response_logprobs_and_entropy(model, *rows, temperature=0.7, packing=packing)
        (logp.sum() + 0.3 * entropy.sum()).backward()
        out.append((logp.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()]))
    (a, ea, ga), (b, eb, gb) = out
    torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
    torch.testing.assert_close(eb, ea, atol=1e-5, rtol=0)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-4)


def test_no_padding_token_enters_the_packed_forward(tok):
    model = tiny_model(tok, size="nano", seed=0)
    pid, pm, rid, rm = _rows(tok)
    seen = []
    model.model.embed_tokens.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    with torch.no_grad():
        response_logprobs(model, pid, pm, rid, rm, packing=True)
    (ids,) = seen
    real = sum(PROMPT_LENS) + sum(RESPONSE_LENS)  # 45 + 65 = 110 real tokens; padded: 8 x (9 + 12) = 168
    assert ids.shape == (1, real) and not (ids == tok.pad_token_id).any()


def test_packed_rows_restart_their_positions_and_predict_from_the_token_before():
    ids = torch.tensor([[0, 5, 6, 7, 4], [8, 9, 1, 3, 0]])  # prompt of 3 columns, response of 2: 0 is padding
    mask = (ids != 0).long()
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    scored = (torch.tensor([0, 0, 1]), torch.tensor([0, 1, 0]))  # row 0's 2 response tokens, row 1's one
    packed = pack_rows(ids, mask, pos, scored, 3)
    assert packed.input_ids.tolist() == [[5, 6, 7, 4, 8, 9, 1, 3]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert packed.predict.tolist() == [1, 2, 6]  # 7 is predicted by 6's output, 4 by 7's, row 1's 3 by its 1's


def test_packing_is_refused_in_one_line_or_falls_back_where_the_model_cannot_pack(tok, capsys):
    conv = tiny_family_model(tok, "lfm2")  # short convolutions carry one row's state into the next
    with pytest.raises(ValueError, match=r"^learner.packing=on cannot pack this model: a lfm2 model is not among the "
                                         r"architectures proven to pack .*; set learner.packing=auto or off$"):
        check_packing("on", conv)
    assert check_packing("auto", conv) is False
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "learner.packing=auto pads this model's micro-batches: a lfm2 model" in err
    llama = tiny_model(tok, size="nano")
    assert check_packing("on", llama) and check_packing("auto", llama) and not check_packing("off", llama)
    assert capsys.readouterr().err == ""


def test_a_packed_token_budget_counts_real_tokens():
    lengths = torch.tensor([[4, 12], [4, 1], [2, 2], [4, 11], [3, 1]])  # 16, 5, 4, 15, 4 real tokens
    plan = split_micro_batches(lengths, 20, packed=True)
    assert sorted(torch.cat(plan).tolist()) == [0, 1, 2, 3, 4]
    assert all(int(lengths[idx].sum()) <= 20 for idx in plan) and len(plan) == 3  # 44 tokens in runs of <= 20
    two = torch.tensor([[1, 10], [9, 1]])  # 11 + 10 = 21 real tokens; padded 2 x (9 + 10) = 38
    assert len(split_micro_batches(two, 24, packed=True)) == 1 and len(split_micro_batches(two, 24)) == 2


def test_the_padding_fraction_before_and_after_packing():
    pm = torch.tensor([[1, 1], [0, 1]])
    rm = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # one micro-batch: real 2 + 1 + 3 + 1 = 7 of 2 rows x 5 columns = 10 -> 0.3 padding
    assert padding_metrics(pm, rm, [torch.tensor([0, 1])], packed=False) == pytest.approx(
        {"learner/pad_frac": 0.3, "learner/pad_frac_padded": 0.3, "learner/packed_frac": 0.0})
    # each row alone: 5 of 5 and 2 of 2 columns (trimmed) -> no padding
    assert padding_metrics(pm, rm, [torch.tensor([0]), torch.tensor([1])], packed=False)["learner/pad_frac"] == 0.0
    assert padding_metrics(pm, rm, [torch.tensor([0, 1])], packed=True) == pytest.approx(
        {"learner/pad_frac": 0.0, "learner/pad_frac_padded": 0.3, "learner/packed_frac": 1.0})


def _batch(tok, seed=0):
    pid, pm, rid, rm = _rows(tok, seed)
    g = torch.Generator().manual_seed(seed)
    rm = rm.float()
    logp_roll = -torch.rand(rm.shape, generator=g) * rm
    return TrainBatch(pid, pm, rid, rm, rm.clone(), torch.randn(len(rm), generator=g), logp_roll, logp_roll.clone(),
                      None, torch.arange(len(rm)) // 4)


def _step(model, batch, **plan):
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    metrics, stepped, _ = optimizer_step(model, opt, batch, AlgoConfig.preset("grpo", beta=0.0, max_len=12),
                                         LearnerPlan(temperature=1.0, micro_batch_size=3, max_grad_norm=1e9,
                                                     logp_old="recompute", **plan))
    assert stepped
    return metrics


@pytest.mark.parametrize("tokens", [0, 48])
def test_an_optimizer_step_packed_gives_the_padded_loss_and_gradient_norm(tok, tokens):
    model = tiny_model(tok, size="nano", seed=0)
    padded = _step(model, _batch(tok), micro_batch_tokens=tokens)
    packed = _step(model, _batch(tok), micro_batch_tokens=tokens, packing=True)
    for key in ("loss/total", "optim/grad_norm"):
        assert packed[key] == pytest.approx(padded[key], rel=1e-5, abs=1e-6), key
    assert packed["learner/pad_frac"] == 0.0 and padded["learner/pad_frac"] > 0.1
    # by rows, the same micro-batches; by a token budget, packed ones hold more rows (real tokens counted)
    assert packed["learner/pad_frac_padded"] == padded["learner/pad_frac"] if not tokens else \
        packed["learner/pad_frac_padded"] > padded["learner/pad_frac"]


def test_moe_routing_replay_packs_to_the_padded_routing_and_log_probs(tok):
    model = tiny_moe_model(tok, size="moe-nano", seed=0)
    pid, pm, rid, rm = _rows(tok)
    mask = input_mask(pm, rm)
    recorded = []
    for packing in (False, True):  # R2's recording pass, then a replayed forward, padded and packed
        record = LearnerRouting(model, None, mask, record=True)
        with torch.no_grad():
            logp, _ = response_logprobs(model, pid, pm, rid, rm, routing=record, packing=packing)
        replay = LearnerRouting(model, record.natural, mask, replay=True)
        with torch.no_grad():
            replayed, _ = response_logprobs(model, pid, pm, rid, rm, routing=replay, packing=packing)
        recorded.append((record.natural, logp, replayed))
    (nat, logp, rep), (nat_p, logp_p, rep_p) = recorded
    real = mask.bool()
    assert torch.equal(nat_p[~real], nat[~real]) and (nat_p[real] == nat[real]).float().mean() > 0.99
    torch.testing.assert_close(logp_p, logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(rep_p, logp_p, atol=1e-5, rtol=0)  # replaying its own routing: the same forward


@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs peft: pip install -e '.[lora]'")
def test_lora_packs_to_the_padded_gradients(tok):
    model = lora_nano(tok)
    rows = _rows(tok, seed=2)
    logp, _, grads = _grads(model, rows, share_prompts=False)
    logp_p, _, grads_p = _grads(model, rows, packing=True)
    torch.testing.assert_close(logp_p, logp, atol=1e-5, rtol=0)
    assert grads.keys() == grads_p.keys() and all("lora_" in name for name in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_p[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_packing_on_is_refused_with_a_distillation_loss_and_auto_pads_there():
    with pytest.raises(ValueError, match="^learner.packing=on packs the policy's forwards, but algo.distill_loss="):
        build_config("grpo", overrides=["packing=on", "teacher=nano-seed-1", "distill_loss=reverse_kl"])
    cfg = build_config("grpo", overrides=["packing=auto", "teacher=nano-seed-1", "distill_loss=reverse_kl"])
    assert resolve(cfg).learner.update.packing == "off"
    assert resolve(build_config("grpo", overrides=["packing=auto"])).learner.update.packing == "auto"


def test_a_few_training_steps_packed_give_the_padded_losses(tmp_path):
    records = {}
    for packing in ("off", "on"):
        records[packing] = three_steps(tmp_path / packing, "model=tiny-untrained", "micro_batch_size=8",
                                       f"packing={packing}")
    assert len(records["on"]) == len(records["off"]) == 3
    for off, on in zip(records["off"], records["on"]):
        assert on["length/mean"] == off["length/mean"]  # the same rollouts: the weights stayed within fp32 rounding
        assert on["loss/total"] == pytest.approx(off["loss/total"], rel=1e-4, abs=1e-6)
        assert on["optim/grad_norm"] == pytest.approx(off["optim/grad_norm"], rel=1e-4)
        assert on["learner/pad_frac"] == 0.0 and on["learner/pad_frac_padded"] == off["learner/pad_frac"]


def _shared_prompt_rows(tok):
    """GRPO's shape: 2 prompts of 30 tokens x 4 responses of 6 tokens each (no padding to drop)."""
    g = torch.Generator().manual_seed(3)
    pid = torch.randint(5, len(tok), (2, 30), generator=g).repeat_interleave(4, 0)
    rid = torch.randint(5, len(tok), (8, 6), generator=g)
    return pid, torch.ones_like(pid), rid, torch.ones_like(rid)


def test_auto_packs_where_it_computes_less_with_the_padded_numbers(tok, monkeypatch):
    import grpoplus.learner.logprobs as logprobs_mod
    import grpoplus.learner.packing as packing_mod

    model = tiny_model(tok, size="nano", seed=0)
    varied, shared = _rows(tok), _shared_prompt_rows(tok)
    # varied lengths, distinct prompts: packing drops most of the padding
    assert packing_pays(model, varied[0], varied[1], varied[3], share_prompts=True)
    # shared prompts, equal lengths: the padded forward computes each prompt once, packing every row's
    assert not packing_pays(model, shared[0], shared[1], shared[3], share_prompts=True)
    assert packing_pays(model, shared[0], shared[1], shared[3], share_prompts=False) is False  # nothing to drop
    monkeypatch.setattr(packing_mod, "MASKED_SCORES", 96 ** 2)  # varied's 97 real tokens: its block mask is too big
    assert not packing_pays(model, varied[0], varied[1], varied[3], share_prompts=True)
    monkeypatch.undo()
    packs = []
    monkeypatch.setattr(logprobs_mod, "pack_rows", lambda *a: packs.append(1) or pack_rows(*a))
    for rows, packed in ((varied, True), (shared, False)):
        packs.clear()
        logp, entropy, grads = _grads(model, rows)
        logp_a, entropy_a, grads_a = _grads(model, rows, packing="auto")
        assert bool(packs) is packed
        torch.testing.assert_close(logp_a, logp, atol=1e-5, rtol=0)
        torch.testing.assert_close(entropy_a, entropy, atol=1e-5, rtol=0)
        for name, grad in grads.items():
            torch.testing.assert_close(grads_a[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def _mixed_batch(tok):
    """Micro-batches of 3 rows: rows 0-2 share one 30-token prompt with full responses (padding computes less),
    rows 3-5 and 6-7 have distinct 2-token prompts and responses of 1 to 6 tokens (packing computes less)."""
    pid, pm, rid, rm = _shared_prompt_rows(tok)
    pm[3:, :28] = 0
    pid[3:, :28] = tok.pad_token_id
    rm[3:] = (torch.arange(6)[None] < torch.tensor([1, 6, 1, 2, 6])[:, None]).long()
    pid[3:, 28:] = torch.randint(5, len(tok), (5, 2), generator=torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(0)
    rm = rm.float()
    logp_roll = -torch.rand(rm.shape, generator=g) * rm
    return TrainBatch(pid, pm, rid, rm, rm.clone(), torch.randn(8, generator=g), logp_roll, logp_roll.clone(), None,
                      torch.tensor([0, 0, 0, 1, 2, 3, 4, 5]))


def test_auto_is_decided_once_per_optimizer_step_from_all_its_micro_batches(tok, monkeypatch):
    import grpoplus.learner.packing as packing_mod

    assert check_packing("auto", tiny_model(tok, size="nano")) == "auto"
    model = tiny_model(tok, size="nano", seed=0)
    batch = _mixed_batch(tok)
    planned = list(torch.arange(8).split(3))  # micro-batches of 3 rows
    args = (batch.prompt_ids, batch.prompt_mask, batch.response_mask, True)
    alone = [packing_pays(model, *(a[idx] for a in args[:3]), True) for idx in planned]
    assert alone == [False, True, True]  # each micro-batch by itself would decide differently
    # together the one that pads saves more than the two that pack: the whole step pads
    assert not packing_pays(model, *args, planned)
    auto, padded = _step(model, batch, packing="auto"), _step(model, batch)
    assert auto["learner/packed_frac"] == padded["learner/packed_frac"] == 0.0 and auto == padded
    # the two varied micro-batches alone: the whole step packs, with the padded step's numbers
    varied = batch.rows(torch.arange(3, 8))
    auto, padded = _step(model, varied, packing="auto"), _step(model, varied)
    assert auto["learner/packed_frac"] == 1.0 and padded["learner/packed_frac"] == 0.0
    assert auto["learner/pad_frac"] == 0.0 < padded["learner/pad_frac"]
    for key in ("loss/total", "optim/grad_norm"):
        assert auto[key] == pytest.approx(padded[key], rel=1e-5, abs=1e-6), key
    # one micro-batch whose block mask is over the cap pads them all
    vargs = (varied.prompt_ids, varied.prompt_mask, varied.response_mask, True)
    monkeypatch.setattr(packing_mod, "MASKED_SCORES", 150)  # the first: 14 tokens, 196 scores; the second 144
    assert not packing_pays(model, *vargs, list(torch.arange(5).split(3)))
    assert _step(model, varied, packing="auto")["learner/packed_frac"] == 0.0


def test_the_padding_fraction_of_partly_packed_micro_batches():
    pm = torch.tensor([[1, 1], [0, 1]])
    rm = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert padding_metrics(pm, rm, [torch.tensor([0, 1])], packed=[False]) == pytest.approx(
        {"learner/pad_frac": 0.3, "learner/pad_frac_padded": 0.3, "learner/packed_frac": 0.0})
    two = [torch.tensor([0, 1]), torch.tensor([0, 1])]  # the same rows twice: one packed (7), one padded (10)
    assert padding_metrics(pm, rm, two, packed=[True, False]) == pytest.approx(
        {"learner/pad_frac": 1 - 14 / 17, "learner/pad_frac_padded": 0.3, "learner/packed_frac": 0.5})


def test_the_no_grad_passes_decide_auto_once_for_the_whole_batch(tok):
    """A sharded learner's ranks each score a share of the rows: the answer comes from all of them, as one process's."""
    model = tiny_model(tok, size="nano", seed=0)
    b = _mixed_batch(tok)
    r = Rollouts(b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask, b.logp_roll, torch.ones(8).bool(),
                 b.group_ids, [""] * 8, list(range(6)))
    plan = LearnerPlan(temperature=1.0, micro_batch_size=3, max_grad_norm=1e9, logp_old="recompute", packing="auto")
    assert decided_packing(model, r, plan).packing is False  # [pad, pack, pack] alone; together they pad
    varied = Rollouts(*(x[3:] for x in (b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask, b.logp_roll)),
                      torch.ones(5).bool(), b.group_ids[3:], [""] * 5, list(range(5)))
    assert decided_packing(model, varied, plan).packing is True
    assert decided_packing(model, varied, replace(plan, packing=False)).packing is False
