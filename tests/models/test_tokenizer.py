from transformers import AutoTokenizer

from grpoplus.models.tokenizer import ALPHABET, char_tokenizer


def test_one_token_per_character_and_exact_round_trip():
    tok = char_tokenizer()
    text = "9-6+1+8-2=3+1+8-2=4#10, Use 3,7->21: (a*b)/c!\n"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert len(ids) == len(text) + 1
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok(text, add_special_tokens=False)["input_ids"] == ids[1:]


def test_special_tokens_and_left_padding():
    tok = char_tokenizer()
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert len(tok) == 4 + len(set(ALPHABET))
    batch = tok(["1+1=", "12+3="], padding=True)
    assert batch["input_ids"][0][0] == tok.pad_token_id  # short prompt padded on the left
    assert batch["attention_mask"][0] == [0, 1, 1, 1, 1, 1]
    assert tok.convert_ids_to_tokens(tok("a€")["input_ids"]) == ["<bos>", "a", "<unk>"]


def test_save_and_reload_offline(tmp_path):
    tok = char_tokenizer()
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = "7+8-6+3=15-6+3=9+3=12#12"
    assert again(text)["input_ids"] == tok(text)["input_ids"]
    assert again.decode(again(text)["input_ids"], skip_special_tokens=True) == text
    assert (again.pad_token_id, again.eos_token_id, again.padding_side) == (0, 2, "left")
