"""Multi-turn collection: trajectories token in, token out, on the hf engine; every way an environment can fail
ends its trajectory with a counted reason, in bounded time, and the batch goes on (ALGORITHMS.md section 12)."""

import asyncio
import time

import pytest
import torch

from grpoplus.containers import SamplingParams
from grpoplus.envs.base import StepResult
from grpoplus.envs.episodes import EpisodeLimits, run_episodes
from grpoplus.envs.render import CHAR_MARKUP, observation_ids
from grpoplus.learner.logprobs import response_logprobs_from_rollouts
from grpoplus.rollout.hf import HFEngine

ROWS = [{"prompt": "12+3=", "answer": "15"}, {"prompt": "7-2=", "answer": "5"}]


@pytest.fixture(scope="module")
def model(short_turns):
    return short_turns()


@pytest.fixture(scope="module")
def engine(model, tok):
    return HFEngine(model, tok)


class Echo:
    """Answers every turn with its length; done after ``turns`` turns; records what it saw."""

    closed = []

    def __init__(self, turns: int = 3, reward: float = 0.5):
        self.turns, self.reward, self.seen = turns, reward, []

    def reset(self, **row):
        self.row = row

    def step(self, action: str):
        self.seen.append(action)
        return f"len {len(action)}", self.reward, len(self.seen) == self.turns, {}

    def close(self):
        Echo.closed.append(self)


def _run(engine, tok, factory, limits=None, n=2, max_new_tokens=12, seed=0):
    params = SamplingParams(n=n, max_new_tokens=max_new_tokens)
    limits = limits or EpisodeLimits(max_turns=4, timeout_s=5.0)
    return run_episodes(engine, tok, factory, ROWS, params, limits, torch.Generator().manual_seed(seed), [10, 11])


def test_trajectories_are_the_engines_ids_then_the_observations_ids(engine, tok, model):
    envs = []

    def factory(**row):
        envs.append(Echo())
        return envs[-1]

    r, m = _run(engine, tok, factory)
    assert r.response_ids.shape[0] == 4 and r.group_ids.tolist() == [0, 0, 1, 1] and r.prompt_index == [10, 11]
    for row, env in enumerate(envs):
        ids = r.response_ids[row][r.response_mask[row] > 0].tolist()
        sampled = r.model_mask[row][r.response_mask[row] > 0].tolist()
        turns, at = [], 0
        for end in r.turn_ends[row]:  # split at each turn's last sampled id, then skip its observation
            turn = ids[at:end + 1]
            assert all(s == 1 for s in sampled[at:end + 1])
            turns.append(turn)
            obs = [] if end + 1 == len(ids) else observation_ids(tok, f"len {len(tok.decode(turn, skip_special_tokens=True))}")
            assert ids[end + 1:end + 1 + len(obs)] == obs and all(s == 0 for s in sampled[end + 1:end + 1 + len(obs)])
            at = end + 1 + len(obs)
        # the env read exactly those turns (a last turn cut at max_new_tokens ends the trajectory unread)
        texts = [tok.decode(t, skip_special_tokens=True) for t in turns]
        assert texts[:len(env.seen)] == env.seen and len(texts) - len(env.seen) in (0, 1)
        assert r.turn_rewards[row] == [0.5] * len(env.seen) + [None] * (len(texts) - len(env.seen))
    assert (r.logp_roll[r.model_mask == 0] == 0).all()  # no sampler log-prob on environment tokens
    # each sampled id was drawn in exactly the context the learner sees: its teacher-forced log-prob is logp_roll
    logp, _ = response_logprobs_from_rollouts(model, r)
    sampled = r.model_mask > 0
    assert torch.allclose(logp[sampled], r.logp_roll[sampled], atol=1e-5)
    assert m["env/turns_mean"] == sum(len(t) for t in r.turn_ends) / 4 and 0 < m["env/obs_token_frac"] < 1
    assert torch.equal(r.env_returns, torch.tensor([0.5 * len(e.seen) for e in envs]))
    assert all(e in Echo.closed for e in envs)  # close() ran for every one


def test_an_episode_run_is_reproducible_from_the_generator(engine, tok):
    a, _ = _run(engine, tok, lambda **row: Echo(), seed=3)
    b, _ = _run(engine, tok, lambda **row: Echo(), seed=3)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logp_roll, b.logp_roll)


def test_endings_are_recorded_by_reason(engine, tok):
    _, m = _run(engine, tok, lambda **row: Echo(turns=2))
    assert m["env/ended/done"] + m["env/ended/length"] == 1.0  # done after 2 turns, or a turn cut at 12 tokens
    r, m = _run(engine, tok, lambda **row: Echo(turns=99), limits=EpisodeLimits(max_turns=2, timeout_s=5.0),
                max_new_tokens=40)
    assert m["env/ended/max_turns"] + m["env/ended/length"] == 1.0 and not r.finished.any()
    assert max(len(t) for t in r.turn_ends) <= 2
    r, m = _run(engine, tok, lambda **row: Echo(turns=99), limits=EpisodeLimits(max_turns=50, max_tokens=30,
                                                                                  timeout_s=5.0))
    assert (r.response_mask.sum(1) <= 30).all() and m["env/ended/length"] + m["env/ended/context"] == 1.0


class Raises(Echo):
    def step(self, action):
        raise RuntimeError("tool crashed")


class Hangs(Echo):
    def step(self, action):
        time.sleep(30)


class Malformed(Echo):
    def step(self, action):
        return "not a step result"


class HugeObservation(Echo):
    def step(self, action):
        return "x" * 5000, 0.0, False, {}


