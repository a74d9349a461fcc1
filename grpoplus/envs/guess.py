"""The built-in multi-turn task: guess a secret number from higher/lower feedback.

The secret is a number in ``1..2^d - 1`` (``difficulty`` d, default 4: 1..15); the policy has ``d + 2`` guesses
(bisection needs ``d``). Each wrong guess is answered ``higher`` or ``lower`` (``?`` for a turn that is not
a number) and costs 0.1 (a per-turn reward of -0.1); the verifier gives 1 for a solved game. So a trajectory
earns ``1 - 0.1 x wrong guesses`` when it finds the secret and ``-0.1 x guesses`` when it does not: success
first, then fewer turns.

The built-in model's warm start plays games with two habits, half and half: counting up from the bottom
(``1, 2, 3, ...``: it solves secrets up to 6 only, in 5 turns per game on average) and guessing at random among the
numbers the feedback still allows (92% solved, 3.95 turns). Greedy decoding counts up (6 of the 15 held-out games).
No warm-start game bisects: RL has to find that guesses near the middle of what is left solve more games in fewer
turns (bisection solves every game, in 3.27 turns on average).
"""

from __future__ import annotations

import random
import re

from grpoplus.envs.base import ENVS
from grpoplus.tasks.base import TASKS, Example
from grpoplus.tasks.synthetic import difficulty_levels

TURN_COST = 0.1
HABITS = (("count", 0.5), ("random", 0.5))  # the warm start's games, by share
_SPLIT = re.compile(r"=> [^\n]*\n")  # CHAR_MARKUP around any observation


def parse_guess(text: str) -> int | None:
    """The number a turn's text states, or None."""
    text = text.strip()
    return int(text) if text.isdigit() else None


def last_guess(transcript: str) -> int | None:
    """The last turn's guess in a character-model transcript (turns are separated by the observation markup)."""
    return parse_guess(_SPLIT.split(transcript)[-1])


@ENVS.register("guess")
class GuessNumber:
    """One game: ``reset(answer=secret)``, then ``step(guess_text)`` until solved or out of guesses."""

    def __init__(self, answer, guesses: int = 6):
        self.secret, self.left = int(answer), guesses

    def reset(self, **row) -> None:
        return None  # the row's prompt states the game

    def step(self, action: str):
        guess = parse_guess(action)
        self.left -= 1
        if guess == self.secret:
            return None, 0.0, True, {}
        feedback = "?" if guess is None else "higher" if guess < self.secret else "lower"
        return feedback, -TURN_COST, self.left == 0, {}


@TASKS.register("guess")
class GuessTask:
    """Games of :class:`GuessNumber`: 2,000 training games with random secrets; the held-out games are every
    secret once (the prompt does not name the secret, so ``problem_id`` does)."""

    name = "guess"
    env = "guess"  # the environment its rows are played in (data.env)
    sft_version = 2  # bump when the warm-start games change (it names the warm-start cache)

    check_args = staticmethod(difficulty_levels("guess", 1, 7))  # secrets 1..2^d - 1

    def __init__(self, difficulty: int = 4, seed: int = 0, size: int = 2000):
        self.check_args(difficulty=difficulty)
        self.difficulty, self.high = difficulty, 2 ** difficulty - 1
        rng = random.Random(seed)
        prompt = f"guess 1-{self.high}: "
        self._splits = {
            "train": [self._example(prompt, rng.randint(1, self.high), f"train-{seed}-{i}") for i in range(size)],
            "test": [self._example(prompt, s, f"test-{s}") for s in range(1, self.high + 1)]}

    def _example(self, prompt: str, secret: int, problem_id: str) -> Example:
        return Example(prompt, str(secret), {"guesses": self.difficulty + 2, "problem_id": problem_id})

    def split(self, name: str) -> list[Example]:
        return self._splits[name]

    def reward(self, prompts, completions, answer, **fields) -> list[float]:
        """1.0 when the transcript's last guess is the secret."""
        return [float(last_guess(c) == int(a)) for c, a in zip(completions, answer)]

    def sft_episode(self, example: Example, rng: random.Random) -> list[tuple[str, str | None]]:
        """A warm-start game of one habit: (turn text, observation text or None) per turn."""
        habit = rng.choices([h for h, _ in HABITS], [w for _, w in HABITS])[0]
        env, lo, hi, turns = GuessNumber(example.answer, example.fields["guesses"]), 1, self.high, []
        while True:
            guess = lo if habit == "count" else rng.randint(lo, hi)
            obs, _, done, _ = env.step(str(guess))
            turns.append((str(guess), None if done else obs))
            if done:
                return turns
            lo, hi = (guess + 1, hi) if obs == "higher" else (lo, guess - 1)
