"""JSON requests to an OpenAI-compatible server (vLLM, SGLang, a hosted API), on the standard library alone.

The LLM judge and the endpoint teacher need the same three things from a remote server in a long run: a request
is retried on what passes (connection errors, timeouts, HTTP 429 and 5xx) with exponential backoff and jitter, and
refused at once on what will not (any other 4xx); a batch of requests runs on a few threads and ends by a deadline,
whatever the server does; and every failure reads as one line (:class:`EndpointError`). The form of the other
address a run may be given, a Ray cluster's (:func:`cluster_address`), is checked here too.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import math
import os
import random
import threading
import time
import urllib.error
import urllib.request
from typing import Callable

BACKOFF_S = 0.5
"""The first retry's delay; each later one doubles, times a jitter in [1, 1.5) (clients that failed together do not
retry together)."""


class EndpointError(RuntimeError):
    """A request that failed for good, in one line; ``timeout`` tells a server that did not answer in time from one
    that answered wrong or could not be reached."""

    def __init__(self, message: str, *, timeout: bool = False, retryable: bool = False):
        super().__init__(message)
        self.timeout = timeout
        self.retryable = retryable


def api_key(env_name: str | None) -> str | None:
    """The key in the environment variable ``env_name``; None (no auth header) when it is unset or empty."""
    return (os.environ.get(env_name) or None) if env_name else None


def check_url(url: object, who: str) -> str:
    """``url`` without a trailing slash; a ValueError when it is missing or not http(s)."""
    if not url or not isinstance(url, str):
        raise ValueError(f"{who} needs url=, the server's base URL (e.g. url=http://127.0.0.1:8000/v1)")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{who}: url={url!r} must start with http:// or https:// (e.g. http://127.0.0.1:8000/v1)")
    return url.rstrip("/")


def cluster_address(address: str | None) -> tuple[str, int] | None:
    """``ray.address`` as the ``(host, port)`` to join, or None (unset: start a local Ray instance; ``auto``: the
    cluster Ray finds on this node); any other form is a ValueError. The one check of its form, for the cluster
    (:func:`grpoplus.distributed.ray_cluster.probe`) and the config rule ``scale``."""
    if address in (None, "auto"):
        return None
    host, _, port = str(address).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"ray.address={address!r} is not 'auto' or host:port (e.g. 10.0.0.1:6379); leave it unset to "
                         "start a local Ray instance")
    return host, int(port)


def request_bound(timeout_s: float, retries: int) -> float:
    """The longest one request may take with its retries: every try times out, every backoff at its longest."""
    return timeout_s * (retries + 1) + BACKOFF_S * 1.5 * (2**retries - 1)


def request_json(url: str, body: dict | None = None, *, timeout_s: float, retries: int, key: str | None = None) -> dict:
    """GET ``url`` (``body`` None) or POST ``body`` as JSON; the decoded answer, else an :class:`EndpointError`
    once the retries are spent (or at once for an answer a retry cannot change)."""
    for attempt in range(retries + 1):
        try:
            return _request_once(url, body, timeout_s, key)
        except EndpointError as err:
            if not err.retryable or attempt == retries:
                raise
            time.sleep(BACKOFF_S * 2**attempt * (1 + random.random() / 2))
    raise AssertionError("unreachable")


def _request_once(url: str, body: dict | None, timeout_s: float, key: str | None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=data, headers=headers, method="GET" if data is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            raw = answer.read()
    except urllib.error.HTTPError as err:
        retryable = err.code == 429 or err.code >= 500
        raise EndpointError(f"HTTP {err.code}: {_server_message(err)}", retryable=retryable) from None
    except urllib.error.URLError as err:
        raise _network_error(err.reason, timeout_s) from None
    except (OSError, http.client.HTTPException) as err:  # a timeout or reset while reading the answer
        raise _network_error(err, timeout_s) from None
    try:
        return json.loads(raw)
    except ValueError:
        raise EndpointError(f"the answer is not JSON: {raw[:80]!r}") from None


def _network_error(reason: object, timeout_s: float) -> EndpointError:
    if isinstance(reason, TimeoutError):
        return EndpointError(f"no answer within {timeout_s:g} s", timeout=True, retryable=True)
    if isinstance(reason, ConnectionRefusedError):
        return EndpointError("connection refused; is the server running?", retryable=True)
    text = f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
    return EndpointError(one_line(text), retryable=True)


def _server_message(err: urllib.error.HTTPError) -> str:
    """The server's own reason: ``{"error": {"message": ...}}`` (OpenAI, vLLM), ``{"detail": ...}``, else the text."""
    try:
        text = err.read().decode(errors="replace")
    except OSError:
        return err.reason or ""
    try:
        answer = json.loads(text)
    except ValueError:
        return one_line(text) or str(err.reason)
    if isinstance(answer, dict):
        inner = answer.get("error")
        if isinstance(inner, dict):
            inner = inner.get("message")
        found = inner or answer.get("message") or answer.get("detail")
        if found:
            return one_line(str(found))
    return one_line(text)


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, cut at ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


_MODELS: dict[str, str] = {}
_MODELS_LOCK = threading.Lock()


def served_model(base_url: str, *, timeout_s: float, retries: int, key: str | None, who: str) -> str:
    """The one model the server at ``base_url`` lists (``GET /models``), remembered per URL. A ValueError asking
    for ``model=`` when it lists several or none; an EndpointError when it cannot be asked."""
    with _MODELS_LOCK:
        if base_url in _MODELS:
            return _MODELS[base_url]
    listing = request_json(f"{base_url}/models", timeout_s=timeout_s, retries=retries, key=key)
    data = listing.get("data") if isinstance(listing, dict) else None
    names = [m.get("id") for m in data or [] if isinstance(m, dict) and m.get("id")]
    if len(names) != 1:
        listed = f"lists {len(names)} models ({', '.join(names)})" if names else "lists no model"
        raise ValueError(f"{who}: the server at {base_url} {listed}; name the one to use with model=")
    with _MODELS_LOCK:
        _MODELS[base_url] = names[0]
    return names[0]


def run_batch(fn: Callable, items: list, *, concurrency: int, per_item_s: float, name: str) -> list[tuple[str, object]]:
    """``fn(item)`` for every item on at most ``concurrency`` threads, in order: ``("ok", result)``,
    ``("error", exception)``, or ``("timeout", None)`` for an item not done by the deadline (``per_item_s`` for each
    wave of ``concurrency`` items, plus a second), so a server that stops answering cannot hold the caller. A thread
    still waiting past the deadline ends on its own socket timeout; items not started by then are dropped."""
    if not items:
        return []
    workers = max(1, min(int(concurrency), len(items)))
    deadline_s = per_item_s * math.ceil(len(items) / workers) + 1.0
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
    futures = [pool.submit(fn, item) for item in items]
    done, _ = concurrent.futures.wait(futures, timeout=deadline_s)
    pool.shutdown(wait=False, cancel_futures=True)
    outcomes: list[tuple[str, object]] = []
    for future in futures:
        if future not in done:
            outcomes.append(("timeout", None))
        elif future.exception() is not None:
            outcomes.append(("error", future.exception()))
        else:
            outcomes.append(("ok", future.result()))
    return outcomes
