"""The package's layers, read from its imports (as tests/test_lint.py runs ruff): no import cycle between packages
or between modules, no private name taken from another module, and the leaf packages never reach up to the config,
the assembly or the entry points."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "grpoplus"
LEAVES = ("core", "algo", "learner", "rollout", "rewards", "envs", "models", "tasks", "data", "metrics", "teacher", "sft")
UPPER = ("config", "plan", "assemble", "loop", "entry", "dryrun", "selftest", "lab")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def imports(path: Path, top_level_only: bool) -> list[tuple[str, str, int]]:
    """``(module, imported name or "", line)`` of every ``grpoplus`` import in ``path`` (relative ones resolved)."""
    tree = ast.parse(path.read_text())
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                out.append((submodule, "", node.lineno) if submodule in MODULES else (module, alias.name, node.lineno))
    return [(m, name, line) for m, name, line in out if m == "grpoplus" or m.startswith("grpoplus.")]


def unit(module: str) -> str:
    """A module's package below grpoplus (``grpoplus.learner.update`` -> ``learner``), or the top-level module."""
    return module.split(".")[1] if module.count(".") else module


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


ROOT_NAMES = {target.id for node in ast.parse((ROOT / "__init__.py").read_text()).body if isinstance(node, ast.Assign)
              for target in node.targets if isinstance(target, ast.Name)}
"""The names grpoplus/__init__.py sets itself (``__version__``): any module of the package is imported after it, so
reading one of them imports nothing; its lazily imported names (``Trainer``: grpoplus.entry.api) do."""


def test_no_two_packages_import_each_other():
    edges: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        for target, name, _ in imports(path, top_level_only=False):  # imports inside functions count too
            if unit(target) != unit(module) and not (target == "grpoplus" and name in ROOT_NAMES):
                edges.setdefault(unit(module), set()).add(unit(target))
    assert cycles(edges) == []


def test_no_module_level_import_cycle():
    edges = {module: {t for t, _, _ in imports(path, top_level_only=True) if t in MODULES and t != module}
             for module, path in MODULES.items()}
    for module in MODULES:  # importing a module runs its packages' __init__ first
        parent = module.rpartition(".")[0]
        if parent and parent != "grpoplus":
            edges[module].add(parent)
    assert cycles({m: {t for t in ts if not m.startswith(t + ".")} for m, ts in edges.items()}) == []


def test_no_private_name_is_imported_from_another_module():
    private = [f"{module_name(path)}:{line} imports {target}.{name}" for path in MODULES.values()
               for target, name, line in imports(path, top_level_only=False)
               if name.startswith("_") and not name.startswith("__")]
    assert private == []


@pytest.mark.parametrize("leaf", LEAVES)
def test_a_leaf_package_never_imports_the_layers_above_it(leaf):
    reached = sorted({f"{module_name(p)} -> {t}" for p in (ROOT / leaf).rglob("*.py")
                      for t, _, _ in imports(p, top_level_only=False) if unit(t) in UPPER})
    assert reached == []


def test_the_shared_core_imports_no_other_package_nor_torch():
    # grpoplus.core is what every package may import (the registry, the run directory, ...): it stands on the standard
    # library alone, so the metrics reader and the config stay free of torch and no package it serves is below it
    reached = sorted({f"{module_name(p)} -> {t}" for p in (ROOT / "core").rglob("*.py")
                      for t, _, _ in imports(p, top_level_only=False) if unit(t) != "core"})
    heavy = sorted(f"{module_name(p)} -> {name}" for p in (ROOT / "core").rglob("*.py")
                   for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))
                   for name in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])
                   if name.split(".")[0] in ("torch", "transformers", "numpy"))
    assert reached == [] and heavy == []


DRY_RUN_FACTORIES = {"grpoplus.assemble.data"}
"""The one part of the assembly the dry run uses: the data factory (it loads no weight), so that the prompts it
measures are the run's own, fitted to the model's context by the run's own rule."""


def test_the_dry_run_never_imports_the_assembly():
    # it describes the run from the same plan the assembly builds from (grpoplus.plan), never from the assembly itself
    reached = sorted({f"{module_name(p)} -> {t}" for p in (ROOT / "dryrun").rglob("*.py")
                      for t, _, _ in imports(p, top_level_only=False)
                      if unit(t) == "assemble" and t not in DRY_RUN_FACTORIES})
    assert reached == []


