"""The failure gallery, whole runs: an environment that raises on some trajectories is counted and said once while
the run trains on the others, the broken ones left unscored (and one that raises on every call ends every
trajectory, said once); the tokens a tool inserted carry no loss and are marked as a tool's in the trace; a run
SIGKILLed right after the checkpoint that ends an epoch resumes to the uninterrupted run, every training row drawn
exactly once per epoch."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpoplus.entry.cli import main
from grpoplus.metrics import read_metrics
from grpoplus.metrics.traces import read_trace, traced_steps
from grpoplus.models.tokenizer import char_tokenizer

SMALL = ["prompts_per_step=4", "group_size=2", "max_new_tokens=8", "eval_size=2", "eval_samples=0", "eval_every=0",
         "progress=false", "loggers=[]", "doctor_every=0", "micro_batch_size=8", "save_every=0", "threads=1"]
KILLER = str(Path(__file__).resolve().parents[1] / "killed.py")  # grpoplus train, SIGKILLed once step N is logged

GAMES = '''
class GameBroke(Exception):
    """The game's own error: its name is this file's alone, so its first occurrence is this run's."""


class ServerDown(Exception):
    """The game server's error."""


class Game:
    """Rows 3 and 7 raise at every step; the others end after their second turn."""

    def __init__(self, answer):
        self.answer, self.turns = answer, 0

    def reset(self, **row):
        return None

    def step(self, action):
        self.turns += 1
        if self.answer in ("3", "7"):
            raise GameBroke(f"game {self.answer} lost its board")
        return "again", 0.25, self.turns == 2, {}


class Down:
    def reset(self, **row):
        return None

    def step(self, action):
        raise ServerDown("the game server is down")


def make(answer):
    return Game(answer)


def down():
    return Down()
'''


def _rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def games(tmp_path):
    """The games file, 8 training rows ("1?" .. "8?") and 2 held-out ones."""
    (tmp_path / "games.py").write_text(GAMES)
    data = _rows(tmp_path / "rows.jsonl", [{"prompt": f"{a}?", "answer": str(a)} for a in range(1, 9)])
    held_out = _rows(tmp_path / "held_out.jsonl", [{"prompt": f"{a}!", "answer": str(a)} for a in (1, 2)])
    return tmp_path, [f"data={data}", f"eval_data={held_out}", "answer_format=raw", "max_turns=3"]


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if "an environment's" in line]


def test_an_environment_raising_on_some_trajectories_is_counted_said_once_and_the_others_train(short_turns_dir,
                                                                                             games, capsys):
    tmp_path, env_args = games
    out = tmp_path / "run"
    assert main(["train", "--preset", "grpo", "--model", short_turns_dir, "--out", str(out), *env_args,
                 f"env={tmp_path / 'games.py'}:make", "max_steps=2", *SMALL]) == 0
    err = capsys.readouterr().err
    steps = [r for r in read_metrics(out) if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]  # two steps of 4 rows: every row drawn once, rows 3 and 7 too
    samples = [s for step in (1, 2) for s in read_trace(out / "traces", step)]
    broke = [s for s in samples if s["end"] == "error"]
    # each of rows 3 and 7 (2 trajectories each) whose first turn ended reached the environment and raised
    assert 2 <= len(broke) == 8 * sum(r["env/ended/error"] for r in steps) <= 4
    tok = char_tokenizer()
    assert all(tok.decode(s["prompt_ids"], skip_special_tokens=True).endswith(("3?", "7?")) for s in broke)
    # a trajectory its environment broke has no score: left out of its group and of the loss, not trained as a 0
    assert all(not s["scored"] and "1" not in s["loss_mask"] for s in broke)
    # said once, in one line, though it happened len(broke) times; no traceback
    said = _warnings(err)
    assert len(said) == 1 and said[0].startswith("grpoplus: warning: an environment's step GameBroke: game ")
    assert said[0].endswith(" lost its board (its trajectory ends, counted in env/ended/error; said once)")
    assert "Traceback" not in err
    # the others played on past their first turn (an observation between turns) and carried loss
    others = [s for s in samples if s["end"] != "error"]
    assert any(s["end"] == "done" and "01" in s["mask"] for s in others)
    assert all(s["scored"] and s["trained"] and "1" in s["loss_mask"] for s in others)
    assert all("t" not in s["mask"] for s in samples)  # a game's observations are its own text, not a tool's
    assert all(r["optim/skipped_updates"] == 0 for r in steps)


def test_an_environment_raising_on_every_call_ends_every_trajectory_said_in_one_line(short_turns_dir, games,
                                                                                    capsys):
    tmp_path, env_args = games
    out = tmp_path / "run"
    code = main(["train", "--preset", "grpo", "--model", short_turns_dir, "--out", str(out), *env_args,
                 f"env={tmp_path / 'games.py'}:down", "max_steps=2", *SMALL])
    err = capsys.readouterr().err
    # what the product does: the run goes on to its end; every trajectory ends at its first turn, by the
    # environment's error, or by the length limit where the turn never reached the environment
    assert code == 0
    steps = [r for r in read_metrics(out) if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["env/turns_max"] == 1 and r["env/ended/error"] > 0 for r in steps)
    assert all(r["env/ended/error"] + r["env/ended/length"] == 1 for r in steps)
    tok = char_tokenizer()
    stops = {tok.eos_token, *"0123456789aeiou "}  # short_turns_dir's stop tokens
    for s in (s for step in (1, 2) for s in read_trace(out / "traces", step)):
        ended = tok.convert_ids_to_tokens(s["response_ids"][-1]) in stops  # the turn ended: the environment was asked
        assert "0" not in s["mask"] and s["end"] == ("error" if ended else "length")
    assert _warnings(err) == ["grpoplus: warning: an environment's step ServerDown: the game server is down (its "
                              "trajectory ends, counted in env/ended/error; said once)"]
    assert "Traceback" not in err


def test_a_second_run_in_the_same_process_says_its_environments_first_failure_too(short_turns_dir, games, capsys):
    tmp_path, env_args = games
    (tmp_path / "games.py").write_text(GAMES.replace("GameBroke", "GameBrokeTwice"))
    said = []
    for name in ("first", "second"):
        assert main(["train", "--preset", "grpo", "--model", short_turns_dir, "--out", str(tmp_path / name),
                     *env_args, f"env={tmp_path / 'games.py'}:make", "max_steps=2", *SMALL]) == 0
        assert sum(r.get("env/ended/error", 0) for r in read_metrics(tmp_path / name)) > 0
        said.append(len([w for w in _warnings(capsys.readouterr().err) if "GameBrokeTwice" in w]))
    assert said == [1, 1]


TOOL = '''
def tick() -> str:
    """Tick the clock.
    """
    return "QZXJ"
