r"""Does the ``function_call`` reward agree with BFCL's own AST checker, on BFCL's own data?

For every problem of BFCL's single-turn AST categories (the questions and ``possible_answer`` files that the
``bfcl-eval`` package ships), the script writes candidate model outputs: the expected calls with each of the
acceptable values, and perturbations of them (a wrong function name, a required argument missing, an unexpected
argument, a wrong value, a wrong type, an integer for a float, a float for an integer, integer items in a float
array, a string re-cased, an array's strings or an object's values re-cased, a number for an ``any`` argument, the
parallel calls reordered, one call missing, one call twice). Each candidate is written in BFCL's Python form
``[f(a=1)]`` and in the stated call format (``<tool_call>`` JSON): two verdicts of the reward. BFCL decodes the
Python form with its own decoder and judges it with its own checker (``ast_checker``, Python rules); the reward
scores both texts on the row the project's loader makes of the problem. Every disagreement is classed: one of the
reward's stated departures (see ``docs/how-to/function-calling.md``), or ``unexplained``.

bfcl-eval is no dependency of grpoplus (it pins numpy 1.26.4 and pulls 48 packages): install it beside the venv,
without its dependencies, with the modules its checker's imports reach (about 150 MB)::

    pip install --no-deps --target /tmp/bfcl-site bfcl-eval==2026.3.23 soundfile tree-sitter==0.21.3 \
        tree-sitter-java==0.21.0 tree-sitter-javascript==0.21.4 tenacity overrides cohere fastavro google-genai \
        mistralai==1.7.0 boto3 botocore s3transfer jmespath qwen-agent json5 dashscope websocket-client httpx-sse \
        writer-sdk datamodel-code-generator
    PYTHONPATH=/tmp/bfcl-site python benchmarks/bfcl_agreement.py             # the four categories, every problem
    PYTHONPATH=/tmp/bfcl-site python benchmarks/bfcl_agreement.py --live      # BFCL's live categories too
"""

from __future__ import annotations

import argparse
import copy
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from grpoplus.data.functions import function_call_record
from grpoplus.rewards.function_call import function_call_score

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")
LIVE = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
MODEL = "gorilla-openfunctions-v2"
"""A model BFCL keeps dotted function names for (``underscore_to_dot`` false), as the Python form writes them."""

MAXIMUM_MATCHING = "maximum matching"
"""BFCL matches parallel calls greedily, the reward by a maximum matching."""
INT_ITEMS = "integer items of a float array"
"""BFCL refuses integers in an array of floats (unless the argument may be left out), the reward accepts them."""
DEPARTURES = (MAXIMUM_MATCHING, INT_ITEMS)


@dataclass(frozen=True)
class Verdict:
    category: str
    id: str
    perturbation: str
    form: str  # "python" or "tagged"
    text: str
    bfcl: bool
    ours: bool
    error: str
    departure: str | None = None  # set on a disagreement: one of DEPARTURES, else "unexplained"


def problems(category: str, data: Path | None = None) -> list[dict]:
    """BFCL's problems of ``category``: its questions joined with their ``ground_truth`` by ``id``."""
    if data is None:
        import bfcl_eval
        data = Path(bfcl_eval.__file__).parent / "data"
    name = f"BFCL_v4_{category}.json"
    truths = {row["id"]: row["ground_truth"] for row in _jsonl(data / "possible_answer" / name)}
    return [{**row, "ground_truth": truths[row["id"]], "category": category}
            for row in _jsonl(data / name) if row["id"] in truths]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---- candidates: lists of calls in BFCL's decoded form, [{name: {argument: value}}] ----

def accepted(truth: list[dict]) -> list[list[dict]]:
    """The expected calls written with each acceptable value: variant k takes each argument's k-th value (its
    last when it has fewer; ``""`` leaves the argument out), and one more variant leaves out every argument
    that may be left out."""
    width = max((len(values) for call in truth for values in next(iter(call.values())).values()), default=1)
    variants = [[{name: _pick(args, lambda values, k=k: values[min(k, len(values) - 1)])}
                 for call in truth for name, args in call.items()] for k in range(width)]
    variants.append([{name: _pick(args, lambda values: "" if "" in values else values[0])}
                     for call in truth for name, args in call.items()])
    unique = []
    for variant in variants:
        if variant not in unique:
            unique.append(variant)
    return unique


def _pick(args: dict, choose) -> dict:
    """One value of each argument (``""``: left out; an argument without acceptable values is left out too); an
    object's keys map to acceptable values in BFCL's data too, and so does each object of a list of objects."""
    picked = {arg: choose(values) for arg, values in args.items() if isinstance(values, list) and values}
    return {arg: _concrete(value, choose) for arg, value in picked.items() if value != ""}


def _concrete(value, choose):
    if isinstance(value, dict) and all(isinstance(v, list) for v in value.values()):
        return _pick(value, choose)
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_concrete(v, choose) for v in value]
    return value


