"""vLLM's OpenAI-compatible server on loopback, for the tests of what talks to a served model (the LLM judge, the
endpoint teacher): the nano model (seed 0) with room for a judge's prompt, started once and stopped for sure.

The server runs with the CPU settings of the project's colocated vLLM engine (float32, eager, a 1 GiB KV cache)
plus a plain chat template (the character tokenizer has none) and one unbound OpenMP thread (the machine is shared).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, NamedTuple

from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer

CONTEXT = 2048
"""Positions the served model takes: a judge's message (rubric, prompt, response) is longer than the nano model's
default 256 characters, and the model's rotary positions extend to any length."""
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


class Server(NamedTuple):
    url: str  # base URL, http://127.0.0.1:PORT/v1
    model_dir: str  # the served model, also its name on the server
    startup_s: float  # from the process start to the first healthy answer


def save_served_model(path: Path) -> str:
    """The nano model (seed 0) with :data:`CONTEXT` positions, and its tokenizer, saved in ``path``."""
    tok = char_tokenizer()
    tiny_model(tok, size="nano", seed=0, max_position_embeddings=CONTEXT).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def vllm_server(workdir: Path, startup_timeout_s: float = 240.0) -> Iterator[Server]:
    """Start the server, wait for ``/health`` (a RuntimeError with the log's tail past ``startup_timeout_s`` or if
    the server exits), yield it, and stop its whole process group at the end."""
    model_dir = save_served_model(workdir / "model")
    template = workdir / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    log = workdir / "server.log"
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--host", "127.0.0.1",
               "--port", str(port), "--dtype", "float32", "--max-model-len", str(CONTEXT), "--enforce-eager",
               "--kv-cache-memory-bytes", str(1 << 30), "--chat-template", str(template), "--seed", "0"]
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND="nobind")
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        while not _healthy(f"http://127.0.0.1:{port}/health"):
            if proc.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with {proc.returncode}:\n{_tail(log)}")
            if time.monotonic() - start > startup_timeout_s:
                raise RuntimeError(f"the vLLM server was not healthy within {startup_timeout_s:.0f} s:\n{_tail(log)}")
            time.sleep(0.5)
        yield Server(f"http://127.0.0.1:{port}/v1", model_dir, time.monotonic() - start)
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (its engine core is a child process), then SIGKILL to what is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)
