"""Data sets for RL: records of prompt, reference answer and extra fields."""

from grpoplus.data.chat import apply_chat_template
from grpoplus.data.loaders import ANSWER_FORMATS, LoadedData, load_records

__all__ = ["ANSWER_FORMATS", "LoadedData", "apply_chat_template", "load_records"]
