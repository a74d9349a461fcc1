"""``grpoplus`` command line: train | sft | eval | report | compare | doctor | traces | export | presets | lab | selftest."""

from __future__ import annotations

import argparse
import os
import sys

# Idle OpenMP threads sleep instead of spinning: on a shared or small machine a spinning thread
# makes every parallel op wait for a descheduled one (measured: steps 2-7x slower). Must be set
# before torch is imported, which this module does not do.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Flags that are shorthands for config keys.
FLAG_KEYS = {"task": "data.task", "out": "run.out", "model": "learner.model", "data": "data.data",
             "eval_data": "data.eval_data", "prompt_field": "data.prompt_field",
             "answer_field": "data.answer_field", "seed": "run.seed", "max_steps": "run.max_steps"}


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train a policy (or resume a run)",
                       description="Train with a preset, a YAML config and key=value overrides of any config "
                                   "field, e.g. `grpoplus train --preset dapo --task arithmetic --out runs/demo "
                                   "max_steps=8 eps_high=0.3`. See --help-config for every key.")
    p.add_argument("--resume", default=None, metavar="RUN", help="continue RUN from its last complete checkpoint")
    _run_flags(p)
    p.add_argument("--dry-run", dest="dry_run", action="store_true",
                   help="check the config and print the resolved config, where each role runs, the memory per "
                        "device and the tokens per step, loading no model and starting nothing; what this machine "
                        "lacks (GPUs, vLLM, Ray) is listed as needs, not raised")
    p.add_argument("--check", action="store_true",
                   help="the preflight alone: load the model and data (every row read, every prompt measured against "
                        "the model's context) and score real completions of the first prompts with the rewards; "
                        "train nothing, write nothing; exit 1 when a reward fails or scores every completion alike")
    p.set_defaults(func=_train)


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help="measure a model's held-out accuracy on a task, training nothing",
                       description="The evaluation a run makes at step 0, alone: the task's held-out split (or "
                                   "--eval-data) with the run's evaluation keys (eval_size, eval_samples, eval_k, "
                                   "eval_temperature, eval_max_new_tokens, tools, max_turns), written to OUT/eval.json, "
                                   "e.g. `grpoplus eval --model runs/sft/checkpoints/step-100 --task wordproblems "
                                   "eval_size=128 --out runs/eval`.")
    _run_flags(p)
    p.set_defaults(func=_eval, resume=None, dry_run=False)


def _eval(args) -> int:
    from grpoplus.config import build_config, describe_keys
    from grpoplus.loop.driver import evaluate_only

    cfg = build_config(args.preset, args.config, flag_overrides(args))
    if args.help_config:
        print(describe_keys(cfg))
        return 0
    record = evaluate_only(cfg)
    shown = ", ".join(f"{k} {v:.4g}" for k, v in record.items() if k.startswith("eval/"))
    print(f"grpoplus eval: {record['model']} on {record['examples']} held-out examples of {record['task']}: {shown} "
          f"({cfg.run.out}/eval.json)")
    return 0


def flag_overrides(args) -> list[str]:
    """The command line's flags as their config keys (``--model X``: ``learner.model=X``), then its key=value words."""
    given = [f"{key}={getattr(args, flag)}" for flag, key in FLAG_KEYS.items() if getattr(args, flag) is not None]
    return [*given, *args.overrides]


def _run_flags(p) -> None:
    """The flags ``train`` and ``eval`` share: the config, the model, the data and the run directory."""
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override any config field")
    p.add_argument("--preset", default=None, help="algorithm preset (see `grpoplus presets`); default dapo")
    p.add_argument("--config", default=None, help="YAML file of config values (nested by section or flat)")
    p.add_argument("--task", help="built-in task: arithmetic | countdown | wordproblems (default arithmetic)")
    p.add_argument("--out", help="run directory (default runs/demo)")
    p.add_argument("--model", help="local HF model dir, .gguf file, or `smollm2` (default: built-in tiny model)")
    p.add_argument("--data", help="JSONL / JSON / Parquet file or saved datasets dir with prompts and answers")
    p.add_argument("--eval-data", dest="eval_data", help="held-out file (default: a split of --data)")
    p.add_argument("--prompt-field", dest="prompt_field", help="prompt column of --data (default prompt)")
    p.add_argument("--answer-field", dest="answer_field", help="answer column of --data (default answer)")
    p.add_argument("--seed", type=int)
    p.add_argument("--max-steps", dest="max_steps", type=int)
    p.add_argument("--help-config", action="store_true",
                   help="list every config key with its meaning and its value for this command line (the preset's "
                        "values, --config and key=value overrides applied) and exit")


