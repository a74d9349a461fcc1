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
