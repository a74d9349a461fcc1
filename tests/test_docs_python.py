"""Every ```python block of the docs compiles and its grpoplus imports resolve; every block runs, the blocks of a page
in order in one namespace, as a reader pasting them would run them: a fresh process per page (registrations stay
there), in an empty directory, the built-in tiny models where a block trains. A result a block states in a comment
(`expr  # 1.0`, `print(expr)  # [1.0]`) is checked against the code's. What a page's prose says the reader already
holds (a model, a batch, a file of their own) is made first (GIVEN); a long run is shortened (SHORTER: its settings
replaced, nothing else, as tests/test_readme_python.py does). A block is not run only under an HTML comment
`<!-- not run: reason -->` directly before it (invisible on the site and on GitHub); those still compile here.
The shell commands of the docs are checked in tests/test_docs_examples.py."""

import ast
import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\s*$")


def _blocks() -> list[tuple[str, int, str, str | None]]:
    """``(page, line of the block's first code line, code, why it is not run or None)`` for every ```python block."""
    found = []
    for path in sorted((ROOT / "docs").rglob("*.md")):
        text = path.read_text()
        for block in re.finditer(r"```python\n(.*?)```", text, re.S):
            mark = NOT_RUN.search(text[:block.start()].rstrip() + "\n")
            line = text[:block.start(1)].count("\n") + 1
            found.append((str(path.relative_to(ROOT)), line, block.group(1), mark and mark.group(1)))
    return found


BLOCKS = _blocks()
PAGES = sorted({page for page, _, _, why in BLOCKS if why is None})

# What a page's prose says the reader already holds, made before its first block runs.
GIVEN = {
    "docs/concepts/moe.md": """
        import torch
        from grpoplus.models.tiny import tiny_moe_model
        from grpoplus.models.tokenizer import char_tokenizer
        tok = char_tokenizer()
        model = engine_model = tiny_moe_model(tok, size="moe-nano", seed=1)
        num_experts = model.config.num_experts
        enc = tok(["12+3=", "7="], padding=True, return_tensors="pt")
        prompt_ids, prompt_mask = enc["input_ids"], enc["attention_mask"]
        response_ids = torch.tensor([tok("15", add_special_tokens=False)["input_ids"]] * 2)
        response_mask = torch.ones_like(response_ids, dtype=torch.float32)
        ids, mask = torch.cat([prompt_ids, response_ids], 1), torch.cat([prompt_mask, response_mask.long()], 1)
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        prompt_width, new_prompt_width, new_response_width = prompt_ids.shape[1], prompt_ids.shape[1] + 2, 4
        """,
    "docs/concepts/run-health.md": """
        from grpoplus.config import build_config
        config_dict, step = build_config().to_dict(), 5
        records_so_far = [{"step": s, "reward/mean": 0.0, "reward/zero_variance_frac": 1.0} for s in range(6)]
        """,
    "docs/how-to/own-data.md": """
        import json
        from grpoplus.models.tokenizer import char_tokenizer
        rows = [{"question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
                 "answer": "48 + 24 = 72\\n#### 72"}, {"question": "no answer"}]
        with open("gsm8k_train.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\\n" for row in rows)
        tokenizer = char_tokenizer()
        """,
    "docs/how-to/own-reward.md": """
        import os
        from grpoplus.tasks import get_task
        os.makedirs("mypkg", exist_ok=True)
        open("mypkg/__init__.py", "w").close()
        with open("mypkg/rewards.py", "w") as f:
            f.write("def brevity(prompts, completions, **fields):\\n    return [float(len(c) < 20) for c in completions]\\n")
        task = get_task("arithmetic")
        prompts, answers = ["1+2=", "3*4="], ["3", "12"]
        completions, lengths = ["1+2=3#3", "\\\\boxed{12}"], [7, 10]
        """,
    "docs/how-to/sft.md": """
        rows = [{"messages": [{"role": "user", "content": "2+3="}, {"role": "assistant", "content": "5"}]}] * 8
        """,
}

# Long runs made short: (page, what the page says, what runs here).
SHORTER = [
    ("docs/concepts/fidelity-lab.md", '"max_steps=150"',
     '"max_steps=2", "model=tiny-untrained", "prompts_per_step=8", "group_size=2", "max_new_tokens=8", "eval_every=0"'),
    ("docs/concepts/fidelity-lab.md", "seeds=3)", "seeds=1)"),
    ("docs/how-to/sft.md", 'model="smollm2", demos=rows, out="runs/sft", max_steps=200',
     'model="tiny-untrained", demos=rows, out="runs/sft", max_steps=1, eval_size=2, eval_samples=1, max_new_tokens=8, '
     'progress=False, loggers=[]'),
    ("docs/how-to/sft.md", 'task="wordproblems", out="runs/rl"',
     'task="wordproblems", out="runs/rl", max_steps=1, prompts_per_step=2, group_size=2, max_new_tokens=8, '
     'eval_size=2, eval_samples=1, eval_max_new_tokens=8, progress=False, loggers=[], chat_template=False'),
]

