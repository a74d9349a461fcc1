"""vLLM's routed experts ([p + t - 1, L, k] per completion) land in grpoplus's routing layout,
aligned with cat(prompt_ids, response_ids); tested with stand-in outputs (no GPU vLLM here)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from grpoplus.models.routing import NATURAL
from grpoplus.rollout.base import EngineError
from grpoplus.rollout.vllm_routing import vllm_routing


def completion(index, prompt_len, tokens, layers=2, k=2, start=0):
    """Token j (prompt then generated) routed to experts (start + j, start + j + 1) at every layer."""
    n = prompt_len + tokens - 1
    experts = (start + np.arange(n))[:, None, None] + np.arange(k)[None, None, :]
    return SimpleNamespace(index=index, token_ids=list(range(tokens)),
                           routed_experts=np.broadcast_to(experts, (n, layers, k)).astype(np.uint8))


def test_prompt_left_padded_response_right_padded_last_token_natural():
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])  # prompt lengths 2 and 3, P = 3
    # Prompt 0: completions given out of order (index 1 first); prompt 1: one completion.
    outputs = [SimpleNamespace(outputs=[completion(1, 2, 4, start=100), completion(0, 2, 2)]),
               SimpleNamespace(outputs=[completion(0, 3, 3, start=50)])]
    routing = vllm_routing(outputs, prompt_mask, response_width=4)
    assert routing.shape == (3, 3 + 4, 2, 2) and routing.dtype == torch.int16
    # Row 0 = prompt 0, completion 0: column 0 is padding; tokens 0, 1 of the prompt at columns 1, 2;
    # generated token 0 at column 3 (token 2 of vLLM's sequence); generated token 1 (last) is natural.
    assert routing[0, :, 0, 0].tolist() == [NATURAL, 0, 1, 2, NATURAL, NATURAL, NATURAL]
    assert routing[1, :, 0, 0].tolist() == [NATURAL, 100, 101, 102, 103, 104, NATURAL]  # completion 1
    assert routing[2, :, 1, 1].tolist() == [51, 52, 53, 54, 55, NATURAL, NATURAL]  # k slot 1 = start + j + 1


def test_missing_or_misaligned_routing_is_an_engine_error():
    mask = torch.ones(1, 2, dtype=torch.long)
    missing = SimpleNamespace(outputs=[SimpleNamespace(index=0, token_ids=[1], routed_experts=None)])
    with pytest.raises(EngineError, match="enable_return_routed_experts"):
        vllm_routing([missing], mask, 2)
    short = completion(0, 1, 3)  # routed for a 1-token prompt, given a 2-token prompt
    with pytest.raises(EngineError, match="expected prompt 2 \\+ generated 3 - 1 = 4"):
        vllm_routing([SimpleNamespace(outputs=[short])], mask, 3)
