"""grpoplus: reinforcement-learning post-training of language models with verifiable rewards."""

__version__ = "0.1.0"
