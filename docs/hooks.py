"""MkDocs hooks: the Reference pages are generated from the code at every build.

Nothing on those pages is copied by hand, so nothing there can drift from the code:

- ``reference/config.md``: every config key with its section, default and field docstring
  (``grpoplus.config.SECTIONS``, ``grpoplus.config.field_docs``, the same text as ``--help-config``);
- ``reference/registries.md``: every entry of every registry with the first paragraph of its docstring;
- ``reference/presets.md``: every preset as ``grpoplus.algo.presets.describe`` states it;
- ``reference/doctor.md``: every doctor check and every threshold (``threshold_docs``);
- ``reference/rules.md``: every rule a config must pass (``grpoplus.config.rules.RULES``);
- ``reference/architectures.md``: every architecture of the matrix (``grpoplus.models.families``) and the path each
  part of a run takes on it, read off the tiny model itself (tests/models/test_architectures.py proves each path).

A hand-written page can also embed generated tables with an HTML comment (invisible on GitHub):
``<!-- config-keys: learner.lora_* -->`` (the reference rows of those keys) and
``<!-- optional-packages -->`` (``grpoplus.core.packages.OPTIONAL_PACKAGES``) and ``<!-- selftest-checks -->``
(``grpoplus.selftest.CHECKS``: each check of ``grpoplus selftest`` and what it proves).

The results pages' tables, stamps and plots between ``<!-- record: NAME VIEW -->`` and ``<!-- /record -->`` are
rendered from their stored records (``docs/results/records/``) by ``benchmarks/render.py``, and the plots drawn
afresh over the stored SVGs.

The pages are added in ``on_files`` as generated files (``File.generated``, MkDocs >= 1.6): nothing
is written into ``docs/``. Tests import this module to compare the pages with the registries.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import inspect
import json
import re

# (title, module, attribute, what selects an entry)
REGISTRIES = [
    ("Advantage estimators", "grpoplus.algo", "ADVANTAGES", "`algo.adv_estimator`"),
    ("Policy losses", "grpoplus.algo", "LOSSES", "`algo.loss`"),
    ("Loss aggregations", "grpoplus.algo", "AGGREGATIONS", "`algo.aggregation`"),
    ("KL estimators", "grpoplus.algo", "KL_ESTIMATORS", "`algo.kl_estimator`"),
    ("Rollout corrections", "grpoplus.algo", "CORRECTIONS", "`algo.corrections` (a list, applied in order)"),
    ("Distillation losses", "grpoplus.algo", "DISTILL_LOSSES", "`algo.distill_loss`"),
    ("Rewards", "grpoplus.rewards", "REWARDS", "`data.rewards` (`name[:weight][:key=value,...]`)"),
    ("Tasks", "grpoplus.tasks", "TASKS", "`data.task` (`--task`)"),
    ("Environments", "grpoplus.envs.base", "ENVS", "`data.env`"),
    ("Tools", "grpoplus.envs.tools", "TOOLS", "`data.tools`"),
    ("Rollout engines", "grpoplus.rollout", "ENGINES", "`rollout.engine`"),
    ("Metrics loggers", "grpoplus.metrics", "LOGGERS", "`run.loggers`"),
    ("Doctor checks", "grpoplus.metrics", "CHECKS", "`grpoplus doctor` runs all of them"),
    ("Lab measures", "grpoplus.lab", "MEASURES", "an experiment's `Measure(name, ...)`"),
    ("Lab experiments", "grpoplus.lab.experiment", "EXPERIMENTS", "`grpoplus lab NAME`"),
]
# modules whose import registers the built-in entries (the guess game registers an environment and a task)
REGISTERING_MODULES = ["grpoplus.algo", "grpoplus.rewards", "grpoplus.tasks", "grpoplus.envs.guess",
                       "grpoplus.envs.tools", "grpoplus.rollout", "grpoplus.metrics", "grpoplus.lab"]

GENERATED_NOTE = ("*Generated from the code when the site is built (`docs/hooks.py`); "
                  "nothing on this page is written by hand.*")


def registries() -> list[tuple[str, str, str, str, object]]:
    """``(title, module, attribute, selected by, registry)`` for every registry, built-ins registered."""
    for name in REGISTERING_MODULES:
        importlib.import_module(name)
    return [(title, mod, attr, sel, getattr(importlib.import_module(mod), attr)) for title, mod, attr, sel in REGISTRIES]


def _markdown_from_rst(text: str) -> str:
    """Docstring markup to Markdown: ``x`` and :func:`x` become `x`."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``(.+?)``", r"`\1`", text)