def test_the_dry_run_reads_the_plan_alone():
    """grpoplus/dryrun/ builds the config (as a run does, to fail the same way) and resolves it; past that it renders
    the plan: no Config, no config section read, no setting decided again."""
    taken = sorted(f"{module_name(p)}: {name}" for p in (ROOT / "dryrun").rglob("*.py")
                   for m, name, _ in imports(p, top_level_only=False)
                   if m.startswith("grpoplus.config") and name not in ("build_config", "resumed_config"))
    reads = sorted(f"{module_name(p)}:{n}: {m.group(0)}" for p in (ROOT / "dryrun").rglob("*.py")
                   for n, line in enumerate(p.read_text().splitlines(), 1)
                   for m in re.finditer(r"\bConfig\b|\bcfg\.|\bplan\.config\b|\.startswith\(\"cuda", line))
    assert taken == [] and reads == []


def plan_config_reads(source: str) -> list[int]:
    """The lines of ``source`` that read a plan's config: ``plan.config``, ``self.plan.config``, ``getattr(plan,
    "config")`` (any name ending in ``plan``)."""
    def a_plan(node) -> bool:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        return name.lower().endswith("plan")

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "config" and a_plan(node.value):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) > 1
              and a_plan(node.args[0]) and getattr(node.args[1], "value", None) == "config"):
            lines.append(node.lineno)
    return sorted(lines)


def test_nothing_past_the_plan_reads_the_config_it_carries():
    # RunPlan.config is kept to be recorded with the run (RunPlan.record); every part of the run, the task and its
    # data included, is built from its own part of the plan
    reads = sorted(f"{name}:{line}" for name, path in MODULES.items() if unit(name) != "plan"
                   for line in plan_config_reads(path.read_text()))
    assert reads == []
    assert plan_config_reads("cfg = plan.config\nx = self.plan.config.data\ny = getattr(run_plan, 'config')\n"
                             "model.config\ngetattr(model, 'config', None)\n") == [1, 2, 3]


@pytest.mark.parametrize("module", ["grpoplus.assemble.factories", "grpoplus.assemble.data"])
def test_the_factories_read_no_config(module):
    # the task and its data are made from plan.data (grpoplus.plan.data.DataPlan), every other component from its
    # part of the plan: no factory takes a Config nor reads an attribute named config (a model's is read by getattr)
    path = MODULES[module]
    attributes = [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)
                  and n.attr == "config"]
    configs = [f"{m}.{name}" for m, name, _ in imports(path, top_level_only=False) if m.startswith("grpoplus.config")]
    assert attributes == [] and configs == []


def test_past_the_edge_nothing_builds_a_config():
    # a config is built and validated once, at the edge (the CLI, the Python API, the dry run, the lab, the self-test);
    # the assembly, the trainer and every role's process work from the plan (grpoplus.plan.resolve) it resolves to
    edge = ("config", "entry", "dryrun", "lab", "selftest")
    reached = sorted({f"{module_name(p)} -> {name}" for p in ROOT.rglob("*.py") if unit(module_name(p)) not in edge
                      for m, name, _ in imports(p, top_level_only=False)
                      if m.startswith("grpoplus.config") and name in ("build_config", "resumed_config")})
    assert reached == []


def test_the_plan_loads_and_starts_nothing():
    starters = ("assemble", "distributed", "rollout", "learner", "teacher", "loop")
    reached = []
    for path in (ROOT / "plan").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        reached += [f"{module_name(path)} -> {name}" for name in names
                    if name.split(".")[0] in ("ray", "vllm", "subprocess", "multiprocessing", "transformers")
                    or name.startswith("torch.distributed") or (name.startswith("grpoplus.") and unit(name) in starters)]
    assert reached == []


def test_the_checks_find_what_they_look_for():
    # each rule on a known case: the relative import resolution, a cycle, a private name
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    found = {(m, name) for m, name, _ in imports(ROOT / "metrics" / "checks" / "offpolicy.py", top_level_only=True)}
    assert {("grpoplus.metrics.checks.base", "CHECKS"), ("grpoplus.metrics.series", "Trace")} <= found
    assert unit("grpoplus.learner.update") == "learner" and unit("grpoplus.loop.driver") == "loop"