'''
CALL = '<tool_call>{"name": "tick", "arguments": {}}</tool_call>'


@pytest.fixture(scope="module")
def caller_dir(tmp_path_factory):
    """A nano model that answers the prompt "0+0?" (with the tick tool described before it) with the call of tick:
    fitted to that one sequence here, so the untrained model's run has tool calls to answer. Its context (1024
    positions) holds the tool's description."""
    from grpoplus.envs.render import first_prompt_ids
    from grpoplus.envs.tools import schema
    from grpoplus.models.tiny import tiny_model

    path = tmp_path_factory.mktemp("caller")
    (path / "tool.py").write_text(TOOL)
    namespace: dict = {}
    exec(TOOL, namespace)
    tok = char_tokenizer()
    prompt = first_prompt_ids(tok, [{"role": "user", "content": "0+0?"}], [schema(namespace["tick"])])
    target = tok(CALL, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ids = torch.tensor([prompt + target])
    labels = ids.clone()
    labels[:, :len(prompt)] = -100
    model = tiny_model(tok, size="nano", seed=0, max_position_embeddings=1024)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for _ in range(300):
            loss = model(input_ids=ids, labels=labels).loss
            if loss.item() < 0.003:  # the call, 57 tokens, sampled whole at temperature 1 most times (e^-0.17)
                break
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert loss.item() < 0.003
    model.save_pretrained(path / "model")
    tok.save_pretrained(path / "model")
    return path


@pytest.mark.slow
def test_the_tokens_a_tool_inserted_carry_no_loss(caller_dir, tmp_path):
    data = _rows(tmp_path / "rows.jsonl", [{"prompt": "0+0?", "answer": "0", "problem_id": i} for i in range(4)])
    out = tmp_path / "run"
    assert main(["train", "--preset", "grpo", "--model", str(caller_dir / "model"), "--out", str(out), f"data={data}",
                 "answer_format=raw", f"tools=[{caller_dir / 'tool.py'}:tick]", "max_turns=2", "max_steps=1",
                 *[o for o in SMALL if not o.startswith(("max_new_tokens", "prompts_per_step"))],
                 "max_new_tokens=60", "prompts_per_step=2"]) == 0
    assert read_metrics(out)[-1]["env/tool_calls"] > 0
    tok = char_tokenizer()
    samples = read_trace(out / "traces", 1)
    called = 0
    for s in samples:
        assert s["trained"] and len(s["mask"]) == len(s["loss_mask"]) == len(s["response_ids"])
        # the run's own marks: no tool (mask t) or environment (mask 0) token carries loss
        assert not any(m in "t0" and loss == "1" for m, loss in zip(s["mask"], s["loss_mask"]))
        # an independent reading of the ids: the call the policy sampled carries loss, the tool's answer none
        pieces = tok.convert_ids_to_tokens(s["response_ids"])  # one character per token, "<eos>" one token
        if "".join(pieces[:len(CALL) + 1]) == CALL + "<eos>" and "QZXJ" in "".join(pieces[len(CALL) + 1:]):
            called += 1
            assert set(s["loss_mask"][:len(CALL) + 1]) == {"1"}  # the call and its end token
            at = next(i for i in range(len(CALL) + 1, len(pieces)) if "".join(pieces[i:i + 4]) == "QZXJ")
            assert s["loss_mask"][at:at + 4] == "0000" and s["mask"][at:at + 4] == "tttt"  # a tool's result
    assert called >= 2  # both kinds of tokens in the trace: the check above could fail
    assert any("1" in s["loss_mask"][len(CALL) + 10:] for s in samples)  # a second turn, sampled, with loss


def test_a_tools_description_past_the_models_context_is_named_not_taken_for_cut_completions(nano_dir, tmp_path,
                                                                                            capsys):
    (tmp_path / "tool.py").write_text(TOOL)
    data = _rows(tmp_path / "rows.jsonl", [{"prompt": "0+0?", "answer": "0", "problem_id": i} for i in range(4)])
    out = tmp_path / "run"
    code = main(["train", "--preset", "grpo", "--model", nano_dir, "--out", str(out), f"data={data}",
                 "answer_format=raw", f"tools=[{tmp_path / 'tool.py'}:tick]", "max_turns=2", "max_steps=1",
                 *[o for o in SMALL if not o.startswith("prompts_per_step")], "prompts_per_step=2"])
    err = capsys.readouterr().err
    assert code == 2 or read_metrics(out)[-1]["env/ended/context"] == 1.0  # the nano model's 256 positions
    assert any("context" in line for line in err.splitlines())
    assert "raise it" not in err and "raise rollout.max_new_tokens" not in err


def _train(args: list[str], kill_at: int | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, KILLER, str(kill_at)] if kill_at else [sys.executable, "-m", "grpoplus"]
    return subprocess.run([*cmd, "train", *args], env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=600)


SPREAD = "def spread(prompts, completions, **fields):\n    return [len(c) % 3 / 2 for c in completions]\n"


@pytest.mark.slow
def test_a_run_killed_right_after_the_checkpoint_ending_an_epoch_resumes_without_skipping_or_repeating_rows(
        nano_dir, tmp_path):
    # 8 rows, 4 prompts a step: the first epoch ends at step 2, the step of the first checkpoint
    prompts = [f"{a}+{b}=" for a, b in ((1, 2), (3, 4), (5, 6), (7, 8), (9, 1), (2, 3), (4, 5), (6, 7))]
    data = _rows(tmp_path / "rows.jsonl", [{"prompt": p, "answer": "0"} for p in prompts])
    held_out = _rows(tmp_path / "held_out.jsonl", [{"prompt": "8+9=", "answer": "17"}])
    (tmp_path / "spread.py").write_text(SPREAD)
    common = ["--preset", "grpo", "--model", nano_dir, f"data={data}", f"eval_data={held_out}", "answer_format=raw",
              f"rewards=[{tmp_path / 'spread.py'}:spread]", "max_steps=4", "save_every=2", "keep_checkpoints=3",
              *[o for o in SMALL if not o.startswith(("save_every", "eval_size"))], "eval_size=1"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert _train(["--out", str(straight), *common]).returncode == 0
    run = _train(["--out", str(killed), *common], kill_at=3)  # step 3 logged: the last checkpoint is step 2's
    assert run.returncode == -signal.SIGKILL
    assert [r["step"] for r in read_metrics(killed)] == [0, 1, 2, 3]
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["step-2"]
    resumed = _train(["--resume", str(killed)])
    assert resumed.returncode == 0, resumed.stderr
    drop = ("time/", "throughput/")
    records = [{k: v for k, v in r.items() if not k.startswith(drop)} for r in read_metrics(straight)]
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert [{k: v for k, v in r.items() if not k.startswith(drop)} for r in read_metrics(killed)] == records
    tok = char_tokenizer()
    for run_dir in (straight, killed):
        assert sorted(traced_steps(run_dir / "traces")) == [1, 2, 3, 4]
        drawn = {}  # step -> the prompt of each group, read back from the trace's ids
        for step in (1, 2, 3, 4):
            groups = {s["group"]: tok.decode(s["prompt_ids"], skip_special_tokens=True)
                      for s in read_trace(run_dir / "traces", step)}
            drawn[step] = [groups[g] for g in sorted(groups)]
        assert all(len(drawn[step]) == 4 for step in drawn)
        assert sorted(drawn[1] + drawn[2]) == sorted(prompts)  # epoch 0: every row once
        assert sorted(drawn[3] + drawn[4]) == sorted(prompts)  # epoch 1: every row once, none skipped or repeated
    for step in (3, 4):  # the resumed steps sampled what the uninterrupted run sampled
        assert read_trace(killed / "traces", step) == read_trace(straight / "traces", step)
