"""``grpoplus traces RUN``: one step's rollout trace (:mod:`grpoplus.metrics.traces`) as one self-contained HTML page.

The page needs no network: its CSS, script and data are inline. A table of the step's samples, filtered by
verdict, score, finish and reward range; per sample its tokens coloured by mask (policy with or without loss, tool
result, environment), by advantage, or by the gap between the engine's and the learner's log-prob. Token text comes
from the run's tokenizer (the newest checkpoint's) when it loads, else the ids are shown. The filters live in the URL
fragment
(``page.html#status=truncated&min=0.5&row=3&colour=gap``), so a view can be linked.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from grpoplus.core.rundir import RunDir
from grpoplus.metrics.tracepage_assets import SCRIPT, STYLE
from grpoplus.metrics.traces import read_trace, traced_steps


def step_ranges(steps: list[int]) -> str:
    """``[1, 2, 3, 5, 8, 9]`` -> ``"1-3, 5, 8-9"``."""
    spans: list[list[int]] = []
    for s in sorted(steps):
        if spans and s == spans[-1][1] + 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def chosen_step(run: Path, step: int | None) -> int:
    """``step``, or the newest traced one; a one-line error when the run has no traces or not that step."""
    directory = RunDir(run).traces
    steps = sorted(traced_steps(directory))
    if not steps:
        raise FileNotFoundError(f"{run} has no rollout traces ({directory} is missing or empty): train with "
                                "run.traces=true (the default) to write them")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise FileNotFoundError(f"step {step} has no trace in {directory} (traced steps: {step_ranges(steps)}): "
                                "pick one of them with --step")
    return step


def token_texts(run: Path, ids: set[int]) -> tuple[dict[int, str] | None, str]:
    """(id -> text of each id, a note saying where it came from) by the tokenizer of the run's newest checkpoint;
    (None, why not) when there is none or it does not load."""
    checkpoints = sorted(RunDir(run).checkpoints.glob("step-*/tokenizer_config.json"),
                         key=lambda p: int(p.parent.name.split("-")[-1]) if p.parent.name[5:].isdigit() else -1)
    if not checkpoints:
        return None, f"token ids shown: no checkpoint with a tokenizer in {RunDir(run).checkpoints}"
    path = checkpoints[-1].parent
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (ImportError, OSError, ValueError) as err:  # the page still shows ids: say why
        return None, f"token ids shown: the tokenizer of {path} did not load ({type(err).__name__}: {err})"
    return {i: tokenizer.decode([i]) for i in sorted(ids)}, f"tokens decoded by the tokenizer of {path}"


def page_data(run: Path, step: int, decode: bool = True) -> dict:
    """What the page's script draws: the step's samples, the traced steps and the token texts."""
    rows = read_trace(RunDir(run).traces, step)
    ids = {i for row in rows for i in row["prompt_ids"] + row["response_ids"]}
    vocab, note = token_texts(run, ids) if decode else (None, "token ids shown (--ids)")
    return {"run": str(run), "step": step, "steps": step_ranges(list(traced_steps(RunDir(run).traces))),
            "note": note, "vocab": vocab, "rows": rows}


def render(data: dict) -> str:
    """The page: inline style, the data as JSON (``</`` escaped so it cannot close its script tag) and the script."""
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    title = html.escape(f"grpoplus traces: {data['run']} step {data['step']}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{title}</title><style>{STYLE}</style></head>"
            f"<body><h1>{title}</h1><p id='about'></p>"
            "<div id='controls'>show <select id='status'><option value='all'>all</option>"
            "<option value='correct'>correct</option><option value='incorrect'>incorrect (verifier)</option>"
            "<option value='truncated'>truncated (length)</option><option value='failed'>failed (incorrect or "
            "environment error)</option><option value='error'>environment error</option>"
            "<option value='unscored'>no score (left out)</option></select> "
            "reward from <input id='min' type='number' step='any' size='6'> to "
            "<input id='max' type='number' step='any' size='6'> "
            "colour tokens by <select id='colour'><option value='mask'>mask</option>"
            "<option value='advantage'>advantage</option><option value='gap'>engine - learner log-prob</option>"
            "</select> <span id='count'></span></div>"
            "<table id='samples'><thead><tr><th>row</th><th>group</th><th>reward</th><th>correct</th><th>finish</th>"
            "<th>advantage</th><th>tokens</th><th>max |gap|</th><th>version</th><th>completion</th></tr></thead>"
            "<tbody></tbody></table><div id='legend'></div><div id='detail'></div>"
            f"<script id='data' type='application/json'>{payload}</script><script>{SCRIPT}</script></body></html>\n")


def write_trace_page(run: str | Path, step: int | None = None, out: str | Path | None = None,
                     decode: bool = True) -> Path:
    """One step's trace page (default: the newest traced step) to ``out`` (default ``RUN/traces/step-N.html``)."""
    run = Path(run)
    if not run.is_dir():
        raise FileNotFoundError(f"run directory {run} does not exist")
    step = chosen_step(run, step)
    path = Path(out) if out else RunDir(run).traces / f"step-{step:06d}.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(page_data(run, step, decode)), encoding="utf-8")
    return path