def test_the_layout_page_names_every_package_and_module_of_the_tree():
    # docs/concepts/layout.md is the map a contributor reads first: every package and top-level module is on it, and
    # nothing on it is gone from the tree, nor a module it names from its package
    page = (ROOT.parent / "docs" / "concepts" / "layout.md").read_text()
    tree = page.split("```")[1]
    named = set(re.findall(r"^  (\w+/|\w+\.py)", tree, re.M)) | set(re.findall(r"\b(\w+\.py)\b", tree))
    packages = {f"{p.name}/" for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.name for p in ROOT.glob("*.py") if p.name not in ("__init__.py",)}
    assert sorted((packages | modules) - named) == []
    gone = sorted(n for n in re.findall(r"^  (\w+/|\w+\.py)", tree, re.M) if n not in packages | modules)
    assert gone == []
    stale, package = [], None  # and every module a package's lines name is in that package
    for line in tree.split("\ntests/")[0].splitlines():
        if re.match(r"^  \w+/", line) or re.match(r"^  \w+\.py", line):
            package = line.split()[0].rstrip("/") if line.split()[0].endswith("/") else None
        base = ROOT / package if package else ROOT
        stale += [f"{package or 'grpoplus'}: {name}" for name in re.findall(r"\b([a-z]\w*\.py)\b", line)
                  if not any(base.rglob(name))]
    assert stale == []


def positional_plans() -> list[str]:
    """The dataclasses named ``*Plan`` (the records handed between stages) that take arguments by position."""
    found = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ClassDef) and node.name.endswith("Plan")):
                continue
            for deco in node.decorator_list:
                call = deco if isinstance(deco, ast.Call) else None
                func = call.func if call else deco
                if getattr(func, "id", getattr(func, "attr", None)) != "dataclass":
                    continue
                kw_only = any(k.arg == "kw_only" and getattr(k.value, "value", False) is True
                              for k in (call.keywords if call else []))
                if not kw_only:
                    found.append(f"{name}.{node.name}")
    return found


def test_every_plan_is_built_by_keyword():
    """A plan of a dozen fields built by position breaks silently when a field is added; kw_only refuses that."""
    assert positional_plans() == []


PATCHERS = {"grpoplus.models.cpu_matmul:use_cpu_matmul", "grpoplus.models.cpu_matmul:reset",
            "grpoplus.models.attention:use_cpu_gqa", "grpoplus.learner.precision:set_tf32"}
"""The functions that change a library's behaviour for the whole process, each installed by a run's process setup."""
RESTORES = {"grpoplus.rollout.vllm_engine:VLLMEngine.__init__", "grpoplus.rollout.vllm_engine:classes_kept",
            "grpoplus.models.load:_without_gguf_bar"}
"""Where grpoplus puts back what vLLM's start replaced process-wide (torch.set_num_threads, module classes'
``__call__``), and the one patch that lasts a block and is undone after it (transformers' GGUF progress bar)."""


def module_patches() -> set[str]:
    """``module:function`` of every assignment to an attribute of an imported module (``torch.nn.Linear.forward = f``)."""
    found = set()
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                    for a in n.names if not (isinstance(n, ast.ImportFrom) and (n.module or "").startswith("grpoplus"))}
        found |= {f"{name}:{where}" for where in _patching_scopes(tree, "", imported)}
    return found


def _patching_scopes(node: ast.AST, where: str, imported: set[str]) -> set[str]:
    """The dotted function or class names (``<module>`` at the top) under ``node`` that assign to an attribute of a
    name in ``imported``."""
    found = set()
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Assign):
            for target in child.targets:
                root = target
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(target, ast.Attribute) and isinstance(root, ast.Name) and root.id in imported:
                    found.add(where or "<module>")
        inner = (f"{where}.{child.name}" if where else child.name) if isinstance(
            child, (ast.FunctionDef, ast.ClassDef)) else where
        found |= _patching_scopes(child, inner, imported)
    return found


def test_only_the_process_setup_patches_a_library():
    """A library user's own models behave as without grpoplus: nothing is patched on import or on loading a model;
    the patches are functions a run's process setup (assemble.factories.build_process) calls, each with a reset."""
    assert module_patches() - RESTORES == PATCHERS
    callers = sorted(f"{name}:{node.lineno}" for name, path in MODULES.items() for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
                     in {"use_cpu_matmul", "use_cpu_gqa"})
    assert [c.split(":")[0] for c in callers] == ["grpoplus.assemble.factories"] * 2


def test_the_drivers_loop_runs_from_its_plan():
    """grpoplus/loop/ reads no config setting: the loop runs from plan.loop (and the plan's other parts); a Config is
    taken only by the entry functions that resolve it (train, evaluate_only, check_only) and saved as given."""
    reads = sorted(f"{module_name(p)}:{n}: {m.group(0)}" for p in (ROOT / "loop").rglob("*.py")
                   for n, line in enumerate(p.read_text().splitlines(), 1)
                   for m in re.finditer(r"\b(?:cfg|config)\.(?:run|data|rollout|learner|algo|sft|health|ray)\b", line))
    assert reads == []
