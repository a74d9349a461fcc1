"""``grpoplus export RUN --out DIR``: a run's newest complete checkpoint as a plain Hugging Face directory.

A checkpoint holds the same files whatever wrote it (one process, replicated or sharded
learner ranks: a sharded learner's are gathered when saved), so the export is a copy of its
model, configuration and tokenizer files, without the trainer's state and the reference. A
LoRA run's checkpoint holds its adapters: the export is then a PEFT adapter directory, to load
on its base model (``peft.PeftModel.from_pretrained(base, DIR)``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from grpoplus.learner.checkpoint import MARKER, REF_FILE, STATE_FILE, list_checkpoints

LEFT_OUT = {MARKER, STATE_FILE, REF_FILE}
"""Checkpoint files that are the trainer's, not the model's."""


def export_checkpoint(run: str | Path, out: str | Path, step: int | None = None) -> Path:
    """Copy the model files of ``run``'s newest complete checkpoint (or of ``step``) into ``out``; returns
    the checkpoint exported. ``out`` must not exist or be empty."""
    run, out = Path(run), Path(out)
    if not run.is_dir():
        raise FileNotFoundError(f"run directory {str(run)!r} does not exist")
    complete = list_checkpoints(run)
    if not complete:
        raise ValueError(f"{str(run)!r} has no complete checkpoint to export (a run saves one every "
                         "run.save_every steps and at its last step)")
    chosen = complete[-1] if step is None else next((p for p in complete if p.name == f"step-{step}"), None)
    if chosen is None:
        raise ValueError(f"{str(run)!r} has no complete checkpoint of step {step}; complete: "
                         f"{', '.join(p.name for p in complete)}")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{str(out)!r} exists and is not empty: give a new directory")
    out.mkdir(parents=True, exist_ok=True)
    for file in chosen.iterdir():
        if file.is_file() and file.name not in LEFT_OUT:
            shutil.copy2(file, out / file.name)
    return chosen


def register_export(sub) -> None:
    p = sub.add_parser("export", help="a run's newest complete checkpoint as a plain Hugging Face model directory",
                       description="Copy the model, config and tokenizer files of RUN's newest complete checkpoint "
                                   "(whatever learner strategy wrote it) into DIR, loadable with "
                                   "AutoModelForCausalLM.from_pretrained(DIR); a LoRA run's are its adapters.")
    p.add_argument("run", metavar="RUN", help="run directory")
    p.add_argument("--out", required=True, metavar="DIR", help="new (or empty) directory to write")
    p.add_argument("--step", type=int, default=None, help="export this step's checkpoint instead of the newest")
    p.set_defaults(func=_export)


def _export(args) -> int:
    chosen = export_checkpoint(args.run, args.out, args.step)
    print(f"exported {chosen} to {args.out}")
    return 0
