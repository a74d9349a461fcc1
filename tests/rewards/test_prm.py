"""Process rewards (data.prm): steps cut on the sampled ids, scored by a token classifier at each step's last
character, and their use as the step rewards of algo.turn_credit=process."""

import doctest
import math

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaForTokenClassification, PreTrainedTokenizerFast

from grpoplus.algo import AlgoConfig
from grpoplus.collect.scoring import Scorer
from grpoplus.config import build_config
from grpoplus.containers import Rollouts
from grpoplus.entry.cli import main
from grpoplus.learner.prepare import turn_advantages
from grpoplus.metrics import read_metrics
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.rewards import RewardComponent, RewardPipeline
from grpoplus.rewards import prm as prm_module
from grpoplus.rewards.prm import ProcessRewardModel, split_steps
from grpoplus.tasks.base import Example

CHAR = char_tokenizer()
EOS = CHAR.eos_token_id


def pair_tokenizer() -> PreTrainedTokenizerFast:
    """Tokens of two characters (the last of a text may hold one), <bos> prepended: another tokenizer than the
    policy's char one, whose tokens can hold a separator and the character after it."""
    alphabet = "abcdefgh0123:\n "
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}
    for piece in list(alphabet) + [a + b for a in alphabet for b in alphabet]:
        vocab.setdefault(piece, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]{1,2}"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>", clean_up_tokenization_spaces=False)


def chars(text: str, eos: bool = True) -> list[int]:
    return CHAR.encode(text, add_special_tokens=False) + ([EOS] if eos else [])


@pytest.mark.parametrize("text, eos, separator, ends", [
    ("ab\ncd\nef", True, "\n", [2, 5, 8]),  # each "\n" ends a step; the last step ends at <eos> (index 8)
    ("abc", True, "\n", [3]),  # no separator: one step
    ("abc", False, "\n", [2]),  # cut by the length limit: the last sampled token
    ("ab\n", True, "\n", [3]),  # a final separator opens no empty step
    ("ab\n", False, "\n", [2]),
    ("a\n\nb\nc", True, "\n\n", [2, 6]),  # a separator of two tokens ends at its second
    ("", True, "\n", [0]),  # <eos> only
])
def test_step_ends_on_the_policys_char_tokens(text, eos, separator, ends):
    decoded, char_ends, token_ends = split_steps(chars(text, eos), CHAR, separator)
    assert decoded == text and token_ends == ends
    assert len(char_ends) == len(ends) and char_ends[-1] == len(text)


@pytest.mark.parametrize("separator, ends", [("\n", [1, 2, 3, 5]), ("\n\n", [3, 5])])
def test_step_ends_on_tokens_of_several_characters(separator, ends):
    tok = pair_tokenizer()
    ids = tok.encode("ab\ncd\n\nef", add_special_tokens=False) + [tok.eos_token_id]
    assert [tok.decode([i]) for i in ids[:5]] == ["ab", "\nc", "d\n", "\ne", "f"]
    # "\n" at characters 2, 5, 6 completes in tokens 1, 2, 3; "\n\n" (characters 5-6) in token 3; <eos> is token 5
    assert split_steps(ids, tok, separator)[2] == ends


def expected_scores(path, text, positions, num_labels, sigmoid, tokenizer, token_of):
    """The PRM's score at the tokens holding ``positions`` (characters of ``text``), from one unpadded forward."""
    model = LlamaForTokenClassification.from_pretrained(path).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokenizer(text)["input_ids"]])).logits[0]
    scores = logits[:, 0] if num_labels == 1 else logits.softmax(-1)[:, 1]
    scores = torch.sigmoid(scores) if sigmoid else scores
    return [float(scores[token_of(p)]) for p in positions]


@pytest.mark.parametrize("num_labels, sigmoid", [(1, False), (1, True), (2, False)])
def test_step_rewards_are_the_prms_scores_at_each_steps_last_character(classifier_dir, num_labels, sigmoid):
    path = classifier_dir("token", num_labels)
    prm = ProcessRewardModel(path, batch_size=2, sigmoid=sigmoid)  # two padded rows, then one
    prompts, texts = ["p: ", "a longer prompt: ", "q"], ["ab\ncd", "xyz", "a\n"]
    rewards, ends = prm.score(prompts, [chars(t) for t in texts], CHAR)
    assert ends == [[2, 5], [3], [2]]
    last_chars = [[2, 4], [2], [1]]  # in the response: the "\n" and the "d"; "z"; the final "\n" of a one-step text
    for prompt, text, got, positions in zip(prompts, texts, rewards, last_chars):
        # the char tokenizer: character c of prompt + response is token c + 1 (after <bos>)
        want = expected_scores(path, prompt + text, [len(prompt) + c for c in positions], num_labels, sigmoid, CHAR,
                               lambda c: c + 1)
        assert got == pytest.approx(want, abs=1e-5)
    if num_labels == 2 or sigmoid:
        assert all(0.0 < x < 1.0 for row in rewards for x in row)


def test_a_prm_with_another_tokenizer_scores_the_token_holding_the_steps_end(new_classifier):
    tok = pair_tokenizer()
    path = new_classifier("pairs", "token", 1, tokenizer=tok)
    rewards, ends = ProcessRewardModel(path).score(["ab:"], [chars("ab\ncd")], CHAR)
    assert ends == [[2, 5]]
    # "ab:ab\ncd" in pairs: <bos> "ab" ":a" "b\n" "cd": character p is token 1 + p // 2; the steps end at 5 and 7
    want = expected_scores(path, "ab:ab\ncd", [5, 7], 1, False, tok, lambda p: 1 + p // 2)
    assert rewards[0] == pytest.approx(want, abs=1e-5)


def test_a_directory_without_a_token_classifier_is_refused(nano_dir, classifier_dir):
    with pytest.raises(ValueError, match="LlamaForCausalLM, not a \\*ForTokenClassification") as err:
        ProcessRewardModel(nano_dir)
    assert "data.prm" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="LlamaForSequenceClassification"):
        ProcessRewardModel(classifier_dir("sequence", 1))
    with pytest.raises(ValueError, match="non-empty"):
        ProcessRewardModel(classifier_dir("token", 1), step_separator="")


