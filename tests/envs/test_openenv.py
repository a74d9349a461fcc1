"""OpenEnv environments (openenv-core) played through run_episodes: in process, and served over WebSocket on loopback
to the typed client, the generic (dict) client and the sync wrapper; the policy's text is the action's one string
field, the observation's text the prompt and the observations, its reward and done the turn's."""

import socket
import threading
import time

import pytest
import torch

pytest.importorskip("openenv", reason="the OpenEnv adapter needs openenv-core: pip install 'grpoplus[envs]'")

import uvicorn  # noqa: E402  (after the skip: openenv-core brings it)
from openenv.core import EnvClient, GenericEnvClient  # noqa: E402
from openenv.core.client_types import StepResult  # noqa: E402
from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app  # noqa: E402

from grpoplus.containers import SamplingParams  # noqa: E402
from grpoplus.envs.adapters import adapt  # noqa: E402
from grpoplus.envs.episodes import EpisodeLimits, run_episodes  # noqa: E402
from grpoplus.envs.openenv import OpenEnv, observation_text  # noqa: E402
from grpoplus.rollout.hf import HFEngine  # noqa: E402

ROWS = [{"prompt": "12+3=", "answer": "15"}, {"prompt": "7-2=", "answer": "5"}]
TURNS, REWARD = 2, 0.25


class Say(Action):
    text: str


class Heard(Observation):
    echoed: str = ""


class Echo(Environment[Say, Heard, State]):
    """Echoes each turn; REWARD a turn, done after TURNS turns. ``closed`` counts the instances closed."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    closed: list = []

    def __init__(self):
        super().__init__()
        self._state = State(step_count=0)

    def reset(self, seed=None, episode_id=None, answer=None, **kwargs) -> Heard:
        self._state = State(episode_id=episode_id, step_count=0)
        return Heard(echoed=f"say {answer}")

    def step(self, action: Say, timeout_s=None, **kwargs) -> Heard:
        self._state.step_count += 1
        return Heard(echoed=action.text, reward=REWARD, done=self._state.step_count == TURNS)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        Echo.closed.append(self)


class EchoClient(EnvClient[Say, Heard, State]):
    """The typed client a served environment ships with."""

    def _step_payload(self, action: Say) -> dict:
        return action.model_dump(exclude={"metadata"})

    def _parse_result(self, payload: dict) -> StepResult:
        observation = Heard(**payload.get("observation", {}), reward=payload.get("reward"), done=payload["done"])
        return StepResult(observation, payload.get("reward"), payload["done"])

    def _parse_state(self, payload: dict) -> State:
        return State(**payload)


@pytest.fixture(scope="module")
def engine(tok, short_turns):
    return HFEngine(short_turns(), tok)


@pytest.fixture(scope="module")
def server():
    """Echo served by uvicorn on a free loopback port, in a thread; stopped after the module's tests."""
    app = create_fastapi_app(Echo, Say, Heard, max_concurrent_envs=8)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    # critical: openenv 0.3's server logs a WebSocketDisconnect traceback each time one of its clients closes
    served = uvicorn.Server(uvicorn.Config(app, log_level="critical"))
    thread = threading.Thread(target=served.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not served.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the OpenEnv server did not start in 30 s"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    served.should_exit = True
    thread.join(timeout=10)
    sock.close()
    assert not thread.is_alive(), "the OpenEnv server did not stop in 10 s"


def _run(engine, tok, factory):
    params = SamplingParams(n=2, max_new_tokens=48)
    return run_episodes(engine, tok, factory, ROWS, params, EpisodeLimits(max_turns=4, timeout_s=10.0),
                        torch.Generator().manual_seed(0), [0, 1])


def _check_played(r, m, tok):
    """Every trajectory took TURNS turns rewarded REWARD and ended done; the prompt is reset's observation."""
    assert m["env/ended/done"] == 1.0 and r.finished.all(), m
    assert torch.equal(r.env_returns, torch.full((4,), REWARD * TURNS))
    assert r.turn_rewards == [[REWARD] * TURNS] * 4
    prompts = [tok.decode(r.prompt_ids[i][r.prompt_mask[i] > 0], skip_special_tokens=True) for i in range(4)]
    assert prompts == ["say 15", "say 15", "say 5", "say 5"]


def test_an_in_process_environment_is_played_through_run_episodes(engine, tok):
    envs = []

    def factory(**row):
        envs.append(Echo())
        return envs[-1]

    r, m = _run(engine, tok, factory)
    _check_played(r, m, tok)
    assert all(e in Echo.closed for e in envs) and all(e.state.step_count == TURNS for e in envs)


@pytest.mark.parametrize("client", ["typed", "generic", "sync"])
def test_a_served_environment_is_played_through_its_client(engine, tok, server, client):
    make = {"typed": lambda: EchoClient(base_url=server), "generic": lambda: GenericEnvClient(base_url=server),
            "sync": lambda: EchoClient(base_url=server).sync()}[client]
    closed = len(Echo.closed)
    r, m = _run(engine, tok, lambda **row: make())
    _check_played(r, m, tok)
    deadline = time.monotonic() + 10  # each session ends (the server closes its environment) once its client closes
    while len(Echo.closed) < closed + 4:
        assert time.monotonic() < deadline, "the server's sessions were not closed"
        time.sleep(0.05)


def test_adapt_recognises_environments_and_clients(server):
    assert isinstance(adapt(Echo()), OpenEnv)
    assert isinstance(adapt(EchoClient(base_url=server)), OpenEnv)
    assert isinstance(adapt(GenericEnvClient(base_url=server).sync()), OpenEnv)


class Move(Action):
    piece: str
    square: str


class Chess(Echo):
    def step(self, action: Move, timeout_s=None, **kwargs) -> Heard:
        return Heard(echoed=f"{action.piece}{action.square}", reward=1.0, done=True)


def test_an_action_without_one_string_field_needs_a_converter():
    env = adapt(Chess())
    env.reset(prompt="p", answer="a")
    with pytest.raises(ValueError, match="Move does not have exactly one string field.*action_from_text"):
        env.step("Nf3")
    env = OpenEnv(Chess(), action_from_text=lambda text: Move(piece=text[0], square=text[1:]))
    assert env.step("Nf3") == ("Nf3", 1.0, True, {})


class Board(Observation):
    board: str
    moves_left: int


def test_observation_text_is_the_string_fields_or_json():
    assert observation_text(Heard(echoed="hi", reward=1.0, done=True, metadata={"x": 1})) == "hi"
    assert observation_text(Board(board="..x", moves_left=3, reward=0.5)) == '{"board": "..x", "moves_left": 3}'
    assert observation_text({"echoed": "hi"}) == "hi"  # a GenericEnvClient's observation