def summary(obj: object) -> str:
    """The first paragraph of an object's docstring, on one line (Markdown)."""
    if dataclasses.is_dataclass(obj) and hasattr(obj, "title"):  # a lab experiment
        return f"{obj.title} ({obj.source})"
    doc = inspect.getdoc(obj) or ""
    paragraph = doc.strip().split("\n\n")[0]
    return _markdown_from_rst(" ".join(paragraph.split())) or "(no docstring)"


def cell(text: str) -> str:
    """Text for a Markdown table cell: pipes outside code spans escaped (inside them a pipe is literal)."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else p.replace("|", "\\|") for p in parts)


def value_text(value: object) -> str:
    """A config value as it is written on the command line / in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {value_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str) and (not value.isprintable() or value == ""):
        return json.dumps(value)
    return str(value)


def _default(field: dataclasses.Field) -> object:
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()  # type: ignore[misc]


def config_rows() -> list[dict]:
    """One dict per config key: section, name, key, default, the default run's value, allowed values, doc."""
    from grpoplus.config import SECTIONS, build_config, choices, field_docs

    run = build_config()  # a default run: the dapo preset's algo section
    rows = []
    for section, cls in SECTIONS.items():
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            rows.append(dict(section=section, name=f.name, key=f"{section}.{f.name}", default=_default(f),
                             run_value=getattr(getattr(run, section), f.name),
                             allowed=choices(section, f.name),
                             doc=docs.get(f.name, "")))
    return rows


def _key_row(row: dict) -> str:
    default = f"`{value_text(row['default'])}`"
    if row["run_value"] != row["default"] and not (isinstance(row["run_value"], (list, tuple))
                                                     and list(row["run_value"]) == list(row["default"])):
        default += f" (default run: `{value_text(row['run_value'])}`)"
    doc = row["doc"]
    if row["allowed"]:
        doc += " One of: " + ", ".join(f"`{v}`" for v in row["allowed"]) + "."
    return f"| `{row['key']}` | {default} | {cell(doc)} |"


KEY_TABLE_HEAD = ["| key | default | meaning |", "|---|---|---|"]


def config_page() -> str:
    from grpoplus.config import SECTIONS

    rows = config_rows()
    out = ["# Configuration keys", "", GENERATED_NOTE, "",
           "Every key of the config tree, by section, with its default and its field docstring (the text "
           "`grpoplus train --help-config` prints). A bare key (`eps_high=0.3`) names the one field of that name "
           "in any section; a dotted key (`rollout.temperature=0.7`) names it explicitly. The `algo` section "
           "is `AlgoConfig`; a run starts it from a preset, so where the default run (`--preset dapo`) "
           "uses another value than the dataclass default, both are shown. Section numbers refer to the "
           "[specification](../ALGORITHMS.md).", ""]
    for section, cls in SECTIONS.items():
        out += [f"## `{section}`", "", f"`{cls.__module__}.{cls.__name__}`", ""] + KEY_TABLE_HEAD
        out += [_key_row(r) for r in rows if r["section"] == section]
        out.append("")
    return "\n".join(out)


def key_table(patterns: list[str]) -> str:
    """The reference rows of the keys matching ``patterns`` (``section.name`` globs), in config order."""
    rows = [r for r in config_rows() if any(fnmatch.fnmatchcase(r["key"], p) for p in patterns)]
    if not rows:
        raise ValueError(f"config-keys: no key matches {patterns}")
    return "\n".join(KEY_TABLE_HEAD + [_key_row(r) for r in rows])


