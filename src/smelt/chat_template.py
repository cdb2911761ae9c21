"""The chat format (a neutral contract, like documents.py): one chat template on the tokenizer's reserved role tokens, as token ids with loss masks and as the
Jinja `chat_template` of an exported tokenizer_config.json.

A conversation is `EOS`, then for each message `<|role|>content<|end_of_turn|>`; a generation prompt
ends with `<|assistant|>`, and a reply ends at `<|end_of_turn|>`. The leading EOS is what every smelt
document is predicted from in pretraining. There is no text between the special tokens, so encoding
each message's content on its own gives exactly the ids `apply_chat_template` gets from the rendered
string (Hugging Face splits at special tokens before it pre-tokenizes), and a loss mask is exact.
The trained targets of an assistant message are its content and its `<|end_of_turn|>`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from smelt.errors import UserError

# The roles a message may have; the chat readers and the template agree on them.
ROLES = ("system", "user", "assistant", "tool")

END_OF_TURN = "<|end_of_turn|>"


def role_token(role: str) -> str:
    return f"<|{role}|>"


def jinja_template(eos_token: str) -> str:
    """The template as Jinja, for transformers' apply_chat_template."""
    roles = ", ".join(repr(r) for r in ROLES)
    return (
        f"{{{{ {eos_token!r} }}}}"
        "{% for message in messages %}"
        f"{{% if message['role'] not in [{roles}] %}}"
        "{{ raise_exception('unknown role ' + message['role'] + '; use system, user, assistant or tool') }}"
        "{% endif %}"
        f"{{{{ '<|' + message['role'] + '|>' + message['content'] + {END_OF_TURN!r} }}}}"
        "{% endfor %}"
        f"{{% if add_generation_prompt %}}{{{{ {role_token('assistant')!r} }}}}{{% endif %}}"
    )


def chat_template_fields(info: dict[str, Any]) -> dict[str, str]:
    """`{"chat_template": ...}` for a tokenizer whose smelt.json `info` lists the chat tokens, else {}
    (a tokenizer trained with tokenizer.chat_tokens = false has no chat format)."""
    specials = info.get("special_tokens") or {}
    needed = [role_token(r) for r in ROLES] + [END_OF_TURN]
    eos = next((token for token, i in specials.items() if i == info.get("eos_id")), None)
    if eos is None or any(token not in specials for token in needed):
        return {}
    return {"chat_template": jinja_template(eos)}


@dataclass
class Encoded:
    """Token ids and, per id, whether it is a trained target (an assistant token)."""

    ids: list[int]
    mask: list[bool]


class ChatFormat:
    """Encodes conversations with a smelt Tokenizer (anything with encode_batch, token_to_id, eos_id)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.role_ids: dict[str, int] = {}
        missing = []
        for token in [role_token(r) for r in ROLES] + [END_OF_TURN]:
            found = tokenizer.token_to_id(token)
            if found is None:
                missing.append(token)
            else:
                self.role_ids[token] = int(found)
        if missing:
            raise UserError(
                f"the tokenizer in {getattr(tokenizer, 'directory', '?')} has no {', '.join(missing)} token: "
                f"post-training needs the reserved chat tokens. Train the base run's tokenizer with "
                f"tokenizer.chat_tokens = true (the default)."
            )
        self.eos_id = int(tokenizer.eos_id)
        self.end_of_turn_id = self.role_ids[END_OF_TURN]
        self.assistant_id = self.role_ids[role_token("assistant")]

    def encode(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = False, train_on: str = "assistant"
    ) -> Encoded:
        """The conversation's ids; mask marks the assistant messages' content and end-of-turn tokens
        (train_on="last": only the final assistant message's, for preference and RL replies)."""
        contents = self.tokenizer.encode_batch([m["content"] for m in messages])
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        ids, mask = [self.eos_id], [False]
        for i, (message, content) in enumerate(zip(messages, contents, strict=True)):
            trained = message["role"] == "assistant" and (train_on == "assistant" or i == last)
            ids.append(self.role_ids[role_token(message["role"])])
            mask.append(False)
            ids.extend(content)
            ids.append(self.end_of_turn_id)
            mask.extend([trained] * (len(content) + 1))
        if add_generation_prompt:
            ids.append(self.assistant_id)
            mask.append(False)
        return Encoded(ids, mask)

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """A prompt ready for generation: the conversation, then `<|assistant|>`."""
        return self.encode(messages, add_generation_prompt=True).ids

    def reply_ids(self, text: str) -> list[int]:
        """The ids an assistant reply is trained on: its content, then `<|end_of_turn|>`."""
        return self.tokenizer.encode(text) + [self.end_of_turn_id]

    def decode_reply(self, ids: list[int]) -> str:
        """Generated ids -> text, stopping at `<|end_of_turn|>` and leaving special tokens out."""
        if self.end_of_turn_id in ids:
            ids = ids[: ids.index(self.end_of_turn_id)]
        return self.tokenizer.decode(ids, skip_special_tokens=True)
