"""textarena single-player games played as grpoplus environments: through run_episodes with the nano model (every
trajectory ends with a recorded reason), and scripted, where the reward at the end is the game's for player 0."""

import random
import re

import pytest
import torch

pytest.importorskip("textarena", reason="the textarena adapter needs textarena: pip install 'grpoplus[envs]'")

import textarena  # noqa: E402

from grpoplus.containers import SamplingParams  # noqa: E402
from grpoplus.envs.adapters import adapt  # noqa: E402
from grpoplus.envs.base import env_factory  # noqa: E402
from grpoplus.envs.episodes import REASONS, EpisodeLimits, run_episodes  # noqa: E402
from grpoplus.envs.textarena import TextArenaGame, game  # noqa: E402
from grpoplus.rollout.hf import HFEngine  # noqa: E402

HANOI = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]  # 3 disks from A to C in 7 moves


@pytest.fixture(scope="module")
def engine(tok, short_turns):
    """The nano model that takes short turns, with room for a game's rules."""
    return HFEngine(short_turns(max_position_embeddings=2048), tok)


@pytest.mark.parametrize("game_id, rules", [("GuessTheNumber-v0", "Guess The Number"),
                                            ("TowerOfHanoi-v0", "Tower of Hanoi"),
                                            ("Mastermind-v0", "Mastermind")])
def test_games_play_through_run_episodes_and_end_with_a_reason(engine, tok, game_id, rules):
    rows = [{"prompt": "play", "answer": "", "game": game_id, "seed": seed} for seed in (1, 2)]
    factory = env_factory("grpoplus.envs.textarena:game")  # as data.env names it
    r, m = run_episodes(engine, tok, factory, rows, SamplingParams(n=2, max_new_tokens=16),
                        EpisodeLimits(max_turns=3, timeout_s=10.0, max_context=2048), torch.Generator().manual_seed(0),
                        [0, 1])
    assert sum(m[f"env/ended/{reason}"] for reason in REASONS) == 1.0
    assert m["env/ended/error"] == m["env/ended/malformed"] == m["env/ended/timeout"] == 0.0, m
    assert m["env/turns_mean"] >= 1
    for i in range(4):  # the prompt is the game's rules; a reward comes only with the game's end
        assert rules in tok.decode(r.prompt_ids[i][r.prompt_mask[i] > 0], skip_special_tokens=True)
        assert all(reward is None for reward in r.turn_rewards[i][:-1])
        assert (r.turn_rewards[i][-1] is not None) == bool(r.finished[i])


def _bisect(env: TextArenaGame) -> tuple[list[str], float | None, bool, dict]:
    """Plays GuessTheNumber (1..20) by bisection on the game's hints: (observations, last reward, done, info)."""
    lo, hi, seen = 1, 20, []
    while True:
        guess = (lo + hi) // 2
        obs, reward, done, info = env.step(str(guess))  # the default wrappers put a bare move in brackets
        if done:
            return seen, reward, done, info
        seen.append(obs)
        lo, hi = (guess + 1, hi) if "higher" in obs else (lo, guess - 1)


def test_a_scripted_win_and_loss_get_the_games_reward_at_the_end():
    env = game(game="TowerOfHanoi-v0", seed=0)
    assert "Tower of Hanoi" in env.reset(prompt="play")
    steps = [env.step(move) for move in HANOI]
    assert [s[1] for s in steps] == [None] * 6 + [1.0] and [s[2] for s in steps] == [False] * 6 + [True]
    assert steps[0][0].startswith("You moved disk 1 from A to C.") and "[A C]" not in steps[0][0]  # not its own move
    assert "solved" in steps[-1][3]["reason"]
    env.close()

    env = game(game="GuessTheNumber-v0", seed=7)
    env.reset(prompt="play")
    hints, reward, done, _ = _bisect(env)
    assert done and reward == 1.0 and len(hints) <= 4 and all(re.search(r"(higher|lower)\.$", h) for h in hints)

    env = game(game="TowerOfHanoi-v0", seed=0)  # a move that is not a move, twice: the game is lost
    env.reset(prompt="play")
    obs, reward, done, _ = env.step("left")
    assert obs.startswith("You attempted an invalid move") and reward is None and not done
    obs, reward, done, info = env.step("right")
    assert done and reward == 0.0 and info["reason"].startswith("Invalid Move")


def test_a_seed_is_the_same_game_and_leaves_the_process_random_as_it_was():
    random.seed(123)
    before = random.getstate()
    plays = []
    for seed in (7, 7, 8):
        env = game(game="GuessTheNumber-v0", seed=seed)
        env.reset(prompt="play")
        plays.append(_bisect(env)[0])
    assert plays[0] == plays[1] != plays[2]
    assert random.getstate() == before
    # no seed: one from the row's prompt, so a group's trajectories (one row) play the same game
    plays = []
    for prompt in ("row 1", "row 1", "row 2"):
        env = game(game="GuessTheNumber-v0")
        env.reset(prompt=prompt)
        plays.append(_bisect(env)[0])
    assert plays[0] == plays[1] != plays[2]


def test_adapt_recognises_a_textarena_game_and_a_row_without_a_game_is_refused():
    env = adapt(textarena.make("Mastermind-v0"))
    assert isinstance(env, TextArenaGame) and "Mastermind" in env.reset(prompt="play", seed=3)
    with pytest.raises(ValueError, match="needs a game id: give the data rows a 'game' column"):
        game(prompt="play")
