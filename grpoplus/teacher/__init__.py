"""On-policy distillation's teacher (ALGORITHMS.md section 11): a model in the learner's process
(:mod:`~grpoplus.teacher.local`) or an OpenAI-compatible server (:mod:`~grpoplus.teacher.endpoint`), each
scoring the tokens the student sampled."""

from grpoplus.teacher.load import check_vocabulary, is_endpoint, load_teacher

__all__ = ["check_vocabulary", "is_endpoint", "load_teacher"]