def _where(obj: object) -> str:
    module = getattr(obj, "__module__", None) or type(obj).__module__
    return f"`{module}`"


def registries_page() -> str:
    out = ["# Registries", "", GENERATED_NOTE, "",
           "Every pluggable piece of grpoplus is an entry of a registry (`grpoplus.core.registry.Registry`); a config "
           "names it by its registered name. Below: every built-in entry with the first paragraph of its "
           "docstring. Register your own with `@REGISTRY.register(\"name\")` "
           "([Extend grpoplus](../how-to/extend.md)). Presets: [Presets](presets.md); doctor checks and thresholds: "
           "[Doctor](doctor.md).", ""]
    for title, mod, attr, selected_by, registry in registries():
        if attr == "CHECKS":
            continue  # on the doctor page
        out += [f"## {title}", "", f"`{mod}.{attr}`; selected by {selected_by}.", "",
                "| name | what it is | defined in |", "|---|---|---|"]
        for name in registry.names():
            obj = registry.get(name)
            out.append(f"| `{name}` | {cell(summary(obj))} | {_where(obj)} |")
        out.append("")
    return "\n".join(out)


def presets_page() -> str:
    from grpoplus.algo import PRESETS
    from grpoplus.algo.presets import describe

    out = ["# Presets", "", GENERATED_NOTE, "",
           "A preset is a named set of `AlgoConfig` values (`--preset NAME`, `AlgoConfig.preset(NAME)`); the `algo` "
           "section of a run starts from it, and any key given after it overrides it. `grpoplus presets` prints "
           "the same lines. Where each value comes from: [Algorithms](../concepts/algorithms.md#presets).", "",
           "| preset | what it sets (and whose recipe it is) |", "|---|---|"]
    for name in PRESETS.names():
        text = describe(name)
        assert text.startswith(f"{name}: ")
        out.append(f"| `{name}` | {cell(text[len(name) + 2:])} |")
    return "\n".join(out) + "\n"


