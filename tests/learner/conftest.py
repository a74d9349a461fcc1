"""Learner test data: GRPO groups of rows as the engine returns them."""

import pytest
import torch


def groups(seed: int, prompts: int = 3, group: int = 4, p: int = 7, t: int = 6):
    """Rows of ``prompts`` groups of ``group`` responses, shuffled; left-padded prompts, right-padded responses."""
    g = torch.Generator().manual_seed(seed)
    pid = torch.randint(1, 40, (prompts, p), generator=g)
    pm = torch.ones_like(pid)
    pm[0, :3] = 0
    pm[1, :1] = 0
    pid = (pid * pm).repeat_interleave(group, 0)
    pm = pm.repeat_interleave(group, 0)
    rid = torch.randint(1, 40, (prompts * group, t), generator=g)
    lengths = torch.randint(1, t + 1, (prompts * group,), generator=g)
    rm = (torch.arange(t)[None] < lengths[:, None]).long()
    order = torch.randperm(prompts * group, generator=g)
    return pid[order], pm[order], (rid * rm)[order], rm[order]


@pytest.fixture
def grouped_rows():
    """:func:`groups`: ``grouped_rows(seed, prompts=3, group=4, p=7, t=6) -> (prompt_ids, prompt_mask,
    response_ids, response_mask)``."""
    return groups


def lora_nano(tok):
    """The nano tiny model with rank-4 LoRA adapters on every linear layer, their weights drawn at random (B = 0 at
    the start would give A no gradient to compare)."""
    from grpoplus.models.lora import add_lora
    from grpoplus.models.tiny import tiny_model

    torch.manual_seed(0)
    model = add_lora(tiny_model(tok, size="nano", seed=0), 4, 8.0, 0.0, ["all-linear"])
    for p in model.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.1)
    return model


def three_steps(out, *overrides: str) -> list[dict]:
    """The step records (with a loss) of a three-step GRPO run of the built-in task on a tiny budget, in ``out``."""
    from grpoplus.config import build_config
    from grpoplus.loop.driver import train

    cfg = build_config("grpo", overrides=[
        f"out={out}", "max_steps=3", "prompts_per_step=2", "group_size=4", "max_new_tokens=12", "eval_size=2",
        "eval_samples=1", "progress=false", "loggers=[]", "doctor_every=0", "num_minibatches=1", "lr=1e-3",
        "threads=1", "save_every=0", *overrides])
    return [r for r in train(cfg) if r["step"] > 0 and "loss/total" in r]
