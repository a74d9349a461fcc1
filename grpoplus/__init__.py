"""grpoplus: reinforcement-learning post-training of language models with verifiable rewards.

    from grpoplus import Trainer
    result = Trainer(model="smollm2", train_dataset=rows, reward_funcs=["math"], max_steps=50).train()

(:mod:`grpoplus.entry.api`; imported on first use, so ``import grpoplus`` and the command line stay light.)
"""

__version__ = "0.1.0"

__all__ = ["SFTTrainer", "Trainer", "TrainResult", "train", "__version__"]


_LAZY = ("SFTTrainer", "Trainer", "TrainResult", "train")


def __getattr__(name: str):
    if name in _LAZY:
        from grpoplus.entry import api

        return getattr(api, name)
    raise AttributeError(f"module 'grpoplus' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names and the lazily imported ones (tab completion in a notebook lists ``Trainer``)."""
    return sorted({*globals(), *_LAZY})
