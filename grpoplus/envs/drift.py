"""``env/retokenize_drift``: would re-rendering a trajectory give other ids than the ones it holds?

The trajectories are never re-tokenized (each turn continues from the ids sampled so far), so nothing here changes
training: it measures what a framework that re-renders the conversation between turns would train on instead
(TRL #5224, verl #3720). A chat model's conversation (the opening messages, each turn's text as an assistant
message, each observation) is rendered again by its chat template and tokenized; without a template the
trajectory's text is tokenized again. A trajectory drifts when its ids are not a prefix of the re-rendered ones: a
template that edits what it writes (e.g. trims the assistant's text), or text whose tokenization across a turn
boundary differs from the ids sampled.
"""

from __future__ import annotations

from grpoplus.data.chat import with_tools
from grpoplus.envs.render import has_template, messages, roles_known


def drifted(tokenizer, episode) -> bool:
    """Whether re-rendering ``episode`` (a :class:`grpoplus.envs.episodes.Episode`) gives other ids; a
    vision-language policy's trajectories (rendered by its processor, images expanded) are not measured (False)."""
    if getattr(episode, "vision", None) is not None:
        return False
    ids = episode.context()
    if has_template(tokenizer) and episode.opening is not None:
        msgs = list(episode.opening)
        for k, turn in enumerate(episode.turns):
            msgs.append({"role": "assistant", "content": tokenizer.decode(turn.sampled, skip_special_tokens=True)})
            if k < len(episode.said):
                msgs += messages(episode.said[k])
        msgs, tools = with_tools(tokenizer, msgs, episode.tools)  # as the prompt was rendered
        text = tokenizer.apply_chat_template(roles_known(tokenizer, msgs), tools=tools, tokenize=False)
    else:
        text = tokenizer.decode(ids)
    again = tokenizer(text, add_special_tokens=False)["input_ids"]
    return again[:len(ids)] != ids

