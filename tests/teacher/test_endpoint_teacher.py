"""The endpoint teacher: a vLLM server's prompt log-probs of a response equal the served model's own (transformers,
float32), and a server that cannot give them is one line naming the url."""

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpoplus.teacher.endpoint import EndpointTeacher

ROWS = [([1, 20, 21, 22], [5, 6]), ([1, 40], [60, 61, 62, 63, 64, 2]), ([1, 7, 8, 9, 10, 11, 12], [13])]
"""(prompt ids, response ids) of different lengths; 1 is <bos>, 2 is <eos>."""


def _reference(model_dir: str, rows) -> tuple[list[list[float]], list[list[bool]]]:
    """The model's log-prob of each response token from the logits at the position before it, and the argmax check."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    logps, top1 = [], []
    for prompt, response in rows:
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            log_p = model(ids).logits[0].float().log_softmax(-1)
        before = log_p[len(prompt) - 1: len(prompt) + len(response) - 1]  # positions predicting each response token
        tokens = torch.tensor(response)
        logps.append(before.gather(-1, tokens[:, None]).squeeze(-1).tolist())
        top1.append((before.argmax(-1) == tokens).tolist())
    return logps, top1


def test_the_served_log_probs_are_the_models_own(vllm_server):
    teacher = EndpointTeacher(vllm_server.url, concurrency=2)
    prompts, responses = [p for p, _ in ROWS], [r for _, r in ROWS]
    logps, top1 = teacher.token_logprobs(prompts, responses)
    want_logps, want_top1 = _reference(vllm_server.model_dir, ROWS)
    assert [len(row) for row in logps] == [len(r) for r in responses] == [len(row) for row in top1]
    for got, want in zip(logps, want_logps):
        assert got == pytest.approx(want, abs=1e-3)
    assert top1 == want_top1
    # The nano model's first choice: its argmax token after each prefix, which the flag must then call top-1.
    prompt = ROWS[0][0]
    model = AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        best = int(model(torch.tensor([prompt])).logits[0, -1].argmax())
    assert teacher.token_logprobs([prompt], [[best]])[1] == [[True]]


def test_an_empty_response_needs_no_request():
    teacher = EndpointTeacher("http://127.0.0.1:9/v1", model="m")
    assert teacher.token_logprobs([[1, 2]], [[]]) == ([[]], [[]])


class _NoPromptLogprobs(BaseHTTPRequestHandler):
    """A completions server that ignores prompt_logprobs (as OpenAI's own API does)."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        data = json.dumps({"choices": [{"text": "x", "logprobs": None}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextmanager
def _server(handler):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_without_prompt_logprobs_is_refused_in_one_line():
    with _server(_NoPromptLogprobs) as url:
        with pytest.raises(RuntimeError) as raised:
            EndpointTeacher(url, model="m").token_logprobs([[1, 5]], [[6, 7]])
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"teacher at {url}: ")
    assert "needs a completions endpoint that supports prompt_logprobs" in message


def test_no_server_is_one_line_naming_the_url():
    with _server(_NoPromptLogprobs) as url:
        pass  # its port is closed now
    with pytest.raises(RuntimeError) as raised:
        EndpointTeacher(url, retries=0).token_logprobs([[1, 5]], [[6]])
    assert str(raised.value) == f"teacher at {url}: connection refused; is the server running?"


def test_a_served_teacher_scores_rollouts_as_the_same_model_in_process(vllm_server):
    from grpoplus.containers import SamplingParams
    from grpoplus.models.tokenizer import char_tokenizer
    from grpoplus.rollout.hf import HFEngine
    from grpoplus.teacher.load import ServedTeacher, load_teacher
    from grpoplus.teacher.local import LocalTeacher

    tok = char_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, dtype=torch.float32).eval()
    prompts = [tok(text, add_special_tokens=False).input_ids for text in ("12+3=", "4=")]
    rollouts = HFEngine(model, tok).generate(prompts, SamplingParams(n=3, max_new_tokens=8),
                                             generator=torch.Generator().manual_seed(1))
    served = load_teacher(vllm_server.url, "cpu")
    assert isinstance(served, ServedTeacher)
    logp, top1 = served.token_logprobs(rollouts)
    want_logp, want_top1 = LocalTeacher(model).token_logprobs(rollouts)
    assert torch.allclose(logp, want_logp, atol=1e-3)
    assert torch.equal(top1, want_top1)


def test_distillation_from_a_served_copy_of_the_student_starts_at_zero_kl(vllm_server, tmp_path):
    from grpoplus.entry.cli import main
    from grpoplus.metrics import read_metrics

    out = tmp_path / "run"
    assert main(["train", "--preset", "grpo", "--model", vllm_server.model_dir, f"teacher={vllm_server.url}",
                 "lambda_opd=1.0", "opd_outcome=false", "--out", str(out), "max_steps=2", "prompts_per_step=4",
                 "group_size=4", "max_new_tokens=8", "eval_size=2", "eval_samples=1", "progress=false", "loggers=[]",
                 "micro_batch_size=16"]) == 0
    first = [r for r in read_metrics(out) if "opd/reverse_kl" in r][0]
    assert abs(first["opd/reverse_kl"]) < 1e-3  # the teacher is the student's own weights, served by vLLM
    assert first["opd/top1_agreement"] > 0