def _train(args) -> int:
    """The command line over :class:`grpoplus.Trainer`: flags and key=value overrides are its config keys."""
    from grpoplus.config import build_config, describe_keys
    from grpoplus.entry.api import Trainer

    overrides = flag_overrides(args)
    if args.help_config:
        print(describe_keys(build_config(args.preset, args.config, overrides)))
        return 0
    if args.dry_run:
        from grpoplus.dryrun import print_dry_run
        return print_dry_run(args.preset, args.config, overrides, args.resume)
    if args.check:
        from grpoplus.loop.driver import check_only
        return check_only(build_config(args.preset, args.config, overrides))
    if args.resume:
        if args.preset or args.config:
            raise ValueError("--resume takes the run's saved config: give changes as key=value, not --preset/--config")
        Trainer.resume(args.resume, overrides).train()
    else:
        Trainer(preset=args.preset, config=args.config, overrides=overrides).train()
    return 0


def _add_sft(sub) -> None:
    p = sub.add_parser("sft", help="supervised fine-tuning on demonstrations (a warm start before RL)",
                       description="Train the policy to write demonstrations: chat rows (--demos FILE), a model's own "
                                   "samples of the task's prompts (--teacher MODEL: off-policy distillation), or the "
                                   "built-in task's worked answers. The run directory, metrics, checkpoints, LoRA, "
                                   "precision and learner ranks are an RL run's; --model of `grpoplus train` takes its "
                                   "checkpoint, e.g. `grpoplus sft --model smollm2 --demos demos.jsonl --out runs/sft "
                                   "max_steps=100`. See --help-config for every key (the sft section).")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override any config field")
    p.add_argument("--demos", help="demonstrations: JSONL / JSON / Parquet / datasets dir of chat or prompt/completion rows")
    p.add_argument("--teacher", help="a model that writes the demonstrations (sft.demo_model)")
    p.add_argument("--config", default=None, help="YAML file of config values (nested by section or flat)")
    p.add_argument("--resume", default=None, metavar="RUN", help="continue RUN from its last complete checkpoint")
    for flag in ("task", "out", "model", "data", "eval_data", "seed"):
        p.add_argument(f"--{flag.replace('_', '-')}", dest=flag)
    p.add_argument("--max-steps", dest="max_steps", type=int)
    p.add_argument("--help-config", action="store_true", help="list every config key with its value and exit")
    p.add_argument("--dry-run", dest="dry_run", action="store_true",
                   help="check the config and print the plan, loading no model and starting nothing")
    p.set_defaults(func=_sft, preset=None, check=False)


def _sft(args) -> int:
    """``grpoplus train`` with run.stage=sft and the sft flags as their keys."""
    args.overrides = ["run.stage=sft"] + [f"{key}={value}" for key, value in
                                          (("sft.demos", args.demos), ("sft.demo_model", args.teacher))
                                          if value is not None] + list(args.overrides)
    args.prompt_field = args.answer_field = None
    return _train(args)


def _presets(args) -> int:
    from grpoplus.algo import AlgoConfig
    from grpoplus.algo.presets import describe

    for name in AlgoConfig.preset_names():
        print(describe(name))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from grpoplus.entry.export import register_export
    from grpoplus.lab.cli import register_lab
    from grpoplus.metrics.commands import register_commands
    from grpoplus.selftest import register_selftest

    parser = argparse.ArgumentParser(prog="grpoplus", description="RL post-training with verifiable rewards.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train(sub)
    _add_sft(sub)
    _add_eval(sub)
    register_commands(sub)
    register_export(sub)
    sub.add_parser("presets", help="list the algorithm presets: what each sets, and its paper").set_defaults(func=_presets)
    register_lab(sub)
    register_selftest(sub)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's arguments, running nothing; an unknown command or flag exits 2 with argparse's usage
    message (tests/test_docs_examples.py checks every command of the docs with it)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may stand anywhere among train's flags (argparse takes positionals once).
    stray = [word for word in extra if word.startswith("-") or "=" not in word or args.command not in ("train", "sft", "eval")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = list(args.overrides) + extra
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from grpoplus.core.packages import install_hint
    from grpoplus.distributed import RoleError
    from grpoplus.metrics.guard import HealthStop
    from grpoplus.rewards import RewardError
    from grpoplus.rollout import EngineError

    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, RewardError, EngineError, RoleError) as err:
        print(f"grpoplus {args.command}: error: {err}", file=sys.stderr)
        return 2
    except ImportError as err:  # a missing optional package: the pip install that adds it
        print(f"grpoplus {args.command}: error: {install_hint(err)}", file=sys.stderr)
        return 2
    except HealthStop as err:  # the run learned nothing for health.stop_after steps: its checkpoint is written
        print(f"grpoplus {args.command}: stopped: {err}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("interrupted: the last complete checkpoint and metrics.jsonl are kept; "
              "continue with `grpoplus train --resume RUN`", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (`grpoplus presets | head`): stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 0


def entry() -> None:
    """The process's entry point (the ``grpoplus`` command, ``python -m grpoplus``, each rank torchrun starts): exits
    with :func:`main`'s status; without the interpreter's finalization where a learner rank's process group did not
    tear down in time (finalization could wait on it forever: the run's work is written by then)."""
    code = main()
    from grpoplus.distributed.group import teardown_stalled

    if teardown_stalled():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
