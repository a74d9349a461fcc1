"""``python tests/killed.py N train ARGS...``: ``grpoplus train ARGS`` whose process kills itself with SIGKILL as soon
as step N's metrics are logged (before that step's checkpoint), through a callback as a user's would run: the fault
the resume tests recover from. Not a test module."""

import os
import signal
import sys

from grpoplus.entry.api import Trainer
from grpoplus.entry.cli import main


def kill_at(step: int):
    def callback(record: dict) -> None:
        if record["step"] == step:
            os.kill(os.getpid(), signal.SIGKILL)
    return callback


if __name__ == "__main__":
    step, argv = int(sys.argv[1]), sys.argv[2:]
    train = Trainer.train
    Trainer.train = lambda self: (self.callbacks.append(kill_at(step)), train(self))[1]
    sys.exit(main(argv))
