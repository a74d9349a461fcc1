"""The LLM judge: scores from a real vLLM server (structured choices, the cache), the failure policy against stub
servers on loopback (retries, a server that never answers, unparseable replies, no server), and a training run
with the judge as a reward component."""

import doctest
import json
import math
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import grpoplus.rewards.judge as judge_module
from grpoplus.entry.cli import main
from grpoplus.metrics import read_metrics
from grpoplus.rewards import RewardError, RewardPipeline, events, parse_reward_specs
from grpoplus.rewards.events import Unscored
from grpoplus.rewards.judge import JudgeConfigError, judge_reward

SMALL = ["prompts_per_step=4", "group_size=4", "max_new_tokens=10", "eval_size=6", "eval_samples=2",
         "progress=false", "loggers=[]", "doctor_every=2", "micro_batch_size=8"]
"""The small settings of tests/loop/test_train_e2e.py."""


@pytest.fixture(autouse=True)
def _fresh_cache():
    judge_module.CACHE.clear()


class _Stub(BaseHTTPRequestHandler):
    """A chat server whose answer to each request is ``server.answer(request_number, response_text)``: a status and
    a reply text, or None to never answer."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._send(200, {"data": [{"id": name} for name in self.server.models]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.requests.append((body, self.headers.get("Authorization")))
            number = len(self.server.requests)
        response = body["messages"][0]["content"].split("[Response]\n")[1].split("\n\n")[0]
        answer = self.server.answer(number, response)
        if answer is None:
            self.server.release.wait(30)
            return
        status, reply = answer
        self._send(status, {"choices": [{"message": {"content": reply}}]} if status == 200 else {"error": {"message": reply}})

    def _send(self, status: int, payload: dict):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextmanager
def stub_server(answer, models=("stub",)):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    server.daemon_threads = True
    server.answer, server.models, server.lock, server.requests = answer, list(models), threading.Lock(), []
    server.release = threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()


def _pipeline(spec: str) -> RewardPipeline:
    return RewardPipeline(parse_reward_specs([spec]))


def test_docstring_examples():
    result = doctest.testmod(judge_module)
    assert result.attempted > 0 and result.failed == 0


def test_a_spec_keeps_the_colons_of_its_url():
    [comp] = parse_reward_specs(["judge:0.5:url=http://127.0.0.1:8000/v1,choices=true,timeout_s=5"])
    assert (comp.name, comp.weight) == ("judge", 0.5)
    assert comp.kwargs == {"url": "http://127.0.0.1:8000/v1", "choices": True, "timeout_s": 5}


def test_a_server_error_is_retried_until_the_score_comes():
    answers = {1: (500, "busy"), 2: (503, "busy"), 3: (200, "Fine. Score: 7")}
    with stub_server(lambda number, response: answers[number]) as (url, server):
        assert judge_reward(["2+2="], ["4"], url=url, retries=2, timeout_s=5) == [pytest.approx(0.7)]
    assert len(server.requests) == 3


def test_a_client_error_is_not_retried_and_leaves_its_sample_unscored_in_a_mixed_batch():
    def answer(number, response):
        return (400, "prompt too long") if response == "long" else (200, "Score: 10")

    with stub_server(answer) as (url, server):
        before = events.snapshot()
        scores = judge_reward(["p", "p"], ["long", "ok"], url=url, retries=2)
    assert isinstance(scores[0], Unscored) and scores[0].kind == "error" and scores[1] == 1.0
    assert len(server.requests) == 2
    assert events.delta(before, events.snapshot()) == {"judge/errors": 1}


def test_a_server_that_never_answers_costs_a_bounded_time():
    def answer(number, response):
        return None if response.startswith("hang") else (200, "Score: 5")

    with stub_server(answer) as (url, server):
        pipeline = _pipeline(f"judge:url={url},timeout_s=0.5,retries=0")
        start = time.monotonic()
        result = pipeline(["p"] * 4, ["hang 1", "fine 1", "hang 2", "fine 2"])
        assert time.monotonic() - start < 3
        assert result.components["judge"] == [None, 0.5, None, 0.5]  # left out of their groups, not scored 0
        assert result.scored == [False, True, False, True]
        assert result.metrics["reward/timeouts"] == 2 and result.metrics["reward/errors"] == 2
        assert result.metrics["reward/judge/judge_timeouts"] == 2

        start = time.monotonic()
        with pytest.raises(RewardError) as raised:
            pipeline(["p"] * 3, ["hang 3", "hang 4", "hang 5"])
        assert time.monotonic() - start < 3
    message = str(raised.value)
    assert "\n" not in message and url in message and "no answer within 0.5 s" in message


def test_unparseable_replies_are_unscored_and_count_as_reward_errors():
    def answer(number, response):
        return (200, "I think it's good") if response.startswith("vague") else (200, "Correct. Score: 9")

    with stub_server(answer) as (url, server):
        result = _pipeline(f"judge:2:url={url}")(["p"] * 4, ["vague 1", "right 1", "vague 2", "right 2"])
    assert result.components["judge"] == [None, pytest.approx(0.9), None, pytest.approx(0.9)]
    assert result.scored == [False, True, False, True]
    assert result.total[1] == result.total[3] == pytest.approx(1.8)
    assert result.metrics["reward/errors"] == 2 and result.metrics["reward/timeouts"] == 0
    assert result.metrics["reward/judge/judge_unparseable"] == 2


def test_no_server_is_one_line_naming_the_url():
    with stub_server(lambda n, r: (200, "Score: 1")) as (url, server):
        pass  # its port is closed now
    start = time.monotonic()
    with pytest.raises(RewardError) as raised:
        _pipeline(f"judge:url={url},retries=1")(["p"] * 8, [f"r{i}" for i in range(8)])
    assert time.monotonic() - start < 5  # one refused model lookup and its retry, not one per sample
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"judge at {url}: connection refused")


def test_parameters_no_sample_can_work_with_stop_at_once():
    with pytest.raises(JudgeConfigError, match="needs url="):
        judge_reward(["p"], ["r"])
    with pytest.raises(JudgeConfigError, match="rubric must be text, got dict"):  # as the specs are parsed already
        parse_reward_specs(["judge:url=http://127.0.0.1:9/v1,model=m,rubric=Be strict: 0 for a wrong answer"])
    with pytest.raises(JudgeConfigError, match="rubric must be text, got dict"):
        judge_reward(["p"], ["r"], url="http://127.0.0.1:9/v1", model="m", rubric={"Be strict": 0})
    with pytest.raises(ValueError, match="min_score"):
        judge_reward(["p"], ["r"], url="http://127.0.0.1:9/v1", model="m", min_score=5, max_score=5)
    with stub_server(lambda n, r: (200, "Score: 1"), models=("a", "b")) as (url, server):
        with pytest.raises(ValueError, match=r"lists 2 models \(a, b\); name the one to use with model="):
            judge_reward(["p"], ["r"], url=url)
        assert judge_reward(["p"], ["r"], url=url, model="b") == [0.1]
        assert server.requests[0][0]["model"] == "b"


def test_the_request_carries_the_choices_the_key_and_the_rubric(monkeypatch):
    monkeypatch.setenv("JUDGE_TEST_KEY", "sekret")
    with stub_server(lambda n, r: (200, "3")) as (url, server):
        judge_reward(["What is 2+2?"], ["4"], url=url, choices=True, min_score=1, max_score=5, rubric="Be strict.",
                     api_key_env="JUDGE_TEST_KEY")
        judge_reward(["What is 2+2?"], ["5"], url=url, api_key_env="UNSET_JUDGE_TEST_KEY")
    (body, auth), (plain, no_auth) = server.requests
    assert body["structured_outputs"] == {"choice": ["1", "2", "3", "4", "5"]}
    assert auth == "Bearer sekret" and no_auth is None
    content = body["messages"][0]["content"]
    assert content.startswith("Be strict.") and "What is 2+2?" in content and "[Response]\n4" in content
    assert "structured_outputs" not in plain and 'Score: <n>' in plain["messages"][0]["content"]


def test_a_pair_repeated_in_the_batch_is_sent_once():
    with stub_server(lambda n, r: (200, "Score: 4")) as (url, server):
        before = events.snapshot()
        assert judge_reward(["p"] * 4, ["a", "b", "a", "a"], url=url) == [0.4] * 4
        assert len(server.requests) == 2
        judge_reward(["p"] * 2, ["a", "a"], url=url, cache=False)
        assert len(server.requests) == 4
    assert events.delta(before, events.snapshot()) == {"judge/cache_hits": 2}


@pytest.mark.slow
def test_the_served_judge_scores_with_choices_and_caches(vllm_server, monkeypatch):
    prompts = [f"{a}+{b}=" for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)] for _ in range(2)]
    completions = [f"{i} and {i * 7}" for i in range(len(prompts))]
    before = events.snapshot()
    scores = judge_reward(prompts, completions, url=vllm_server.url, choices=True, concurrency=4)
    assert len(scores) == 8 and all(0.0 <= s <= 1.0 and math.isclose(s * 10, round(s * 10)) for s in scores)
    assert events.delta(before, events.snapshot()) == {}  # every reply parsed, nothing failed

    sent = []
    real = judge_module.request_json
    monkeypatch.setattr(judge_module, "request_json", lambda *a, **k: sent.append(a) or real(*a, **k))
    before = events.snapshot()
    assert judge_reward(prompts, completions, url=vllm_server.url, choices=True, concurrency=4) == scores
    assert events.delta(before, events.snapshot()) == {"judge/cache_hits": 8} and sent == []


def test_training_with_the_judge_as_a_reward_component(vllm_server, nano_dir, tmp_path):
    out = tmp_path / "run"
    rewards = f"rewards=[task, 'judge:0.5:url={vllm_server.url},choices=true']"
    assert main(["train", "--model", nano_dir, "--out", str(out), "max_steps=2", rewards, *SMALL]) == 0
    records = [r for r in read_metrics(out) if r["step"] >= 1]
    assert len(records) == 2
    for record in records:
        assert math.isfinite(record["reward/judge/mean"]) and 0.0 <= record["reward/judge/mean"] <= 1.0
        assert record["reward/errors"] == 0