def _schema(problem: dict, name: str) -> dict:
    return next(f for f in problem["function"] if f["name"] == name)["parameters"]


def _first_argument(problem: dict, calls: list[dict], want) -> tuple[int, str] | None:
    """The first (call index, argument) whose schema type and value satisfy ``want(type, value)``."""
    for i, call in enumerate(calls):
        name, args = next(iter(call.items()))
        properties = _schema(problem, name)["properties"]
        for arg, value in args.items():
            if want(properties.get(arg, {}).get("type"), value):
                return i, arg
    return None


def _with(calls: list[dict], where: tuple[int, str] | None, change) -> list[dict] | None:
    if where is None:
        return None
    calls = copy.deepcopy(calls)
    i, arg = where
    args = next(iter(calls[i].values()))
    args[arg] = change(args[arg])
    return calls


def _wrong(value):
    """A value of the same type that no checker takes for ``value``."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1.5 if isinstance(value, float) else value + 1
    if isinstance(value, str):
        return value + " wrong"
    if isinstance(value, list):
        return [*value, value[0] if value else "wrong"]
    return {**value, "wrong_key": "wrong"}


def _other_type(value):
    """The value as another type: a number as its text, a string as a number, the rest as text."""
    if isinstance(value, str):
        return 7
    return str(value) if not isinstance(value, bool) else str(value).lower()


def _recase_object(value: dict) -> dict:
    return {k: v.upper() + "." if isinstance(v, str) else v for k, v in value.items()}


def candidates(problem: dict) -> list[tuple[str, list[dict]]]:
    """``(perturbation, calls)`` for one problem: its accepted calls, then each perturbation that applies."""
    variants = accepted(problem["ground_truth"])
    calls = variants[0]
    out = [("accepted", v) for v in variants]
    name, args = next(iter(calls[0].items()))
    others = [f["name"] for f in problem["function"] if f["name"] != name]
    out.append(("wrong_name", [{others[0] if others else name + "_other": args}, *calls[1:]]))
    required = [a for a in _schema(problem, name)["required"] if a in args]
    if required:
        out.append(("missing_required", [{name: {a: v for a, v in args.items() if a != required[0]}}, *calls[1:]]))
    out.append(("unexpected_argument", [{name: {**args, "unexpected_argument": "x"}}, *calls[1:]]))
    perturbed = {
        "wrong_value": _with(calls, _first_argument(problem, calls, lambda t, v: True), _wrong),
        "wrong_type": _with(calls, _first_argument(problem, calls, lambda t, v: t != "any"), _other_type),
        "int_for_float": _with(calls, _first_argument(
            problem, calls, lambda t, v: t == "float" and isinstance(v, float) and v.is_integer()), int),
        "float_for_int": _with(calls, _first_argument(
            problem, calls, lambda t, v: t == "integer" and type(v) is int), float),
        "string_recased": _with(calls, _first_argument(
            problem, calls, lambda t, v: t == "string" and isinstance(v, str) and v), lambda v: v.upper() + "."),
        "any_as_number": _with(calls, _first_argument(problem, calls, lambda t, v: t == "any"), lambda v: 7),
        "int_items": _with(calls, _first_argument(problem, calls, lambda t, v: t in ("array", "tuple") and v and all(
            isinstance(x, float) and x.is_integer() for x in v)), lambda v: [int(x) for x in v]),
        "items_recased": _with(calls, _first_argument(problem, calls, lambda t, v: t in ("array", "tuple") and v and all(
            isinstance(x, str) and x for x in v)), lambda v: [x.upper() + "." for x in v]),
        "object_value_recased": _with(calls, _first_argument(problem, calls, lambda t, v: t == "dict" and any(
            isinstance(x, str) and x for x in v.values())), _recase_object),
    }
    out += [(k, v) for k, v in perturbed.items() if v is not None]
    if len(calls) > 1:
        if calls[::-1] != calls:
            out.append(("reordered", calls[::-1]))
        out.append(("call_missing", calls[:-1]))
    out.append(("call_twice", [*calls, calls[0]]))
    return out


def python_form(calls: list[dict]) -> str:
    """BFCL's Python form: ``[f(a=1), g(b='x')]``."""
    return "[" + ", ".join(f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
                           for call in calls for name, args in call.items()) + "]"


def tagged_form(calls: list[dict]) -> str:
    """The stated call format: one ``<tool_call>`` JSON object per call."""
    return "".join(f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"
                   for call in calls for name, args in call.items())


# ---- the two judges ----

def bfcl_judge(problem: dict, text: str) -> tuple[bool, str]:
    """BFCL's verdict on a Python-form text, as its AST runner reaches it: its decoder, its format check, its
    checker."""
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from bfcl_eval.model_handler.utils import default_decode_ast_prompting
    from bfcl_eval.utils import is_function_calling_format_output

    decoded = default_decode_ast_prompting(text)
    if not is_function_calling_format_output(decoded):
        return False, "ast_decoder:decoder_wrong_output_format"
    result = ast_checker(problem["function"], decoded, problem["ground_truth"], Language.PYTHON,
                         problem["category"], MODEL)
    return bool(result["valid"]), result.get("error_type", "")