# Runs in the page's process: each block statement by statement; a statement whose line ends in a comment that
# reads as a Python literal states its result, which is compared.
RUNNER = r'''
import ast, json, math, re, sys

def plain(value):
    return value.tolist() if hasattr(value, "tolist") else value

def same(got, said):
    got = plain(got)
    if isinstance(said, float) or isinstance(got, float):
        return isinstance(got, (int, float)) and math.isclose(got, said, rel_tol=1e-4, abs_tol=1e-6)
    if isinstance(said, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(got) == len(said) and all(same(g, s) for g, s in zip(got, said))
    if isinstance(said, set) and isinstance(got, dict):  # {'a', 'b'}: the keys it holds
        return set(got) == said
    if isinstance(said, dict) and isinstance(got, dict):
        return got.keys() == said.keys() and all(same(got[k], said[k]) for k in said)
    return got == said

def stated(line):
    if "  # " not in line:
        return None
    comment = line.split("  # ", 1)[1].strip()
    for text in (comment, re.split(r"\s+\(|:\s", comment)[0]):  # "[] (4 mini-batches)": []
        try:
            return (ast.literal_eval(text),)
        except (ValueError, SyntaxError):
            pass
    return None

scope = {"__name__": "__main__"}
for page, first, code in json.load(open(sys.argv[1])):
    source = "\n" * (first - 1) + code
    lines = source.splitlines()
    for node in ast.parse(source, page).body:
        said = stated(lines[node.end_lineno - 1])
        if said is not None and isinstance(node, ast.Expr):
            expr = node.value
            if isinstance(expr, ast.Call) and getattr(expr.func, "id", None) == "print" and len(expr.args) == 1:
                expr = expr.args[0]
            got = eval(compile(ast.Expression(expr), page, "eval"), scope)
            assert same(got, said[0]), f"{page}:{node.lineno}: the page says {said[0]!r}, the code gives {plain(got)!r}"
        else:
            exec(compile(ast.Module([node], []), page, "exec"), scope)
'''


@pytest.mark.parametrize("page,line,code,why", BLOCKS, ids=[f"{p}:{n}" for p, n, _, _ in BLOCKS])
def test_every_python_block_compiles_and_its_grpoplus_imports_resolve(page, line, code, why):
    tree = ast.parse("\n" * (line - 1) + code, page)
    imported = {}  # name in the block -> the grpoplus object
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grpoplus"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), \
                    f"{page}:{node.lineno}: {node.module} has no {alias.name}"
                imported[alias.asname or alias.name] = getattr(module, alias.name, None)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("grpoplus"):
                    importlib.import_module(alias.name)
    for node in ast.walk(tree):  # a call of a grpoplus function binds to its signature (run or not)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and callable(imported.get(node.func.id)) \
                and not any(isinstance(a, ast.Starred) for a in node.args) and all(k.arg for k in node.keywords):
            try:
                inspect.signature(imported[node.func.id]).bind(*node.args, **{k.arg: None for k in node.keywords})
            except TypeError as err:
                pytest.fail(f"{page}:{node.lineno}: {ast.unparse(node)[:80]}: {err}")
    assert why is None or len(why) > 20, f"{page}:{line}: say why the block is not run"


def test_few_blocks_are_not_run():
    assert len(BLOCKS) >= 30
    assert sum(why is not None for *_, why in BLOCKS) <= 3, [(p, n, why) for p, n, _, why in BLOCKS if why]


def _run(blocks: list[tuple[str, int, str]], cwd: Path) -> subprocess.CompletedProcess:
    (cwd / "blocks.json").write_text(json.dumps(blocks))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", RUNNER, str(cwd / "blocks.json")], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_result_the_page_states_wrongly_fails_with_its_page_and_line(tmp_path):
    code = "x = [1, 2]\nlen(x)      # 2\nsum(x)  # 3 (the total)\nx[0]    # 5\n"
    result = _run([("docs/page.md", 10, code)], tmp_path)
    assert result.returncode != 0 and "docs/page.md:13: the page says 5, the code gives 1" in result.stderr, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_every_python_block_of_the_page_runs(page, tmp_path):
    blocks, shortened = [], set()
    for p, line, code, why in BLOCKS:
        if p == page and why is None:
            for where, said, runs in SHORTER:
                if where == page and said in code:
                    code, _ = code.replace(said, runs), shortened.add(said)
            blocks.append((page, line, code))
    missing = [said for where, said, _ in SHORTER if where == page and said not in shortened]
    assert not missing, f"{page} no longer says {missing}: update SHORTER"
    given = textwrap.dedent(GIVEN.get(page, ""))
    blocks.insert(0, (f"{page} (what the reader holds: tests/test_docs_python.py GIVEN)", 1, given))
    result = _run(blocks, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
