"""``shapes``: count the shapes in a generated picture (a vision-language policy's built-in task).

Each problem is a 56x56 picture cut in four 28x28 cells; ``difficulty`` decides how busy it is (see
:func:`draw_picture`): a cell holds one dark shape (a disc, a square or a triangle, of a random colour, size and
place) or none, on a light background with noise. The prompt asks how many shapes there are; the verifier reads the
integer after the last ``#``. The reference response works cell by cell, in reading order, one mark per cell (``x``
a shape, ``.`` none), then the count::

    prompt   <image> "Picture 41: how many shapes? Answer #n."
    response "x..x#2"

The cells are where the families' vision encoders put their tokens at this size (a 56x56 picture is 4 image tokens,
one per cell), so a tiny model can learn it on a CPU in minutes; the answer itself needs the picture: every prompt's
text is the same but for its picture number.
"""

from __future__ import annotations

import random

from grpoplus.tasks.base import TASKS, Example
from grpoplus.tasks.synthetic import SyntheticTask, check_sizes, difficulty_levels, final_answer

SIZE, CELL = 56, 28
KINDS = ("disc", "square", "triangle")


def draw_picture(rng: random.Random, cells: tuple[bool, ...], difficulty: int):
    """The picture of ``cells`` (which of the 4 cells hold a shape): at difficulty 1 black shapes on white, higher
    difficulties add background noise, smaller shapes and lighter colours."""
    import numpy as np
    from PIL import Image, ImageDraw

    noise = 12 * (difficulty - 1)
    background = np.array([255 - rng.randint(0, 30 * (difficulty - 1)) for _ in range(3)])
    speckle = np.random.default_rng(rng.getrandbits(32)).integers(-noise, noise + 1, (SIZE, SIZE, 3))
    image = Image.fromarray(np.clip(background + speckle, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for k, filled in enumerate(cells):
        if not filled:
            continue
        size = rng.randint(max(8, 20 - 3 * difficulty), 20)
        x0 = (k % 2) * CELL + rng.randint(2, CELL - size - 2)
        y0 = (k // 2) * CELL + rng.randint(2, CELL - size - 2)
        colour = tuple(rng.randint(0, 40 * difficulty) for _ in range(3))
        box = (x0, y0, x0 + size, y0 + size)
        kind = rng.choice(KINDS)
        if kind == "disc":
            draw.ellipse(box, fill=colour)
        elif kind == "square":
            draw.rectangle(box, fill=colour)
        else:
            draw.polygon([(x0, y0 + size), (x0 + size, y0 + size), (x0 + size // 2, y0)], fill=colour)
    return image


def draw_shapes(rng: random.Random, number: int, difficulty: int) -> Example:
    """A picture of 0..4 shapes, each count as likely (no answer is right more often than by a fifth), in cells
    drawn at random."""
    filled = set(rng.sample(range(4), rng.randint(0, 4)))
    cells = tuple(k in filled for k in range(4))
    marks = "".join("x" if c else "." for c in cells)
    prompt = f"Picture {number}: how many shapes? Answer #n."
    return Example(prompt=prompt, answer=str(sum(cells)), fields={"cells": marks},
                   images=(draw_picture(rng, cells, difficulty),))


def shapes_target(example: Example) -> str:
    """The worked response: a mark per cell in reading order, then ``#count``.

    >>> shapes_target(Example("Picture 1: how many shapes? Answer #n.", "2", {"cells": "x..x"}))
    'x..x#2'
    """
    return f"{example.fields['cells']}#{example.answer}"


def shapes_reward(prompts: list[str], completions: list[str], answer: list[str], **fields) -> list[float]:
    """1.0 when the text after the last ``#`` is the number of shapes, else 0.0 (never raises).

    >>> shapes_reward(["p"] * 3, ["x..x#2", "#3", "two"], ["2"] * 3)
    [1.0, 0.0, 0.0]
    """
    return [1.0 if final_answer(c) == str(a).strip() else 0.0 for c, a in zip(completions, answer)]


@TASKS.register("shapes")
def shapes(difficulty: int = 2, seed: int = 0, n_train: int = 2000, n_test: int = 128) -> SyntheticTask:
    """The shapes task (a vision-language policy's): ``difficulty`` (1..4) how busy the pictures are. Pictures are
    numbered, test split first, so the two splits never share a prompt."""
    shapes.check_args(difficulty=difficulty)
    check_sizes("shapes", n_train, n_test)
    rng = random.Random(seed)
    drawn = [draw_shapes(rng, seed * 1_000_000 + k, difficulty) for k in range(n_test + n_train)]
    return SyntheticTask("shapes", difficulty, tuple(drawn[n_test:]),
                         tuple(drawn[:n_test]), shapes_reward, shapes_target, chat=True)


shapes.check_args = difficulty_levels("shapes", 1, 4)
shapes.shows_images = True  # its prompts show pictures: a vision-language policy's task (the config rule task)
