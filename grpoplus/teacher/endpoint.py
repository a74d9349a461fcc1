"""A teacher behind an OpenAI-compatible completions endpoint that returns prompt log-probs (vLLM's server).

The teacher must score the exact tokens the student sampled, so it is sent token ids, never text (no
re-tokenization): each row, prompt + response, goes as one ``prompt`` of ids with ``max_tokens=1`` and vLLM's
``prompt_logprobs=1``. vLLM answers, for every position after the first, the log-prob of the token there given the
ones before it, with its rank (1: the teacher's first choice) and the teacher's top token; the response positions
are the ones kept. These are the teacher's own distribution (temperature 1, the raw log-probs), as a local teacher's.

Every row is needed for the loss, so there is no partial success: a row that fails after its retries fails the
call, with one line naming the url and the cause.
"""

from __future__ import annotations

from grpoplus.core.endpoints import EndpointError, api_key, check_url, request_bound, request_json, run_batch, served_model


class EndpointTeacher:
    """The teacher served at ``url`` (``http://host:8000/v1``); ``model`` by default is the one it lists.

    ``concurrency`` rows are scored at once; each request waits ``timeout_s`` and is tried ``retries`` more times
    on connection errors, timeouts, 429 and 5xx; the key, if any, is read from the environment variable
    ``api_key_env``.
    """

    def __init__(self, url: str, model: str | None = None, *, timeout_s: float = 60.0, retries: int = 2,
                 concurrency: int = 8, api_key_env: str = "OPENAI_API_KEY"):
        self.url = check_url(url, "endpoint teacher")
        if timeout_s <= 0 or retries < 0 or concurrency < 1:
            raise ValueError(f"endpoint teacher: needs timeout_s > 0, retries >= 0 and concurrency >= 1, got "
                             f"{timeout_s}, {retries}, {concurrency}")
        self.timeout_s, self.retries, self.concurrency = float(timeout_s), int(retries), int(concurrency)
        self.key = api_key(api_key_env)
        self._model = model

    @property
    def model(self) -> str:
        """The served model's name, asked of the server the first time it is needed."""
        if self._model is None:
            try:
                self._model = served_model(self.url, timeout_s=self.timeout_s, retries=self.retries, key=self.key,
                                           who="endpoint teacher")
            except EndpointError as err:
                raise RuntimeError(f"teacher at {self.url}: {err}") from None
        return self._model

    def token_logprobs(self, prompt_ids: list[list[int]],
                       response_ids: list[list[int]]) -> tuple[list[list[float]], list[list[bool]]]:
        """For each row, the teacher's log-prob of each response token given the prompt and the response before
        it, and whether that token is the teacher's first choice. A RuntimeError naming the url when any row fails."""
        if len(prompt_ids) != len(response_ids):
            raise ValueError(f"endpoint teacher: {len(prompt_ids)} prompts for {len(response_ids)} responses")
        if any(not p for p, r in zip(prompt_ids, response_ids) if r):
            raise ValueError("endpoint teacher: a row with a response has an empty prompt; it needs one token at least")
        rows = [(list(map(int, p)), list(map(int, r))) for p, r in zip(prompt_ids, response_ids)]
        todo = [row for row in rows if row[1]]
        model = self.model if todo else ""
        outcomes = run_batch(lambda row: self._score_row(model, *row), todo, concurrency=self.concurrency,
                             per_item_s=request_bound(self.timeout_s, self.retries), name="grpoplus-teacher")
        for status, value in outcomes:
            if status == "timeout":
                raise RuntimeError(f"teacher at {self.url}: a row got no answer by the batch's deadline")
            if status == "error":
                raise RuntimeError(f"teacher at {self.url}: {value}") from (None if isinstance(value, EndpointError)
                                                                            else value)
        scored = iter(value for _, value in outcomes)
        results = [next(scored) if r else ([], []) for _, r in rows]
        return [logp for logp, _ in results], [top1 for _, top1 in results]

    def _score_row(self, model: str, prompt: list[int], response: list[int]) -> tuple[list[float], list[bool]]:
        body = {"model": model, "prompt": prompt + response, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 1}
        answer = request_json(f"{self.url}/completions", body, timeout_s=self.timeout_s, retries=self.retries,
                              key=self.key)
        entries = _prompt_logprobs(answer)
        if len(entries) != len(prompt) + len(response):
            raise EndpointError(f"the server returned {len(entries)} prompt log-probs for {len(prompt) + len(response)} "
                                "tokens")
        logp, top1 = [], []
        for token, entry in zip(response, entries[len(prompt):]):
            value, first = _token_entry(entry, token)
            logp.append(value)
            top1.append(first)
        return logp, top1


def _prompt_logprobs(answer: dict) -> list:
    try:
        entries = answer["choices"][0].get("prompt_logprobs")
    except (KeyError, IndexError, TypeError, AttributeError):
        entries = None
    if not isinstance(entries, list):
        raise EndpointError("the server returned no prompt_logprobs: the endpoint teacher needs a completions "
                            "endpoint that supports prompt_logprobs (vLLM's OpenAI server does)")
    return entries


def _token_entry(entry: dict | None, token: int) -> tuple[float, bool]:
    """(log-prob, first choice) of ``token`` in one position's ``{token_id: {logprob, rank, ...}}`` (JSON keys are
    strings); without a rank, first choice means no listed token is more likely."""
    if not isinstance(entry, dict):
        raise EndpointError(f"the server returned no log-prob at a response position (token {token})")
    found = entry.get(str(token), entry.get(token))
    if not isinstance(found, dict) or "logprob" not in found:
        raise EndpointError(f"the server's prompt log-probs miss the response token {token}")
    logprob = float(found["logprob"])
    rank = found.get("rank")
    if rank is not None:
        return logprob, int(rank) == 1
    return logprob, all(float(e.get("logprob", float("-inf"))) <= logprob for e in entry.values() if isinstance(e, dict))
