"""An LLM judge: a model behind an OpenAI-compatible chat endpoint scores each (prompt, response) on a rubric.

Spec: ``judge[:weight]:url=http://127.0.0.1:8000/v1[,model=...,choices=true,...]`` (the parameters of
:func:`judge_reward`); a long rubric is easier in the dict form of a YAML config
(``{name: judge, weight: 0.5, kwargs: {url: ..., rubric: ...}}``), since a string spec ends a value at a comma.

What a long run needs from a judge that lives on another server:

- a batch is judged concurrently (``concurrency`` requests in flight) and ends by a deadline, so a server that stops
  answering costs seconds, not the run;
- a sample whose request fails after its retries, times out or answers without a score in range is not scored
  (:class:`~grpoplus.rewards.events.Unscored`: left out of its group and of the loss, not scored 0) and is
  counted (``judge/errors``, ``judge/timeouts``, ``judge/unparseable``: part of ``reward/errors`` and
  ``reward/timeouts``); if *every* sample of a batch fails, the server is down or the setup is wrong, and a
  :class:`~grpoplus.rewards.pipeline.RewardError` names the url and the first failure;
- a (prompt, response) pair judged once is not sent again (an in-process cache, ``judge/cache_hits``): a group's
  identical answers, or an evaluation that sees the same answers again, cost one request.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

from grpoplus.core.endpoints import EndpointError, api_key, check_url, request_bound, request_json, run_batch, served_model
from grpoplus.rewards.events import Unscored, count_event
from grpoplus.rewards.pipeline import RewardError
from grpoplus.rewards.registry import REWARDS

logger = logging.getLogger("grpoplus.rewards")

DEFAULT_RUBRIC = ("Rate the response to the prompt for correctness and helpfulness, as an integer from {min} to {max}: "
                  "{max} for a correct, complete and clear answer, {min} for a wrong, irrelevant or empty one.")
"""The rubric when none is given; ``{min}`` and ``{max}`` are filled with the score range."""

CACHE_ENTRIES = 65536
"""Scores the cache keeps (least recently used dropped first), so a long run's memory stays bounded."""


class JudgeConfigError(RewardError, ValueError):
    """A judge parameter no sample can work with (a missing url, a server listing several models): stops the run."""


class _Unparseable(Exception):
    """The judge answered without a score in range."""