class BadReward(Echo):
    def step(self, action):
        return "ok", float("nan"), False, {}


class RaisesOnReset(Echo):
    def reset(self, **row):
        raise KeyError("answer")


@pytest.mark.parametrize("env, reason", [(Raises, "error"), (Hangs, "timeout"), (Malformed, "malformed"),
                                         (HugeObservation, "context"), (BadReward, "malformed"),
                                         (RaisesOnReset, "error")])
def test_a_failing_environment_ends_its_trajectory_counted_never_the_run(engine, tok, env, reason):
    def factory(row_prompt=None, **row):  # every other trajectory fails
        factory.calls += 1
        return env() if factory.calls % 2 else Echo(turns=1)

    factory.calls = 0
    t0 = time.perf_counter()
    r, m = _run(engine, tok, factory, limits=EpisodeLimits(max_turns=3, timeout_s=0.5))
    assert time.perf_counter() - t0 < 10  # a hung environment costs its deadline, not the run
    assert m[f"env/ended/{reason}"] == 0.5 and r.response_ids.shape[0] == 4
    assert m["env/ended/done"] + m["env/ended/length"] == 0.5  # the healthy ones played on
    assert m["env/timeouts"] == (2.0 if reason == "timeout" else 0.0)
    assert r.end_reasons[0::2] == [reason, reason]  # the rollouts say why each trajectory ended (the run's traces)
    assert set(r.end_reasons[1::2]) <= {"done", "length"}


def test_the_factory_failing_is_counted_too(engine, tok):
    def factory(**row):
        raise ValueError("no such game")

    r, m = _run(engine, tok, factory)
    assert m["env/ended/error"] == 1.0 and r.lengths.tolist() == [0, 0, 0, 0]


class AsyncEcho:
    async def reset(self, **row):
        await asyncio.sleep(0)
        return None

    async def step(self, action):
        await asyncio.sleep(0.01)
        return StepResult("ok", 1.0, True)


def test_async_environments_are_awaited(engine, tok):
    r, m = _run(engine, tok, lambda **row: AsyncEcho())
    assert m["env/ended/done"] + m["env/ended/length"] == 1.0 and m["env/return_mean"] == m["env/ended/done"]


class Gym:
    """The Gymnasium shape: reset -> (obs, info), step -> (obs, reward, terminated, truncated, info)."""

    def reset(self, seed=None, **row):
        return "guess a letter", {}

    def step(self, action):
        return "again", 0.0, False, True, {}


def test_gymnasium_shaped_environments_play_and_a_first_observation_is_the_prompt(engine, tok):
    r, m = _run(engine, tok, lambda **row: Gym())
    assert m["env/ended/done"] + m["env/ended/length"] == 1.0  # truncated counts as the episode's end
    first = tok("guess a letter")["input_ids"]
    assert r.prompt_ids[0][r.prompt_mask[0] > 0].tolist() == first


class StrictGym:
    """Gymnasium's own signature: ``reset(*, seed=None, options=None)``; the row reaches it as ``options``."""

    def __init__(self):
        self.options = None

    def reset(self, *, seed=None, options=None):
        self.options = options
        return f"secret of {options['prompt']}", {}

    def step(self, action):
        return "again", 0.0, False, True, {}


def test_a_gymnasium_reset_takes_the_row_as_its_options(engine, tok):
    made = []

    def factory(**row):
        made.append(StrictGym())
        return made[-1]

    r, m = _run(engine, tok, factory)
    assert m.get("env/ended/error", 0.0) == 0.0 and m["env/ended/done"] + m["env/ended/length"] == 1.0
    assert {env.options["prompt"] for env in made} == {row["prompt"] for row in ROWS}
    assert r.prompt_ids[0][r.prompt_mask[0] > 0].tolist() == tok(f"secret of {ROWS[0]['prompt']}")["input_ids"]


def test_the_character_markup_is_what_the_observation_ids_say(tok):
    assert tok.decode(observation_ids(tok, "higher")) == CHAR_MARKUP.format(text="higher")
    assert observation_ids(tok, None) == []


class Slow(Echo):
    """Takes 1 s per step: a slow tool."""

    def step(self, action):
        time.sleep(1.0)
        return super().step(action)


class Timed(Echo):
    """Records when each step was called."""

    def step(self, action):
        self.called = getattr(self, "called", []) + [time.monotonic()]
        return super().step(action)


def test_a_slow_environment_does_not_stall_the_others(engine, tok):
    envs = []

    def factory(**row):
        envs.append(Slow(turns=3) if len(envs) % 2 else Timed(turns=3))
        return envs[-1]

    t0 = time.monotonic()
    _, m = _run(engine, tok, factory, limits=EpisodeLimits(max_turns=3, timeout_s=5.0, patience_s=0.1))
    fast = [e for e in envs if isinstance(e, Timed) and len(getattr(e, "called", [])) >= 2]
    assert fast, "some fast trajectory should take several turns"
    # the fast ones took their later turns while the slow ones were still answering their first (1 s)
    assert all(e.called[1] - t0 < 1.0 for e in fast)
    assert m["env/ended/timeout"] == 0.0  # the slow ones answered into later rounds


def test_waiting_for_every_environment_keeps_a_run_reproducible(engine, tok):
    patient = EpisodeLimits(max_turns=3, timeout_s=5.0, patience_s=5.0)
    a, _ = _run(engine, tok, lambda **row: Echo(), limits=patient, seed=7)
    b, _ = _run(engine, tok, lambda **row: Echo(), limits=patient, seed=7)
    assert torch.equal(a.response_ids, b.response_ids)