def our_judge(record: dict, text: str) -> bool:
    fields = record["fields"]
    return function_call_score(text, record["answer"], fields["tools"], parallel=fields["parallel"]) == 1.0


def departure(problem: dict, calls: list[dict]) -> str:
    """Which stated departure explains that the reward accepts ``calls`` where BFCL refuses them: BFCL accepts
    them with the integer items of its float arrays written as floats, or in an order its greedy pass can take."""
    if bfcl_judge(problem, python_form(_float_items(problem, calls)))[0]:
        return INT_ITEMS
    if _perfect_matching(problem, calls):
        return MAXIMUM_MATCHING
    return "unexplained"


def _float_items(problem: dict, calls: list[dict]) -> list[dict]:
    out = []
    for call in calls:
        name, args = next(iter(call.items()))
        properties = _schema(problem, name)["properties"] if any(
            f["name"] == name for f in problem["function"]) else {}
        floats = {a for a, p in properties.items() if p.get("items", {}).get("type") == "float"}
        out.append({name: {a: [float(x) if a in floats and type(x) is int else x for x in v]
                           if isinstance(v, list) else v for a, v in args.items()}})
    return out


def _perfect_matching(problem: dict, calls: list[dict]) -> bool:
    """Each expected call fits a different call by BFCL's own single-call check (so only BFCL's greedy order
    refused them)."""
    from itertools import permutations

    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import find_description, simple_function_checker

    truth = problem["ground_truth"]
    fits = [[simple_function_checker(find_description(problem["function"], next(iter(e))), c, e, Language.PYTHON,
                                     MODEL)["valid"] for c in calls] for e in truth]
    return len(calls) == len(truth) and any(all(fits[e][c] for e, c in enumerate(order))
                                            for order in permutations(range(len(calls))))


def compare(problem: dict) -> list[Verdict]:
    """Both verdicts on every candidate of ``problem``, in both forms; a problem the project's loader refuses
    gives one verdict, ``refused_row`` (its error), judged by BFCL on the accepted calls."""
    row = {k: problem[k] for k in ("id", "question", "function", "ground_truth")}
    try:
        record = function_call_record(row)
    except ValueError as err:
        text = python_form(accepted(problem["ground_truth"])[0])
        bfcl, error = bfcl_judge(problem, text)
        return [Verdict(problem["category"], problem["id"], "refused_row", "python", f"{err}; {text}", bfcl, False,
                        error, "unexplained" if bfcl else None)]
    verdicts = []
    for perturbation, calls in candidates(problem):
        bfcl, error = bfcl_judge(problem, python_form(calls))
        for form, text in (("python", python_form(calls)), ("tagged", tagged_form(calls))):
            ours = our_judge(record, text)
            why = None if ours == bfcl else (departure(problem, calls) if ours else "unexplained")
            verdicts.append(Verdict(problem["category"], problem["id"], perturbation, form, text, bfcl, ours,
                                    error, why))
    return verdicts


def run(categories: tuple[str, ...], every: int = 1) -> list[Verdict]:
    """Verdicts on every ``every``-th problem of each category."""
    return [v for category in categories for problem in problems(category)[::every] for v in compare(problem)]


def report(verdicts: list[Verdict]) -> str:
    """Agreement per category and per perturbation, then each disagreement with its class."""
    lines = []
    for key in ("category", "perturbation"):
        total, agree = Counter(), Counter()
        for v in verdicts:
            total[getattr(v, key)] += 1
            agree[getattr(v, key)] += v.bfcl == v.ours
        lines += [f"| {key} | verdicts | agree | disagree |", "|---|---|---|---|"]
        lines += [f"| {k} | {total[k]} | {agree[k]} | {total[k] - agree[k]} |" for k in total]
        lines += [f"| all | {sum(total.values())} | {sum(agree.values())} | {sum(total.values()) - sum(agree.values())} |",
                  ""]
    for v in verdicts:
        if v.bfcl != v.ours:
            lines.append(f"- {v.id} {v.perturbation} ({v.form}): BFCL {v.bfcl} ({v.error or 'valid'}), "
                         f"ours {v.ours}: {v.departure}: {v.text[:160]}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", action="store_true", help="BFCL's live categories too")
    parser.add_argument("--every", type=int, default=1, help="every n-th problem of each category")
    args = parser.parse_args()
    verdicts = run(CATEGORIES + (LIVE if args.live else ()), args.every)
    print(report(verdicts))
    unexplained = sum(v.departure == "unexplained" for v in verdicts)
    print(f"\n{len(verdicts)} verdicts, {sum(v.bfcl != v.ours for v in verdicts)} disagreements, "
          f"{unexplained} unexplained")


if __name__ == "__main__":
    main()