def doctor_page() -> str:
    from grpoplus.metrics import CHECKS, DoctorThresholds, threshold_docs

    docs = threshold_docs()
    out = ["# Doctor checks and thresholds", "", GENERATED_NOTE, "",
           "`grpoplus doctor RUN` (and the live doctor during training) runs every registered check; what each "
           "finding means, its evidence and its fix: [Run health](../concepts/run-health.md#grpoplus-doctor-run).",
           "", "## Checks", "", "`grpoplus.metrics.CHECKS`", "", "| code | what it detects |", "|---|---|"]
    for name in CHECKS.names():
        out.append(f"| `{name}` | {cell(summary(CHECKS.get(name)))} |")
    out += ["", "## Thresholds", "",
            "`grpoplus.metrics.DoctorThresholds`; change one with `grpoplus doctor RUN --threshold name=value`.", "",
            "| name | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(DoctorThresholds):
        out.append(f"| `{f.name}` | {f.default} | {cell(docs[f.name])} |")
    return "\n".join(out) + "\n"


def rules_page() -> str:
    from grpoplus.algo.checks import CHECKS
    from grpoplus.config.rules import RULES

    out = ["# Config rules", "", GENERATED_NOTE, "",
           "Every config is checked against these rules when it is built (`grpoplus train`, `--dry-run`, "
           "`grpoplus.Trainer(...)`), in this order, before anything loads: the first rule a config breaks is its "
           "error, one line naming the keys and the fix (a `grpoplus.config.ConfigError`, a `ValueError`). The algo "
           "section's own checks (listed below the rules) run as it is built, before these. Values nobody gave "
           "(defaults, a preset's) are first fitted to "
           "the ones given where a combination would otherwise be refused, each with a note on stderr "
           "(`grpoplus.config.rules.fit_defaults`).", "", "`grpoplus.config.rules.RULES`", "",
           "| rule | what it refuses unless it holds |", "|---|---|"]
    out += [f"| `{r.name}` | {cell(r.what)} |" for r in RULES]
    out += ["", "## The algo section's own checks", "",
            "`AlgoConfig` applies these as it is built, in this order, after the type of each field and the names "
            "of its registered functions (`algo.loss`, `algo.adv_estimator`, `algo.corrections`, ...) are checked; the "
            "error names the key as written in a config (`algo.beta must be >= 0, got -0.1`). The same checks run "
            "for `AlgoConfig(...)` built in Python, with `AlgoConfig.` before the key.", "",
            "`grpoplus.algo.checks.CHECKS`", "", "| check | what it refuses unless it holds |", "|---|---|"]
    out += [f"| `{c.name}` | {cell(c.what)} |" for c in CHECKS]
    return "\n".join(out) + "\n"


def architectures_page() -> str:
    from grpoplus.learner.logprobs import chunked_head
    from grpoplus.learner.packing import packing_refusal
    from grpoplus.learner.replay import moe_spec
    from grpoplus.models.families import FAMILIES, VLLM, tiny_family_model
    from grpoplus.models.tokenizer import char_tokenizer

    tok = char_tokenizer()
    out = ["# Architectures", "", GENERATED_NOTE, "",
           "Every architecture below is built as a tiny randomly initialised model from transformers' own config class "
           "(`grpoplus.models.families`; `--model tiny-<type>` trains its warm-started built-in one) and proven on "
           "every path of a run by the architecture matrix (`tests/models/test_architectures.py`, in CI): a "
           "left-padded row equals the row alone; the hf engine samples (each prompt prefilled once, finished rows "
           "pruned) with `logp_roll` equal to the learner's log-probs; activation checkpointing gives the same "
           "gradient; LoRA adapters train alone; two steps through the trainer; packed micro-batches equal padded ones "
           "exactly where the packing column says so. The columns say which path a part takes where the architecture "
           "decides it.", "",
           "| `model_type` | layers | LM head in the learner | learner prompts | packing | routing replay | "
           "vLLM engine (CPU) |",
           "|---|---|---|---|---|---|---|"]
    for name in sorted(FAMILIES):
        model = tiny_family_model(tok, name)
        kinds = sorted(set(getattr(model.config, "layer_types", None) or ["full_attention"]))
        head = "chunked (no [tokens x V] logits)" if chunked_head(model) is not None else \
            "logits (a scale or soft-cap follows the head)"
        shared = "each prompt once" if _prompts_shared(model) else "row by row (a window or a recurrent state)"
        replay = "—" if not _is_moe(model) else ("r2, r3" if moe_spec(model) is not None else "not its router")
        packs = "packed" if packing_refusal(model) is None else "padded (a state or chunk runs across rows)"
        out.append(f"| `{name}` | {', '.join(kinds)} | {head} | {shared} | {packs} | {replay} | {cell(VLLM[name])} |")
    return "\n".join(out + vision_rows()) + "\n"


def vision_rows() -> list[str]:
    """The vision-language families (grpoplus.models.tiny_vision), each built as its tiny model."""
    from grpoplus.models.tiny_vision import VISION_FAMILIES, tiny_vision_model
    from grpoplus.models.vision import vision_parameters

    out = ["", "## Vision-language families", "",
           "Built the same way with a vision tower and projector at toy scale and the family's own processor "
           "(`grpoplus.models.tiny_vision`), and proven by `tests/models/test_vision.py` (in CI): a left-padded batch "
           "with images equals each row alone; the engine's `logp_roll` equals the learner's with the same pixels; two "
           "updates train; a sampled image token ends its row. LoRA and a 4-bit base adapt the language model alone; "
           "two learner ranks (replicated or fsdp2) train like one process ([how-to](../how-to/vision.md)).", "",
           "| `model_type` | class | processor | language layers | positions | vision tower + projector |",
           "|---|---|---|---|---|---|"]
    for name in sorted(VISION_FAMILIES):
        model, processor = tiny_vision_model(name)
        text = model.config.get_text_config()
        kinds = sorted(set(getattr(text, "layer_types", None) or ["full_attention"]))
        rope = "three per token (time, height, width)" if hasattr(getattr(model, "model", model), "get_rope_index") \
            else "one per token"
        out.append(f"| `{name}` | {type(model).__name__} | {type(processor).__name__} | {', '.join(kinds)} | {rope} | "
                   f"{vision_parameters(model):,} of {sum(p.numel() for p in model.parameters()):,} parameters |")
    return out


def _prompts_shared(model) -> bool:
    import torch

    from grpoplus.learner.shared_prompt import shared_prompt_hidden

    ids = torch.full((2, 6), 5)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        return shared_prompt_hidden(model, ids, mask, mask.cumsum(1) - 1, 4, 2) is not None


def _is_moe(model) -> bool:
    config = model.config
    return any(getattr(config, key, None) for key in ("num_experts", "num_local_experts", "n_routed_experts"))


PAGES = {
    "reference/config.md": config_page,
    "reference/registries.md": registries_page,
    "reference/presets.md": presets_page,
    "reference/doctor.md": doctor_page,
    "reference/rules.md": rules_page,
    "reference/architectures.md": architectures_page,
}
KEYS_COMMENT = re.compile(r"^<!-- config-keys: (.+?) -->$", re.M)
PACKAGES_COMMENT = re.compile(r"^<!-- optional-packages -->$", re.M)
SELFTEST_COMMENT = re.compile(r"^<!-- selftest-checks -->$", re.M)


def packages_table() -> str:
    """``grpoplus.core.packages.OPTIONAL_PACKAGES`` as a table: the package, what needs it, how to install it."""
    from grpoplus.core.packages import OPTIONAL_PACKAGES

    rows = ["| package (import name) | needed by | install |", "|---|---|---|"]
    rows += [f"| `{module}` | {cell(needed_by)} | `{pip}` |" for module, (needed_by, pip) in OPTIONAL_PACKAGES.items()]
    return "\n".join(rows)


def selftest_table() -> str:
    """``grpoplus.selftest.CHECKS`` in the order they run: each check's name and what it proves."""
    from grpoplus.selftest import CHECKS

    rows = ["| check | what it proves on the machine |", "|---|---|"]
    rows += [f"| `{c.name}` | {cell(c.what)} |" for c in CHECKS]
    return "\n".join(rows)


def results_renderer():
    """``benchmarks/render.py``: the results' tables, stamps and plots drawn from their stored records."""
    import sys
    from pathlib import Path

    benchmarks = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)
    return importlib.import_module("render")


def on_files(files, config):
    from mkdocs.structure.files import File

    for path, make in PAGES.items():
        files.append(File.generated(config, path, content=make()))
    render = results_renderer()
    from plots import draw

    for name, plot in render.plots_named():  # every plot drawn afresh from its record, over the stored SVG
        uri = render.plot_path(name, plot).relative_to(render.ROOT / "docs").as_posix()
        if files.get_file_from_path(uri) is not None:
            files.remove(files.get_file_from_path(uri))
        files.append(File.generated(config, uri, content=draw(render.plot_spec(name, plot))))
    return files


def on_page_markdown(markdown, page, config, files):
    from pathlib import Path

    if page.file.abs_src_path:  # the results' blocks rendered from their records (benchmarks/render.py)
        markdown = results_renderer().render_text(markdown, Path(page.file.abs_src_path))
    markdown = PACKAGES_COMMENT.sub(lambda m: packages_table(), markdown)
    markdown = SELFTEST_COMMENT.sub(lambda m: selftest_table(), markdown)
    return KEYS_COMMENT.sub(lambda m: key_table(m.group(1).split()), markdown)
