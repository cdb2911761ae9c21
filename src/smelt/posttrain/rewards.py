"""Verifiable rewards as plug-ins: a reward is a Python function `(completion: str, item: dict) -> float`.

Built in: `exact_number` (1 when the completion's final number, the one after `####` or else its last
number, equals the item's "answer"; GSM8K and the synthetic addition task) and `format_number` (like
exact_number, plus 0.1 for giving any number at all: a denser signal for tiny models). A task adds its
own with `@register_reward("name")` in an imported module, or names it in the config as
`grpo.reward = "package.module:function"`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from smelt.errors import UserError
from smelt.posttrain.chat import final_number, normalize_number

Reward = Callable[[str, dict[str, Any]], float]
REWARDS: dict[str, Reward] = {}


def register_reward(name: str) -> Callable[[Reward], Reward]:
    def add(function: Reward) -> Reward:
        REWARDS[name] = function
        return function

    return add


@register_reward("exact_number")
def exact_number(completion: str, item: dict[str, Any]) -> float:
    answer = item.get("answer")
    if answer is None:
        raise UserError(
            'the exact_number reward needs an "answer" in every item (GSM8K and addition items have one; '
            "add it to chat JSONL records used for RL)."
        )
    return 1.0 if final_number(completion) == normalize_number(str(answer)) else 0.0


@register_reward("format_number")
def format_number(completion: str, item: dict[str, Any]) -> float:
    given = final_number(completion) is not None
    return exact_number(completion, item) or (0.1 if given else 0.0)


def resolve_reward(name: str) -> Reward:
    """A registered reward by name, or `module:function` imported."""
    if name in REWARDS:
        return REWARDS[name]
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            function = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise UserError(
                f"grpo.reward = {name!r} cannot be imported ({exc}); check the module path."
            ) from exc
        if not callable(function):
            raise UserError(f"grpo.reward = {name!r} is not a function.")
        return function
    raise UserError(
        f"grpo.reward = {name!r} is not a registered reward ({', '.join(sorted(REWARDS))}) nor a "
        f"`module:function` path."
    )