def rollouts(texts: list[tuple[str, bool]], groups: list[int]) -> Rollouts:
    """Single-turn rollouts of the char tokenizer's ids: (response text, sampled <eos>) per row, right-padded."""
    ids = [chars(t, eos) for t, eos in texts]
    T = max(map(len, ids))
    response = torch.tensor([row + [0] * (T - len(row)) for row in ids])
    mask = torch.tensor([[1.0] * len(row) + [0.0] * (T - len(row)) for row in ids])
    n = len(texts)
    return Rollouts(prompt_ids=torch.ones(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1, dtype=torch.long),
                    response_ids=response, response_mask=mask, logp_roll=torch.zeros(n, T),
                    finished=torch.tensor([eos for _, eos in texts]), group_ids=torch.tensor(groups),
                    texts=[t for t, _ in texts], prompt_index=sorted(set(groups)))


def by_hand_process_advantages(steps, ends, groups, T, eps):
    """ALGORITHMS.md section 1: normalise all step rewards of a group, A_t = sum of those of the steps ending >= t."""
    adv = torch.zeros(len(steps), T, dtype=torch.float64)
    for g in set(groups):
        rows = [i for i in range(len(steps)) if groups[i] == g]
        pooled = torch.tensor([x for i in rows for x in steps[i]], dtype=torch.float64)
        mean, std = pooled.mean(), pooled.std()
        for i in rows:
            for reward, end in zip(steps[i], ends[i]):
                adv[i, : end + 1] += (reward - mean) / (std + eps)
    return adv.float()


def test_the_scorer_makes_prm_steps_the_turn_credit_of_the_learner(classifier_dir):
    path = classifier_dir("token", 1)
    rows = [("1\n2", True), ("3", True), ("a\nb\nc", True), ("d\n", False)]  # (response, sampled <eos>)
    r = rollouts(rows, [0, 0, 1, 1])
    task = [1.0, 0.0, 0.0, 1.0]
    pipeline = RewardPipeline([RewardComponent("task", lambda p, c, **f: list(task))])
    prm = ProcessRewardModel(path)
    scorer = Scorer(pipeline, [Example("q0: ", "x"), Example("q1: ", "y")], prm=prm, tokenizer=CHAR)
    scored, metrics = scorer(r)
    steps, ends = prm.score(["q0: ", "q0: ", "q1: ", "q1: "], [chars(t, e) for t, e in rows], CHAR)
    assert ends == [[1, 3], [1], [1, 3, 5], [1]]
    assert scored.rollouts.turn_ends == ends and scored.rollouts.turn_rewards == steps
    sums = [sum(s) for s in steps]
    assert scored.components["prm"] == pytest.approx(sums, abs=1e-6)
    assert scored.rewards.tolist() == pytest.approx([t + s for t, s in zip(task, sums)], abs=1e-6)
    assert metrics["prm/steps_mean"] == 7 / 4
    assert metrics["prm/step_reward_mean"] == pytest.approx(sum(sums) / 7)
    assert metrics["reward/mean"] == pytest.approx(sum(t + s for t, s in zip(task, sums)) / 4, abs=1e-6)

    algo = AlgoConfig.preset("grpo", turn_credit="process")
    adv = turn_advantages(scored.rollouts, scored.rewards, None, algo)
    with_task = [row[:-1] + [row[-1] + t] for row, t in zip(steps, task)]  # the rest of the reward: the last step
    want = by_hand_process_advantages(with_task, ends, [0, 0, 1, 1], r.response_ids.shape[1], algo.adv_eps)
    assert torch.allclose(adv, want, atol=1e-5)
    assert adv[0, 0] != adv[0, 2] and adv[2, 0] != adv[2, 2] != adv[2, 4]  # steps of one response differ


def test_config_ties_prm_to_turn_credit(classifier_dir):
    path = classifier_dir("token", 1)
    assert build_config(overrides=[f"prm={path}", "turn_credit=process"]).data.prm == path
    with pytest.raises(ValueError, match="set algo.turn_credit=process"):
        build_config(overrides=[f"prm={path}"])
    with pytest.raises(ValueError, match="data.prm scores the steps of single-turn responses, but this run is multi"):
        build_config(overrides=[f"prm={path}", "turn_credit=process", "env=guess"])
    with pytest.raises(ValueError, match="data.prm \\(step rewards of a process reward model\\)"):
        build_config(overrides=["turn_credit=process"])


SMALL = ["prompts_per_step=4", "group_size=4", "max_new_tokens=10", "eval_size=4", "eval_samples=2",
         "progress=false", "loggers=[]", "doctor_every=0", "micro_batch_size=8"]


def test_train_with_process_rewards(nano_dir, classifier_dir, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--model", nano_dir, "--out", str(out), "max_steps=2", "eval_every=0", *SMALL,
                 f"prm={classifier_dir('token', 2)}", "turn_credit=process"]) == 0
    records = [r for r in read_metrics(out) if r["step"] > 0]
    assert len(records) == 2
    for record in records:
        assert record["prm/steps_mean"] >= 1.0 and 0.0 < record["prm/step_reward_mean"] < 1.0
        assert all(math.isfinite(v) for v in record.values() if isinstance(v, float))


def test_docstring_examples():
    result = doctest.testmod(prm_module)
    assert result.attempted > 0 and result.failed == 0