_SCORE = re.compile(r"score\s*[:=]\s*((?:(?<![\w.])-)?\d+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER = re.compile(r"(?:(?<![\w.])-)?\d+(?:\.\d+)?")
_SCALE = re.compile(r"\s*/\s*\d+(?:\.\d+)?")


def parse_score(reply: str, min_score: float, max_score: float) -> float | None:
    """The score in ``reply`` normalised to [0, 1] as (s - min) / (max - min); None without one in range.

    The score is the number after the last "Score:", else the last number of the reply; in "n/10" it is n.

    >>> parse_score("Clear and right. Score: 8", 0, 10), parse_score("7", 0, 10), parse_score("6.5/10", 0, 10)
    (0.8, 0.7, 0.65)
    >>> parse_score("Score: 12", 0, 10) is None, parse_score("I think it's good", 0, 10) is None
    (True, True)
    """
    reply = _SCALE.sub("", reply)  # "6.5/10": the score is the number before the scale
    found = _SCORE.findall(reply) or _NUMBER.findall(reply)
    if not found:
        return None
    score = float(found[-1])
    if not min_score <= score <= max_score:
        return None
    return (score - min_score) / (max_score - min_score)


class _ScoreCache:
    """Normalised scores by (url, model, rubric, prompt, response, min, max); thread-safe, least recently used
    dropped past ``CACHE_ENTRIES``."""

    def __init__(self, entries: int = CACHE_ENTRIES):
        self.entries = entries
        self._scores: OrderedDict[tuple, float] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> float | None:
        with self._lock:
            if key not in self._scores:
                return None
            self._scores.move_to_end(key)
            return self._scores[key]

    def put(self, key: tuple, score: float) -> None:
        with self._lock:
            self._scores[key] = score
            self._scores.move_to_end(key)
            while len(self._scores) > self.entries:
                self._scores.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._scores.clear()


CACHE = _ScoreCache()


@dataclass(frozen=True)
class _Judge:
    """One configured judge: builds the request for a pair and reads the score out of the answer."""

    url: str
    model: str
    rubric: str
    min_score: float
    max_score: float
    timeout_s: float
    retries: int
    max_tokens: int
    temperature: float
    key: str | None
    choices: bool

    def message(self, prompt: str, response: str) -> str:
        if self.choices:
            answer = f"Answer with the score alone: an integer from {self.min_score:g} to {self.max_score:g}."
        else:
            answer = f'End your answer with a line "Score: <n>", <n> a number from {self.min_score:g} to {self.max_score:g}.'
        return f"{self.rubric}\n\n[Prompt]\n{prompt}\n\n[Response]\n{response}\n\n{answer}"

    def body(self, prompt: str, response: str) -> dict:
        body = {"model": self.model, "messages": [{"role": "user", "content": self.message(prompt, response)}],
                "max_tokens": self.max_tokens, "temperature": self.temperature}
        if self.choices:  # vLLM's structured outputs: the answer is exactly one of these
            body["structured_outputs"] = {"choice": [str(s) for s in range(int(self.min_score), int(self.max_score) + 1)]}
        return body

    def score(self, pair: tuple[str, str]) -> float:
        answer = request_json(f"{self.url}/chat/completions", self.body(*pair), timeout_s=self.timeout_s,
                              retries=self.retries, key=self.key)
        try:
            reply = answer["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise EndpointError(f"the answer has no choices[0].message.content: {str(answer)[:120]}") from None
        score = parse_score(reply, self.min_score, self.max_score)
        if score is None:
            raise _Unparseable(f"no score from {self.min_score:g} to {self.max_score:g} in the reply {reply[:80]!r}")
        return score

    def key_of(self, pair: tuple[str, str]) -> tuple:
        return (self.url, self.model, self.rubric, pair[0], pair[1], self.min_score, self.max_score)


@REWARDS.register("judge")
def judge_reward(prompts: list[str], completions: list[str], *, url: str | None = None, model: str | None = None,
                 rubric: str | None = None, min_score: float = 0, max_score: float = 10, concurrency: int = 8,
                 timeout_s: float = 30.0, retries: int = 2, max_tokens: int = 16, temperature: float = 0.0,
                 api_key_env: str = "OPENAI_API_KEY", choices: bool = False, cache: bool = True) -> list[float]:
    """The judge's score of each completion, normalised to [0, 1] as (s - min_score) / (max_score - min_score).

    ``url``: the server's base URL (``http://host:8000/v1``). ``model``: default, the one model it lists.
    ``rubric``: the instructions (default :data:`DEFAULT_RUBRIC`); the message holds the rubric, the prompt, the
    response and the answer format (``Score: <n>``; with ``choices``, the score alone). ``choices``: constrain the
    answer to the integer scores with vLLM's structured outputs (``structured_outputs={"choice": [...]}``, the
    server must support it). A request is
    tried ``retries`` more times on connection errors, timeouts (``timeout_s`` each), 429 and 5xx, with backoff;
    ``concurrency`` requests are in flight at once. The key, if any, is read from the environment variable
    ``api_key_env``. ``cache``: a pair judged before (or twice in the batch) is not sent again. Failures: module
    docstring.
    """
    judge = _configure(url, model, rubric, min_score, max_score, concurrency, timeout_s, retries, max_tokens,
                       temperature, api_key_env, choices)
    pairs = list(zip(prompts, completions))
    scores = [CACHE.get(judge.key_of(p)) if cache else None for p in pairs]
    todo, slots = _requests(pairs, scores, once_each=cache)
    if len(todo) < len(pairs):
        count_event("judge/cache_hits", len(pairs) - len(todo))
    outcomes = run_batch(judge.score, todo, concurrency=concurrency, per_item_s=request_bound(timeout_s, retries),
                         name="grpoplus-judge")
    _account(judge, outcomes, every_sample=all(s is None for s in scores))
    for pair, (status, value) in zip(todo, outcomes):
        if cache and status == "ok":
            CACHE.put(judge.key_of(pair), value)
    judged = [value if status == "ok" else Unscored(_FAILURE_KIND[_failure(status, value)[0]])
              for status, value in outcomes]
    return [s if s is not None else judged[slot] for s, slot in zip(scores, slots)]


def _requests(pairs: list, scores: list, once_each: bool) -> tuple[list, list]:
    """The pairs to send and, for each sample, the index of its request (None: scored already). With
    ``once_each`` a pair repeated in the batch is sent once."""
    todo: list = []
    index: dict = {}
    slots: list[int | None] = []
    for pair, score in zip(pairs, scores):
        if score is not None:
            slots.append(None)
        elif once_each and pair in index:
            slots.append(index[pair])
        else:
            index[pair] = len(todo)
            slots.append(len(todo))
            todo.append(pair)
    return todo, slots


def _account(judge: _Judge, outcomes: list, every_sample: bool) -> None:
    """Count the failed requests by kind; a RewardError when they are the whole batch (nothing was cached)."""
    failures = [_failure(status, value) for status, value in outcomes if status != "ok"]
    if not failures:
        return
    if every_sample and len(failures) == len(outcomes):
        raise RewardError(f"judge at {judge.url}: all {len(outcomes)} requests failed, the first: {failures[0][1]}")
    for event in sorted({kind for kind, _ in failures}):
        count_event(event, sum(kind == event for kind, _ in failures))
    logger.warning("judge at %s: %d of %d requests failed (left unscored), the first: %s", judge.url, len(failures),
                   len(outcomes), failures[0][1])


_FAILURE_KIND = {"judge/timeouts": "timeout", "judge/unparseable": "error", "judge/errors": "error"}


def _failure(status: str, value: object) -> tuple[str, str]:
    """(event, reason) of one failed request."""
    if status == "timeout" or (isinstance(value, EndpointError) and value.timeout):
        return "judge/timeouts", str(value) if value is not None else "no answer by the batch's deadline"
    if isinstance(value, _Unparseable):
        return "judge/unparseable", str(value)
    return "judge/errors", str(value) if isinstance(value, EndpointError) else f"{type(value).__name__}: {value}"


def _configure(url, model, rubric, min_score, max_score, concurrency, timeout_s, retries, max_tokens, temperature,
               api_key_env, choices) -> _Judge:
    """Check the parameters and find the model: a :class:`JudgeConfigError` (or a RewardError for a server that
    cannot be asked) before any sample is sent."""
    base = check_judge_options(url, min_score, max_score, concurrency, timeout_s, retries, rubric, choices)
    key = api_key(api_key_env)
    if model is None:
        model = _served_model(base, timeout_s, retries, key)
    text = DEFAULT_RUBRIC.format(min=f"{min_score:g}", max=f"{max_score:g}") if rubric is None else rubric
    return _Judge(base, str(model), text, float(min_score), float(max_score), float(timeout_s), int(retries),
                  int(max_tokens), float(temperature), key, bool(choices))


def check_judge_options(url, min_score, max_score, concurrency, timeout_s, retries, rubric, choices, **_) -> str:
    """The judge's parameters no sample can work with, refused without asking the server (a
    :class:`JudgeConfigError`); the base URL. The judge asks it, and so does the reward pipeline as it parses the
    specs (``judge_reward.check_options``: the config rule ``rewards``)."""
    try:
        base = check_url(url, "reward 'judge'")
    except ValueError as err:
        raise JudgeConfigError(str(err)) from None
    if not max_score > min_score:
        raise JudgeConfigError(f"reward 'judge': max_score={max_score} must be above min_score={min_score}")
    if choices and not (float(min_score).is_integer() and float(max_score).is_integer()):
        raise JudgeConfigError(f"reward 'judge': choices=true takes integer scores, got min_score={min_score}, "
                               f"max_score={max_score}")
    if concurrency < 1 or timeout_s <= 0 or retries < 0:
        raise JudgeConfigError(f"reward 'judge': needs concurrency >= 1, timeout_s > 0 and retries >= 0, got "
                               f"{concurrency}, {timeout_s}, {retries}")
    if rubric is not None and not isinstance(rubric, str):
        raise JudgeConfigError(f"reward 'judge': rubric must be text, got {type(rubric).__name__} (in a string spec, "
                               "a ': ' inside a value reads as a mapping): give it in a YAML config's dict form")
    return base


judge_reward.check_options = check_judge_options


def _served_model(base: str, timeout_s: float, retries: int, key: str | None) -> str:
    try:
        return served_model(base, timeout_s=timeout_s, retries=retries, key=key, who="reward 'judge'")
    except ValueError as err:
        raise JudgeConfigError(str(err)) from None
    except EndpointError as err:
        raise RewardError(f"judge at {base}: {err}") from None


judge_reward.in_process = True  # a batch is judged concurrently here; a pool worker would send one sample per call
