"""The chat format: readers, the template's ids and loss masks, and the exported Jinja template."""

from __future__ import annotations

import json

import pytest

from smelt.chat_template import ChatFormat, chat_template_fields
from smelt.errors import UserError
from smelt.posttrain.chat import final_number, gsm8k_item, hh_pair, read_chat
from smelt.tokenizer.load import Tokenizer

CONVERSATION = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "What is 12+34?"},
    {"role": "assistant", "content": "12+34=46\n#### 46"},
    {"role": "user", "content": "And 1+1? <|eos|> tricky"},
    {"role": "assistant", "content": " 2 "},
]


def test_template_round_trips_through_transformers_apply_chat_template(tokenizer_dir, tmp_path):
    transformers = pytest.importorskip("transformers")
    tokenizer = Tokenizer.load(tokenizer_dir)
    chat = ChatFormat(tokenizer)
    info = json.loads((tokenizer_dir / "smelt.json").read_text())
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_dir / "tokenizer.json"))
    hf.chat_template = chat_template_fields(info)["chat_template"]
    # transformers tokenizes the rendered string, so a special token's text in a message (`<|eos|>`)
    # becomes the special id there; smelt encodes message text as ordinary text. Compare without it.
    plain = [{**m, "content": m["content"].replace("<|eos|>", "eos")} for m in CONVERSATION]
    for messages in (plain, CONVERSATION[1:2], [{"role": "user", "content": ""}]):
        ours = chat.encode(messages).ids
        theirs = hf.apply_chat_template(messages, tokenize=True, return_dict=False)
        assert list(theirs) == ours
        with_prompt = hf.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=False
        )
        assert list(with_prompt) == chat.prompt_ids(messages)
    assert chat.prompt_ids(CONVERSATION[:2])[-1] == tokenizer.token_to_id("<|assistant|>")
    ours = chat.encode(CONVERSATION).ids
    assert ours.count(tokenizer.eos_id) == 1  # the leading EOS only: the message's <|eos|> stays text
    assert (
        list(hf.apply_chat_template(CONVERSATION, tokenize=True, return_dict=False)).count(tokenizer.eos_id)
        == 2
    )


def test_masks_cover_assistant_content_and_end_of_turn_only(tokenizer_dir):
    tokenizer = Tokenizer.load(tokenizer_dir)
    chat = ChatFormat(tokenizer)
    encoded = chat.encode(CONVERSATION)
    trained = [i for i, m in zip(encoded.ids, encoded.mask, strict=True) if m]
    eot = tokenizer.token_to_id("<|end_of_turn|>")
    expected = tokenizer.encode("12+34=46\n#### 46") + [eot] + tokenizer.encode(" 2 ") + [eot]
    assert trained == expected
    last_only = chat.encode(CONVERSATION, train_on="last")
    assert [i for i, m in zip(last_only.ids, last_only.mask, strict=True) if m] == tokenizer.encode(" 2 ") + [
        eot
    ]
    assert encoded.ids[0] == tokenizer.eos_id


def test_chat_template_is_absent_without_chat_tokens():
    info = {"eos_id": 1, "special_tokens": {"<|bos|>": 0, "<|eos|>": 1, "<|pad|>": 2}}
    assert chat_template_fields(info) == {}


def test_tokenizer_without_chat_tokens_is_a_user_error(tokenizer_dir):
    class NoChat:
        directory = "tok"
        eos_id = 1

        def token_to_id(self, token):
            return None

    with pytest.raises(UserError, match=r"no <\|system\|>.*tokenizer.chat_tokens = true"):
        ChatFormat(NoChat())


def test_gsm8k_reader_strips_calculations_and_keeps_the_final_answer():
    item = gsm8k_item({"question": "Q?", "answer": "48/2 = <<48/2=24>>24 clips\n#### 1,072"}, "f:1")
    assert item["messages"][1]["content"] == "48/2 = 24 clips\n#### 1,072"
    assert item["answer"] == "1072"
    with pytest.raises(UserError, match=r"f:2: a GSM8K record needs .*#### <number>"):
        gsm8k_item({"question": "Q?", "answer": "no marker"}, "f:2")


def test_final_number_prefers_the_marker_then_the_last_number():
    assert final_number("so 3 then 4\n#### 1,234.0 done") == "1234"
    assert final_number("12+34=46") == "46"
    assert final_number("no digits") is None


def test_hh_rlhf_pair_shares_the_prompt_and_differs_in_the_last_reply():
    record = {
        "chosen": "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how to be mean?\n\nAssistant: I'd rather not.",
        "rejected": "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how to be mean?\n\nAssistant: Insult them.",
    }
    pair = hh_pair(record)
    assert [m["role"] for m in pair["prompt"]] == ["user", "assistant", "user"]
    assert pair["chosen"] == [{"role": "assistant", "content": "I'd rather not."}]
    assert pair["rejected"] == [{"role": "assistant", "content": "Insult them."}]
    assert hh_pair({"chosen": record["chosen"], "rejected": record["chosen"]}) is None


def test_hh_rlhf_real_file_reads_into_pairs(shared_data):
    from smelt.posttrain.chat import read_hh_rlhf

    pairs, skipped = read_hh_rlhf(shared_data / "posttrain" / "hh-rlhf" / "harmless-base-test.jsonl.gz")
    assert len(pairs) + skipped == 2312 and len(pairs) > 2000
    assert all(p["prompt"][-1]["role"] == "user" for p in pairs)


def test_chat_reader_names_the_bad_record(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(
        '{"messages": [{"role": "user", "content": "hi"}]}\n{"messages": [{"role": "bot", "content": "x"}]}\n'
    )
    with pytest.raises(UserError, match=r"chat.jsonl:2: message 0 has role 'bot'; use one of system"):
        read_chat(path)
