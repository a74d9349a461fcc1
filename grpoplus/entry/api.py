"""Training from Python: :class:`Trainer` and :func:`train`, the layer the command line stands on.

    from grpoplus import Trainer

    def brevity(prompts, completions, **fields):
        return [1.0 if len(c) < 200 else 0.0 for c in completions]

    trainer = Trainer(model="smollm2", train_dataset=[{"prompt": "2+2=", "answer": "4"}, ...],
                      reward_funcs=["math", brevity], preset="dapo", out="runs/nb", max_steps=50, lr=1e-6)
    result = trainer.train()
    result.final["eval/accuracy"], result.checkpoint

Every keyword that is not one of the Trainer's own is a config key, bare or dotted, as on the command line
(``max_steps=50``, ``eps_high=0.28``, ``learner.lora_rank=16``); the config is built and checked when the
Trainer is made, so a bad key or value fails before anything loads. Python objects become config values as
:mod:`grpoplus.entry.inputs` describes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from grpoplus.config import SECTIONS, Config, build_config

Callback = Callable[[dict], "bool | None"]
"""Called with each step's metric record (``{"step": n, "reward/mean": ..., ...}``); returning True stops the run
after that step (its checkpoint is written)."""


@dataclass
class TrainResult:
    """What :meth:`Trainer.train` returns."""

    run_dir: Path
    metrics: list[dict]  # the records this call wrote, step 0 (the first evaluation) included
    config: Config = field(repr=False)

    @property
    def final(self) -> dict:
        """The last record written (empty when none was)."""
        return self.metrics[-1] if self.metrics else {}

    @property
    def checkpoint(self) -> Path | None:
        """The newest complete checkpoint: a Hugging Face model directory (LoRA: a PEFT adapter directory)."""
        from grpoplus.learner.checkpoint import latest_checkpoint

        return latest_checkpoint(self.run_dir)

    def load_model(self):
        """``(model, tokenizer)`` of the newest checkpoint, with transformers (a LoRA run's adapters on its base)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = self.checkpoint
        if path is None:
            raise ValueError(f"{self.run_dir} has no complete checkpoint (run.save_every, and the last step, write one)")
        if (path / "adapter_config.json").is_file():
            from peft import AutoPeftModelForCausalLM

            return AutoPeftModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
        return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


class Trainer:
    """A run, configured from Python objects and config keys; :meth:`train` runs it.

    Args:
        model: None (the built-in tiny model of ``task``), a local Hugging Face dir, a .gguf file, ``"smollm2"``,
            or a loaded ``transformers`` model (then ``tokenizer`` too; it is saved into the run directory).
        reward_funcs: reward functions ``fn(prompts, completions, **fields) -> list[float | None]`` and/or reward
            specs (``"math"``, ``"format:0.2"``, ``"judge:url=..."``); default: the task's verifier.
        reward_weights: one weight per entry of ``reward_funcs`` (default 1 each).
        train_dataset: a file (JSONL, JSON, Parquet, a saved ``datasets`` dir), a list of dicts, a
            ``datasets.Dataset`` or a DataFrame with a prompt column (``prompt_field``, default ``prompt``) and an
            answer column (``answer_field``) when a reward needs one; default: the built-in ``task``.
        eval_dataset: the held-out rows in the same forms (default: a split of ``train_dataset``).
        env: a multi-turn environment: a factory ``fn(**row) -> environment``, or its name.
        tools: functions the policy may call (type hints and an ``Args:`` docstring are their schema), or names.
        preset: an algorithm preset (``grpoplus presets``); default ``dapo``.
        config: a YAML config file, or a dict of config keys (nested by section or flat).
        callbacks: functions of each step's record (:data:`Callback`).
        overrides: ``key=value`` strings, as on the command line.
        **settings: config keys and their values (``out="runs/x"``, ``max_steps=50``, ``lr=1e-6``).
    """

    def __init__(self, model=None, *, reward_funcs: Sequence | None = None, reward_weights: Sequence[float] | None = None,
                 train_dataset=None, eval_dataset=None, env=None, tools: Sequence | None = None, tokenizer=None,
                 preset: str | None = None, config: str | Path | dict | None = None,
                 callbacks: Sequence[Callback] = (), overrides: Sequence[str] = (), **settings):
        from grpoplus.entry.inputs import dataset_path, model_path, named
        from grpoplus.envs.base import ENVS
        from grpoplus.envs.tools import TOOLS
        from grpoplus.rewards import REWARDS

        values = _config_values(config, settings)
        yaml_path = str(config) if isinstance(config, (str, Path)) else None
        out = _out_dir(values, yaml_path)
        local_only: list[str] = []

        def name_of(obj, registry, kind):
            spec, local = named(obj, registry, kind)
            if local:
                local_only.append(f"{kind} {spec!r}")
            return spec

        writes = any(not isinstance(x, (str, Path)) for x in (model, train_dataset, eval_dataset) if x is not None)
        if writes and not values.get("overwrite", values.get("run.overwrite", False)):
            from grpoplus.core.rundir import RunDir

            RunDir(out).clear(overwrite=False)  # refuses an old run's directory before its inputs/ is written over
        given = {"learner.model": model_path(model, tokenizer, out) if model is not None else None,
                 "data.data": None if train_dataset is None else dataset_path(train_dataset, out, "train"),
                 "data.eval_data": None if eval_dataset is None else dataset_path(eval_dataset, out, "eval"),
                 "data.env": None if env is None else name_of(env, ENVS, "environment"),
                 "data.tools": None if tools is None else [name_of(t, TOOLS, "tool") for t in tools],
                 "data.rewards": None if reward_funcs is None else
                 _reward_specs([name_of(f, REWARDS, "reward") for f in reward_funcs], reward_weights)}
        values.update({key: value for key, value in given.items() if value is not None})
        self.config = build_config(preset, yaml_path, list(overrides), values=values)
        if local_only and self.config.run.cluster != "local":
            raise ValueError(f"{', '.join(local_only)} is defined where other processes cannot import it (a notebook "
                             f"or __main__), but run.cluster={self.config.run.cluster}: move it into a module")
        self.callbacks = list(callbacks)

    @classmethod
    def resume(cls, run_dir: str | Path, overrides: Sequence[str] = (), callbacks: Sequence[Callback] = ()
               ) -> "Trainer":
        """The run in ``run_dir``, to continue from its newest complete checkpoint (``overrides`` on top of its
        saved config, e.g. a larger ``max_steps``)."""
        from grpoplus.config import resumed_config

        trainer = cls.__new__(cls)
        trainer.config = resumed_config(run_dir, list(overrides))
        trainer.callbacks = list(callbacks)
        trainer._resume = True
        return trainer

    def train(self) -> TrainResult:
        """Run (or resume) the training; returns the records it wrote, the run directory and the config."""
        from grpoplus.loop.driver import train

        records = train(self.config, resume=getattr(self, "_resume", False), callbacks=self.callbacks)
        return TrainResult(Path(self.config.run.out), records, self.config)


def train(model=None, **kwargs) -> TrainResult:
    """``Trainer(model, **kwargs).train()``."""
    return Trainer(model, **kwargs).train()


class SFTTrainer(Trainer):
    """A supervised stage (``run.stage=sft``): the policy learns to write demonstrations, with the same run directory,
    metrics, checkpoints, LoRA, precision and learner ranks as an RL run; its checkpoint is a model ``--model`` takes.

    Args:
        model: as :class:`Trainer`'s.
        demos: demonstrations: a file (JSONL, JSON, Parquet, a saved ``datasets`` dir), a list of dicts, a
            ``datasets.Dataset`` or a DataFrame of chat rows (``messages``, optional ``tools``) or prompt /
            completion rows; None: the demonstrations ``teacher`` writes, else the built-in task's worked answers.
        teacher: off-policy distillation: a model that writes the demonstrations (``sft.demo_model``).
        **kwargs: as :class:`Trainer`'s (config keys included: ``max_steps``, ``demos_per_step``, ``lora_rank``...).
    """

    def __init__(self, model=None, *, demos=None, teacher: str | None = None, tokenizer=None,
                 config: str | Path | dict | None = None, overrides: Sequence[str] = (), **kwargs):
        from grpoplus.entry.inputs import dataset_path

        if demos is not None:
            out = _out_dir(_config_values(config, kwargs), str(config) if isinstance(config, (str, Path)) else None)
            kwargs["sft.demos"] = dataset_path(demos, out, "demos")
        if teacher is not None:
            kwargs["sft.demo_model"] = teacher
        super().__init__(model, tokenizer=tokenizer, config=config, overrides=["run.stage=sft", *overrides], **kwargs)


def _config_values(config, settings: dict) -> dict:
    """Config keys of a ``config`` dict (flattened to dotted keys) with ``settings`` on top."""
    values: dict = {}
    if isinstance(config, dict):
        for key, value in config.items():
            if isinstance(value, dict) and key in SECTIONS:  # nested by section
                values.update({f"{key}.{name}": v for name, v in value.items()})
            else:
                values[key] = value
    values.update(settings)
    return values


def _out_dir(values: dict, yaml_path: str | None) -> Path:
    """The run directory the config will name (where data sets and models given as objects are written)."""
    import yaml

    for key in ("out", "run.out"):
        if key in values:
            return Path(str(values[key]))
    loaded = yaml.safe_load(Path(yaml_path).read_text()) if yaml_path and Path(yaml_path).is_file() else None
    if isinstance(loaded, dict):
        nested = loaded.get("run") if isinstance(loaded.get("run"), dict) else {}
        for found in (loaded.get("out"), loaded.get("run.out"), nested.get("out")):
            if found:
                return Path(str(found))
    return Path(Config().run.out)


def _reward_specs(specs: list[str], weights: Sequence[float] | None) -> list:
    if weights is None:
        return specs
    if len(weights) != len(specs):
        raise ValueError(f"reward_weights has {len(weights)} weights for {len(specs)} reward_funcs")
    return [_weighted(spec, float(w)) for spec, w in zip(specs, weights)]


def _weighted(spec: str, weight: float) -> dict:
    """The dict form of ``spec`` with ``weight``; a spec that carries a weight of its own is refused."""
    from grpoplus.rewards.pipeline import split_spec

    target, own, kwargs = split_spec(spec)
    if own != 1.0:
        raise ValueError(f"reward spec {spec!r} has its own weight: give it in the spec or in reward_weights")
    return {"name": target, "weight": weight, **({"kwargs": kwargs} if kwargs else {})}
