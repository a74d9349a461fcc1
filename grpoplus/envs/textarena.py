"""textarena single-player games played as grpoplus environments.

``data.env=grpoplus.envs.textarena:game`` plays the game each data row names in its ``game`` column (an id of
``textarena.make``, e.g. ``GuessTheNumber-v0``, ``TowerOfHanoi-v0``, ``Mastermind-v0``), seeded by its ``seed``
column; a factory may also return a game made with ``textarena.make`` (recognised by :func:`grpoplus.envs.adapters
.adapt`) or a :class:`TextArenaGame`. The game's first messages (its rules) are the prompt; each turn, the policy's
text is the move (an id with textarena's default wrappers puts a move without brackets in ``[...]``) and the game's
new messages are the observation. The reward is player 0's score from the game's rewards, given on the turn that
ends the game (1 for a win; the game's own partial credit, or -1, for a loss or a second invalid move in a row);
other turns have none.

What is not textarena's behaviour:

- an observation holds only the messages since the last turn, without the policy's own move: the transcript
  already holds the earlier turns, which textarena's observation wrappers would repeat each turn;
- textarena games draw from Python's global ``random`` (seeded in their ``reset``), and trajectories play in threads
  side by side: each game's calls run under one lock with the game's own ``random`` state swapped in and the
  caller's restored after, so a seed gives the same game whatever else runs, and the process's ``random`` is left
  as it was. A game drawing from ``numpy.random`` (Sokoban) is not isolated so.
- without a seed, a game's seed comes from the row's prompt: the trajectories of a group share their row, so they
  play the same game, as GRPO's comparison needs.

Offline in textarena 0.7.4 on Python 3.11: the single-player games above and 2048, Bandit, Blackjack, Countdown,
Crosswords, Cryptarithm, FifteenPuzzle, FrozenLake, LightsOut, LogicPuzzle, Minesweeper, PegJump, RushHour,
Secretary, Set, Slitherlink, Sokoban, Sudoku, ThreeCardMonte. Not: Hangman, Wordle, WordLadder, WordSearch
(download NLTK's word list), GuessWho, TwentyQuestions (call OpenRouter), Klondike (Python 3.12 syntax).
"""

from __future__ import annotations

import importlib.util
import random
import sys
import threading
import zlib
from typing import Any, Callable

from grpoplus.envs.adapters import ADAPTERS

_RANDOM = threading.Lock()  # held while a game runs with its own random state swapped in


def is_textarena_env(obj: Any) -> bool:
    """A textarena game (``textarena.Env``, wrapped or not); no import: such an object means textarena is loaded."""
    env = getattr(sys.modules.get("textarena.core"), "Env", None)
    return env is not None and isinstance(obj, env)


def game(game: str | None = None, seed: int | None = None, **row) -> TextArenaGame:
    """The environment factory of ``data.env=grpoplus.envs.textarena:game``: the textarena game ``game`` (the row's
    ``game`` column, or a keyword), seeded by ``seed`` (the row's ``seed`` column; without one, by its prompt)."""
    if importlib.util.find_spec("textarena") is None:
        raise ImportError("data.env=grpoplus.envs.textarena:game needs the textarena package: pip install 'grpoplus[envs]'")
    if not game:
        raise ValueError("data.env=grpoplus.envs.textarena:game needs a game id: give the data rows a 'game' column "
                         "(e.g. GuessTheNumber-v0)")
    import textarena

    return TextArenaGame(textarena.make(game), seed)


class TextArenaGame:
    """One single-player textarena game (see the module docstring). ``seed``: the game's seed (None: the row's
    ``seed`` field, else one derived from its prompt)."""

    def __init__(self, env: Any, seed: int | None = None):
        self.env, self.seed = env, seed
        self.core = _unwrapped(env)  # its messages are read here, past the observation wrappers
        self._random: tuple | None = None  # the game's own state of Python's random
        self._closed = False

    def reset(self, **row) -> str:
        seed = self.seed if self.seed is not None else row.get("seed")
        if seed is None and isinstance(row.get("prompt"), str):
            seed = zlib.crc32(row["prompt"].encode())
        self._random = random.Random(seed).getstate()
        self._call(lambda: self.env.reset(num_players=1, seed=seed))
        return self._messages()

    def step(self, action: str) -> tuple[str | None, float | None, bool, dict]:
        done, info = self._call(lambda: self.env.step(action))
        if not done:
            return self._messages(), None, False, {}
        rewards, game_info = _rewards(self._call(self.env.close))
        self._closed = True
        reason = (game_info or {}).get(0, {}).get("reason")
        return None, None if not rewards else float(rewards[0]), True, {"reason": reason} if reason else {}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._call(self.env.close)

    def _call(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` with this game's state of Python's random swapped in, under the lock (see the module docstring)."""
        with _RANDOM:
            outside = random.getstate()
            random.setstate(self._random)
            try:
                return fn()
            finally:
                self._random = random.getstate()
                random.setstate(outside)

    def _messages(self) -> str:
        """The game's messages to player 0 since the last call, one per line, without the policy's own move."""
        from textarena.core import ObservationType

        player, messages = self.core.get_observation()
        if player != 0:
            raise ValueError(f"textarena game {getattr(self.env, 'env_id', type(self.core).__name__)} asks player "
                             f"{player} to move: only single-player games can be played")
        return "\n".join(text.strip() for _, text, kind in messages if kind != ObservationType.PLAYER_ACTION)


def _unwrapped(env: Any) -> Any:
    """The game under textarena's wrappers."""
    from textarena.core import Wrapper

    while isinstance(env, Wrapper):
        env = env.env
    return env


def _rewards(closed: Any) -> tuple[dict | None, dict | None]:
    """(rewards, game_info) of ``Env.close()``: textarena 0.7 answers both, earlier versions the rewards alone."""
    return closed if isinstance(closed, tuple) else (closed, None)


ADAPTERS.append((is_textarena_env, TextArenaGame))
