"""What a user may say: the sections of a run's config (``run``, ``data``, ``rollout``, ``learner``, ``ray``, and
``algo``, :class:`grpoplus.algo.AlgoConfig`), each field with its type, default and docstring."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from grpoplus.algo.config import AlgoConfig


class ConfigError(ValueError):
    """A config that cannot run, said in one line naming its keys as the user writes them (``algo.beta``, not a
    class's field) and the fix. A ``ValueError``, so code that catches those keeps working."""


@dataclass
class RunConfig:
    out: str = "runs/demo"
    """Run directory: config.yaml, metrics.jsonl, samples.jsonl, checkpoints/, report/."""
    overwrite: bool = False
    """Allow a fresh run into a directory that already holds one (its metrics, samples and checkpoints
    are deleted); without it such a directory is an error (use --resume to continue it)."""
    seed: int = 0
    """Seeds the built-in model's warm start (so each seed starts from a different model), the
    synthetic task's training problems, the data order, sampling and evaluation sampling. The
    held-out problems come from data.eval_seed, the same for every run.seed by default, so
    accuracies of different seeds are measured on the same problems."""
    max_steps: int = 300
    """Rollout batches to train on (each is num_iterations x num_minibatches optimizer steps)."""
    eval_every: int = 25
    """Held-out evaluation every K steps (and at step 0 and the last step); 0 = only at the ends."""
    save_every: int = 50
    """Checkpoint every K steps (and at the last step); 0 = only at the end."""
    keep_checkpoints: int = 2
    """How many complete checkpoints to keep (the newest)."""
    log_samples: int = 4
    """Completions per step written to samples.jsonl."""
    traces: bool | int = True
    """Rollout traces in RUN/traces, one gzip'ed JSONL file per step (grpoplus traces RUN draws a page of one):
    true = every trained sample of the step, N = its first N samples, false (0) = none. Each sample's prompt and
    response ids, policy/environment mask, engine and learner log-probs, reward components, advantage, weight
    version and finish reason."""
    traces_max_mb: float = 256.0
    """Disk budget of RUN/traces in MB: over it, older steps' files are thinned (odd steps first, then those not a
    multiple of 4, of 8, ...; oldest first), so the whole run stays visible at a growing stride; the newest step's
    file is always kept."""
    doctor_every: int = 10
    """Run the doctor on the metrics so far every K steps and warn on new findings; 0 = off."""
    loggers: list = field(default_factory=lambda: ["tensorboard"])
    """Where the metrics go besides metrics.jsonl: any of tensorboard (RUN/tb), wandb (offline run in
    RUN/wandb), mlflow (RUN/mlruns or $MLFLOW_TRACKING_URI), trackio (local); [] = metrics.jsonl only."""
    progress: bool = True
    """Show a live progress bar."""
    threads: int = 0
    """torch CPU threads (0 = torch's default)."""
    release_memory: Literal["off", "phases", "eager"] = "phases"
    """Linux (glibc), when freed memory goes back to the system (malloc_trim): phases (true) = after the rollout and
    after the update, so the next phase starts from what is live; eager = also every few decoder layers of the
    update's backward, which lowers its peak with learner.gradient_checkpointing; off (false) = glibc keeps
    freed blocks for reuse."""
    preset: str = "dapo"
    """Algorithm preset (ALGORITHMS.md section 9); the algo section starts from it."""
    overrides: list = field(default_factory=list)
    """The key=value overrides given on the command line (recorded for reports)."""
    cluster: Literal["local", "ray"] = "local"
    """local: this machine (one process, or learner.data_parallel ranks it starts; torchrun works too) |
    ray: the roles as Ray actors (rollout workers, learner ranks) and tasks (reward scoring), see the ray section."""
    stage: Literal["rl", "sft"] = "rl"
    """rl: reinforcement learning (grpoplus train) | sft: supervised fine-tuning on demonstrations (grpoplus sft; the
    sft section says which), whose final checkpoint --model takes for RL."""


@dataclass
class DataConfig:
    task: str = "arithmetic"
    """Built-in task (arithmetic, countdown, wordproblems, function_calling, guess) or, with `data`, the name shown in
    logs."""
    difficulty: int | None = None
    """Difficulty knob of the built-in task (None = the task's default)."""
    task_kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments of the built-in task's factory, beside seed and difficulty (e.g. {dataset: chain_sum}
    for task=reasoning_gym: a reasoning-gym procedural data set, scored by its own verifier)."""
    data: str | None = None
    """JSONL / JSON / Parquet file or saved `datasets` directory of prompts with answers."""
    eval_data: str | None = None
    """Held-out file (defaults to a split of `data`)."""
    prompt_field: str = "prompt"
    """Column of `data` holding the prompt."""
    answer_field: str = "answer"
    """Column of `data` holding the reference answer."""
    answer_format: Literal["raw", "gsm8k", "math", "auto"] = "auto"
    """How to read the reference answer: raw | gsm8k | math | auto."""
    on_bad_row: Literal["skip", "error"] = "skip"
    """Malformed data rows (invalid JSON or UTF-8, a missing field, no answer): skip (reported with line numbers) |
    error."""
    max_prompt_tokens: int | None = None
    """Longest prompt in tokens, after the chat template, as the engine encodes it (None = the model's context minus
    rollout.max_new_tokens; no limit for a model that names no context). Single-turn prompts only."""
    long_prompts: Literal["refuse", "truncate_left", "drop"] = "refuse"
    """A prompt longer than data.max_prompt_tokens: refuse (stop before training, naming the longest) | truncate_left
    (keep its last tokens) | drop; both counted (data/prompts_truncated, data/prompts_dropped in step 0's record)."""
    eval_size: int = 200
    """Held-out prompts per evaluation."""
    eval_seed: int = 0
    """Seed of the held-out problem set (the built-in task's test split, or the rows a data set
    holds out), independent of run.seed so that runs of different seeds are evaluated on the same
    problems; training prompts (and the built-in model's warm start) never include a held-out one."""
    rewards: list = field(default_factory=lambda: ["task"])
    """Reward components: `task` (the task's verifier), built-in names (math, format, code, reward_model:path=DIR, an
    LLM judge:url=http://host:8000/v1, ...), `module:function`, `file.py:function`, each optionally with `:weight` and
    `:key=value,...` parameters."""
    reward_workers: int | str = 0
    """0 = score in-process; N > 0 = process pool of N workers; auto = a pool sized to the machine
    (for slow or untrusted rewards)."""
    reward_timeout_s: float = 10.0
    """Reward time limit per sample: a pool worker's call (one sample) gets it; in-process, a reward's batch call of n
    samples gets n times it, in a thread. A sample past it is left out unscored and counted (reward/timeouts)."""
    chat_template: bool = True
    """Apply the tokenizer's chat template to data-set prompts when it has one."""
    env: str | None = None
    """Multi-turn environment the rows are played in (one instance per rollout, made from its row): a registered
    name (guess), `module:factory` or `file.py:factory`. None: the task's own (the guess task plays guess), else
    single-turn."""
    tools: list = field(default_factory=list)
    """Tools the policy may call in a multi-turn episode (no data.env needed): built-in calculator, python (the code
    sandbox), or `module:function` / `file.py:function` with type hints and an Args: docstring. A turn without a
    <tool_call> is the answer."""
    prm: str | None = None
    """Local Hugging Face dir of a process reward model (an AutoModelForTokenClassification): its score of each step of
    a single-turn response is that step's reward for algo.turn_credit=process, their sum added to the reward (component
    prm). None: no step rewards."""
    prm_step_separator: str = "\n"
    """data.prm: a step of a response ends where this text does (and the last at the response's end)."""


@dataclass
class RolloutConfig:
    engine: str = "hf"
    """Rollout engine (registered in grpoplus.rollout.ENGINES)."""
    prompts_per_step: int = 32
    """Groups per rollout batch (B)."""
    group_size: int = 8
    """Responses per prompt (G)."""
    temperature: float = 1.0
    """Sampling temperature (> 0); the learner scores log-probs at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling: sample from the smallest token set holding this probability, in (0, 1]."""
    max_new_tokens: int = 48
    """Longest response in tokens (L_max). algo.max_len is the same length: set either, the other
    follows; setting both to different values is an error."""
    quantization: Literal["none", "bf16_rounded", "int8", "fp8"] = "none"
    """Sampler weights: none (the learner's precision) | bf16_rounded (weights rounded to bf16, computed in
    fp32; hf engine) | int8 (int8 kernels: hf engine on CPU, vLLM on GPU) | fp8 (vLLM on GPU). A real
    sampler/learner mismatch for the corrections of ALGORITHMS.md section 5."""
    max_num_seqs: int = 0
    """Most sequences the engine decodes at once (0 = the engine's choice: all of a batch for hf)."""
    engine_timeout_s: float = 600.0
    """Longest an engine may take to start, or to answer one generate call, before the run stops with
    an error naming what timed out."""
    compile: bool = False
    """hf engine: torch.compile one decode step, at fixed shapes per batch (ended rows are computed and ignored instead
    of dropped; inductor on a CPU, CUDA graphs on a GPU, the latter untested). The same rollouts as eager decoding to
    float32 rounding; a model it cannot compile (attention other than sdpa, sliding-window or recurrent layers)
    decodes eagerly, said in one line when the engine starts; a compile failure mid-run goes on eagerly. Off by
    default: the first rollout pays the compile (about a minute for SmolLM2 on 2 CPU cores) and the step it gives
    was no faster there (docs/results/smollm2-speed.md)."""
    engine_kwargs: dict = field(default_factory=dict)
    """Engine-specific settings passed through as they are (vLLM: gpu_memory_utilization,
    kv_cache_memory_bytes, dtype, sleep_between_steps, ...)."""
    eval_samples: int = 4
    """Sampled responses per held-out prompt (n of the pass@k estimator); 0 = greedy only."""
    eval_k: list[int] = field(default_factory=list)
    """The k of each eval/pass@k, every one at most rollout.eval_samples (Chen et al. 2021's unbiased estimator
    from n = eval_samples responses); [] = 1 and eval_samples."""
    eval_temperature: float | None = None
    """Temperature of the held-out sampled responses (> 0); None = rollout.temperature."""
    eval_top_p: float | None = None
    """Nucleus sampling of the held-out sampled responses, in (0, 1]; None = rollout.top_p."""
    eval_max_new_tokens: int | None = None
    """Longest held-out response (greedy and sampled; a multi-turn trajectory's turn) in tokens; None =
    rollout.max_new_tokens."""
    workers: int = 1
    """Rollout workers, each with its own engine (cluster=ray); a step's prompts are split among them."""
    max_staleness: int = 0
    """Asynchronous rollouts: a batch sampled with policy version v may be trained on at version <= v + K
    while the next batches are sampled. 0 = the synchronous loop (sample, then train)."""
    max_turns: int = 8
    """Multi-turn (data.env): most policy turns per trajectory; max_new_tokens bounds each turn."""
    max_episode_tokens: int = 0
    """Multi-turn: most tokens after the prompt per trajectory, sampled and observed (0 = no budget but max_turns)."""
    env_timeout_s: float = 30.0
    """Multi-turn: longest one environment call (reset, step, close) may take; the trajectory then ends, counted in
    env/ended/timeout."""
    env_patience_s: float = 2.0
    """Multi-turn: once some environments of a round have answered, how long the round waits for the others before
    the answered trajectories take their next turn (a straggler joins a later round). Environments that all answer
    within it give reproducible runs."""


@dataclass
class LearnerConfig:
    model: str | None = None
    """None = the built-in warm-started tiny model (a Llama); `tiny-moe`, or `tiny-<model_type>` for another
    architecture's (tiny-qwen3_5_text, ...: reference/architectures.md); a local HF dir, a .gguf file, or `smollm2`."""
    teacher: str | None = None
    """On-policy distillation's teacher (algo.lambda_opd, algo.distill_loss): named as `model` names the policy (a
    local HF dir, a .gguf file, `smollm2`, a built-in tiny model: `tiny-teacher` is a larger one warm-started longer
    on the run's task), loaded once where the learner runs, like the reference; or the base URL
    of an OpenAI-compatible server that returns prompt log-probs (vLLM's: `http://host:8000/v1`, lambda_opd only).
    Its tokenizer must be the policy's."""
    lr: float | None = None
    """AdamW peak learning rate (> 0); unset, it follows the model: 2e-4 for a toy model (under 10M parameters,
    e.g. the built-in tiny ones), 1e-6 to fully fine-tune a real one (TRL's and verl's default), 1e-5 with LoRA
    (about 10x full fine-tuning's: Schulman et al. 2025, "LoRA Without Regret"); the run names the value it chose."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    adam_beta1: float = 0.9
    """AdamW first-moment decay."""
    adam_beta2: float = 0.99
    """AdamW second-moment decay."""
    warmup_steps: int = 5
    """Linear learning-rate warm-up, in optimizer steps."""
    lr_schedule: Literal["constant", "cosine", "linear"] = "cosine"
    """constant | cosine | linear (after warm-up, over all optimizer steps of the run)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm of each optimizer step to this."""
    micro_batch_size: int | Literal["auto"] = 64
    """Responses per forward/backward; gradients are accumulated with exact normalisation. auto: micro-batches by a
    token budget (as learner.micro_batch_tokens) chosen when the learner starts, the most tokens whose kept activations
    fit in the device's free memory beside the optimizer state still to come (one learner process)."""
    micro_batch_tokens: int = 0
    """> 0: form micro-batches by a token budget instead (rows x padded width <= this; rows of similar
    length together, so little padding is computed); 0 = micro_batch_size rows in order."""
    share_prompts: bool = True
    """Compute each distinct prompt of a forward once and every response against its keys and values (a group's
    G responses share one prompt forward and backward); false: every row's prompt + response in full. Same
    numbers up to float summation order; applies to the chunked-head architectures without a sliding window."""
    packing: Literal["auto", "on", "off"] = "auto"
    """Packed micro-batches: the rows of each learner forward as one sequence of their real tokens, each row
    attending only to itself (restarting position ids), so no padding token enters any layer; the same numbers as
    padded rows. on: every micro-batch packed, refused in one line where the model cannot pack (a recurrent or
    convolutional layer would carry one row's state into the next); auto: an optimizer step's micro-batches packed
    where that computes fewer FLOPs than padding them (estimated from their lengths, their shared prompts and the
    attention's cost, one answer per step, the same on every learner rank: GRPO's equal-length groups pad, widely
    varying lengths pack; learner/packed_frac says how many did), padded where the model cannot pack (said once);
    off: pad. A packed forward computes every row's prompt
    (learner.share_prompts does not apply to it); with on, learner.micro_batch_tokens counts real tokens."""
    packed_attention: Literal["auto", "model", "flex_attention"] = "auto"
    """The attention a packed forward runs under. model: the policy's own (sdpa), which reads the packed rows
    through an [S, S] block mask (S real tokens: quadratic memory, every score computed); flex_attention:
    PyTorch's flex attention, whose block mask holds each row's span and whose compiled kernel skips the blocks
    across rows (its first call compiles it; a compilation that fails is said in one line and the model's own
    attention takes over; a GPU's: PyTorch's flex attention has no backward on a CPU); auto: flex_attention for a
    policy on a GPU, the model's own on a CPU. The same numbers to float rounding. Only where the learner packs
    (learner.packing)."""
    compile: bool = False
    """Compile the learner's decoder layers with torch.compile (inductor: C++ kernels on a CPU, Triton on a GPU), their
    forward and backward, one graph for every layer and every micro-batch width (dynamic shapes); the attention mask,
    the chunked head and the loss stay eager. The same numbers as eager up to float rounding. Every row is then
    computed whole (learner.share_prompts does not apply). The first update pays the compilation (about 20 s on a
    CPU); one that fails mid-run leaves the layers eager, said in one line. Off by default: on the one CPU machine it
    was measured on it gained at most 1.14x on the same rows, and lost to the default shared-prompt forward
    (concepts/rollout-engines.md, Compiled learner layers). Refused with algo.routing_replay; an MoE policy's layers
    stay eager."""
    compile_mode: Literal["default", "max-autotune-no-cudagraphs"] = "default"
    """torch.compile's mode for learner.compile: default, or max-autotune-no-cudagraphs (longer compilation that
    benchmarks kernel choices; a GPU's). CUDA graphs (reduce-overhead) are not offered: a training step's shapes
    change every step."""
    gradient_checkpointing: bool = False
    """Keep only each decoder layer's inputs from the training forward and recompute the layer in the backward:
    much less activation memory for one more forward of the body per update; the same numbers."""
    logp_old: Literal["auto", "recompute", "rollout"] = "auto"
    """Where pi_old's log-probs come from: recompute (a separate no-grad learner pass before the
    update), rollout (the sampler's logp_roll, no recompute), or auto: with one update per batch
    and nothing that needs pi_old before the update (corrections, KL in reward, entropy mask),
    the training forward's own detached log-probs, which are exactly pi_old (saves a pass)."""
    device: str = "cpu"
    """torch device of the learner (and of the hf rollout engine): cpu, cuda, cuda:1, ..."""
    precision: Literal["fp32", "bf16_mixed"] = "fp32"
    """fp32 | bf16_mixed: float32 master weights, gradients and AdamW state with the matmuls of every learner
    forward in bfloat16 (autocast; log-softmax and loss in float32), the reference's linear weights stored in
    bfloat16, and the rollout engines sampling in bfloat16 (Micikevicius et al. 2018, arXiv:1710.03740)."""
    tf32: bool = False
    """float32 matmuls on an NVIDIA GPU use TF32 tensor cores (faster, 10-bit mantissa inputs); no effect on a CPU."""
    cpu_matmul: Literal["auto", "onednn", "torch"] = "auto"
    """Which library multiplies float32 linear layers on a CPU (every process of the run): onednn (PyTorch's bundled
    oneDNN, with a backward of its own), torch (its BLAS: MKL on x86), or auto: onednn on AMD x86 CPUs, where torch's
    MKL runs generic AVX2 kernels and oneDNN was measured faster on the learner's products (2-2.3x on one EPYC,
    level on another: benchmarks/cpu_matmul.py measures a machine), torch elsewhere.
    The same numbers to float32 rounding; bf16 autocast, GPUs and compiled code keep torch's path."""
    data_parallel: int = 1
    """Learner ranks (torch.distributed: gloo on CPU, NCCL on GPU), each taking whole micro-batches of
    every mini-batch; gradients are summed over the ranks, so the update is the one of a single process."""
    strategy: Literal["replicate", "fsdp2"] = "replicate"
    """How the learner ranks hold the model: replicate (every rank the whole model and optimizer) | fsdp2
    (parameters, gradients and AdamW state sharded over the ranks with torch's FSDP2, each decoder layer
    gathered just before it runs: per-rank memory of about 1/data_parallel; full fine-tuning)."""
    cpu_offload: bool = False
    """learner.strategy=fsdp2 on GPUs: keep each rank's parameter, gradient and AdamW shards in CPU memory, copied
    to the GPU layer by layer for each forward and backward, the optimizer stepping on the CPU (FSDP2's
    CPUOffloadPolicy): less GPU memory for more host-device traffic."""
    collective_timeout_s: float = 300.0
    """Longest a learner rank waits for the others (joining, the gradient all-reduce, an update's
    payload) before the run stops with an error naming the rank."""
    lora_rank: int = 0
    """> 0: train LoRA adapters of this rank (peft) instead of every weight; the KL reference is the
    same model with its adapters off, checkpoints hold the adapters. 0 = full fine-tuning."""
    lora_alpha: float = 32.0
    """LoRA scale numerator: the update is (lora_alpha / lora_rank) B A."""
    lora_dropout: float = 0.0
    """Dropout on the adapters' input while training (0 keeps the training forward equal to pi_old)."""
    lora_target_modules: list = field(default_factory=lambda: ["all-linear"])
    """Linear layers that get adapters, by module name (q_proj, v_proj, ...) or all-linear (every
    linear layer but the LM head)."""
    quantize: Literal["none", "nf4", "fp4"] = "none"
    """QLoRA (Dettmers et al. 2023, arXiv:2305.14314): nf4 | fp4 keeps the frozen base's decoder-layer linear weights
    in 4-bit (bitsandbytes Linear4bit, computing in the learner's precision; embeddings, norms and the LM head as
    loaded) under LoRA adapters (learner.lora_rank > 0) that train in full precision; the hf engine samples that
    same 4-bit model with its adapters on. none = the base as loaded."""
    freeze: list = field(default_factory=list)
    """Parameters kept frozen while the rest trains (no gradient, no optimizer state), by name: a dotted part
    (embed_tokens, lm_head, layers.0) or a glob over the full name (model.layers.[0-3].*). Empty: all train."""
    train_vision: bool = False
    """A vision-language policy's vision tower and projector train too (false: frozen, no gradient and no optimizer
    state, as most vision RL recipes keep them; the language model trains as set)."""

    @property
    def sharded(self) -> bool:
        """True when the learner's parameters are sharded over its ranks (strategy fsdp2, several ranks): the one
        place this is decided."""
        return self.strategy == "fsdp2" and self.data_parallel > 1


@dataclass
class SftConfig:
    demos: str | None = None
    """Demonstrations to imitate (run.stage=sft): a JSONL / JSON / Parquet file or datasets directory of chat rows
    ({"messages": [...], "tools": [...]}, roles system / user / assistant / tool, assistant tool_calls in the OpenAI
    layout) or prompt / completion rows; or the name of demonstrations grpoplus writes from the task's training
    problems (wordproblems-calculator: each word problem solved with calculator calls). None: the demonstrations
    sft.demo_model writes, else the built-in task's worked answers."""
    messages_field: str = "messages"
    """The column of sft.demos that holds each row's chat messages."""
    demos_per_step: int = 32
    """Demonstrations per optimizer step (drawn in a shuffled order, epoch after epoch)."""
    eval_demos: int = 64
    """Demonstrations held out (at most a fifth of them): their loss is eval/loss at every evaluation."""
    eval_accuracy: bool = True
    """Also measure the held-out accuracy on the run's task (data.task or data.data) at every evaluation, as an RL
    run does; false: the held-out demonstrations' loss alone."""
    max_length: int = 0
    """Longest demonstration in tokens, prompt included (longer ones are cut there, counted in sft/cut); 0: no
    limit."""
    direct_frac: float = 0.5
    """A built-in task's demonstrations: the share that gives the final answer alone instead of the worked answer
    (the built-in warm start's mixture: a partly trained policy that RL then improves)."""
    demo_model: str | None = None
    """Off-policy distillation: a model (an HF directory, a .gguf file, smollm2, the built-in tiny-teacher) that
    writes the demonstrations: it
    samples sft.demo_samples responses to each training prompt of the task, and the policy learns to write them.
    It must share the policy's tokenizer."""
    demo_samples: int = 1
    """Responses sft.demo_model samples per training prompt."""
    demo_filter: Literal["correct", "all"] = "correct"
    """Which of sft.demo_model's responses are kept: correct (the task's verifier accepts them: rejection sampling)
    | all."""


@dataclass
class RayConfig:
    address: str | None = None
    """None: start a local Ray instance; "auto" or "host:port": join that running Ray cluster (cluster=ray)."""
    num_cpus: int | None = None
    """CPUs of a local Ray instance (None = Ray's default: all of this machine's)."""
    timeout_s: float = 600.0
    """Longest to wait for a role's actor to start, or for a call without a time limit of its own
    (reward scoring, a learner step, a checkpoint) before the run stops with an error naming it."""
    max_restarts: int = 3
    """Restarts of a rollout worker that dies; its request is sent again, so no step is lost
    (weight_sync=object_store; with collective a worker that dies ends the run)."""
    weight_sync: Literal["object_store", "collective"] = "object_store"
    """How learner rank 0's weights reach the rollout workers after each update: object_store (Ray's object
    store; dead workers are restarted) | collective (a broadcast in a torch.distributed group of rank 0 and the
    workers, gloo on CPU, NCCL on GPUs, each bounded by learner.collective_timeout_s)."""


@dataclass
class HealthConfig:
    warn: bool = True
    """Print a warning the step a certain-failure signal fires (every completion truncated, every group of zero
    reward spread, every update non-finite, the engine's log-probs off the learner's right after a weight sync),
    naming the cause and the key to change."""
    stop_after: int = 20
    """Stop the run (exit status 3, its checkpoint written) after this many consecutive steps with no learning
    signal (every group of zero spread, every update non-finite, or every trajectory ended by a failing environment);
    0 = never stop."""
    preflight_prompts: int = 2
    """Before step 1 the rewards score a group of completions of each of this many first training prompts: a reward
    that fails, or scores every completion alike, is named before training starts (grpoplus train --check runs this
    preflight alone); 0 = no preflight."""
    sync_gap_max: float | None = None
    """Largest mismatch/k3 of the tokens just sampled with the current weights before the sync_gap warning: None =
    the precision's bound (1e-8 for fp32 with the hf engine, 0.05 for bf16, TF32 or another engine; unchecked for an
    int8 or fp8 sampler)."""


SECTIONS: dict[str, type] = {
    "run": RunConfig,
    "data": DataConfig,
    "rollout": RolloutConfig,
    "learner": LearnerConfig,
    "algo": AlgoConfig,
    "ray": RayConfig,
    "sft": SftConfig,
    "health": HealthConfig,
}

BOOL_CHOICES: dict[str, dict[bool, str]] = {"run.release_memory": {True: "phases", False: "off"},
                                            "learner.packing": {True: "on", False: "off"},
                                            **{f"algo.{key}": {False: "off"}
                                               for key in ("routing_replay", "turn_credit", "distill_loss")}}
"""Keys that were booleans before they had more choices, and keys whose choice ``off`` YAML 1.1 reads as false (a
bare ``off`` on the command line or in a config file): what true and false mean."""


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    algo: AlgoConfig = field(default_factory=lambda: AlgoConfig.preset("dapo"))
    ray: RayConfig = field(default_factory=RayConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    health: HealthConfig = field(default_factory=HealthConfig)

    def to_dict(self) -> dict:
        return {name: section_dict(getattr(self, name)) for name in SECTIONS}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def section_dict(section: Any) -> dict:
    out = {}
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def env_of(data: DataConfig) -> str | None:
    """The environment a run's rows are played in: ``data.env``, else a built-in task's own; None: single-turn."""
    if data.tools:
        return data.env or "tools"
    if data.env is not None or data.data is not None:
        return data.env
    from grpoplus.tasks import TASKS

    return getattr(TASKS.get(data.task), "env", None) if data.task in TASKS else None


def response_budget(data: DataConfig, rollout: RolloutConfig) -> int:
    """L_max, the longest response (algo.max_len: overlong shaping, constant normalisers): max_new_tokens, or for a
    multi-turn trajectory the tokens it may take in all (its budget, else max_turns x max_new_tokens)."""
    if env_of(data) is None:
        return rollout.max_new_tokens
    return rollout.max_episode_tokens or rollout.max_turns * rollout.max_new_tokens
