"""The HF export carries the chat template: AutoTokenizer's apply_chat_template gives smelt's ids."""

from __future__ import annotations

import json

import pytest
from tests.helpers import build_model, tiny_model_config

from smelt.chat_template import ChatFormat
from smelt.tokenizer.load import Tokenizer


def test_exported_tokenizer_config_carries_the_chat_template(tokenizer_dir, tmp_path):
    transformers = pytest.importorskip("transformers")
    from smelt.model.hf import export_model

    out = export_model(build_model(tiny_model_config()), tmp_path / "hf", tokenizer_dir)
    assert "chat_template" in json.loads((out / "tokenizer_config.json").read_text())
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    chat = ChatFormat(Tokenizer.load(tokenizer_dir))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Natalia sold 48 clips in April. How many in May?"},
        {"role": "assistant", "content": "She sold 48/2 = 24 clips in May.\n#### 24"},
    ]
    assert (
        list(hf.apply_chat_template(messages, tokenize=True, return_dict=False)) == chat.encode(messages).ids
    )
    prompt = hf.apply_chat_template(
        messages[:2], tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert list(prompt) == chat.prompt_ids(messages[:2])
