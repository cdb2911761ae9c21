"""The typed-config engine both config files are read with (the pipeline's `Config` and post-training's
`PostTrainConfig`): TOML in, `section.key=value` overrides, dataclasses out, with field metadata
(`config/fields.option`) giving ranges and choices, and every error naming the key and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import sys
import typing
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from smelt.config.env import expand_env
from smelt.errors import ConfigError


def read_toml(path: Path, missing_hint: str) -> dict[str, Any]:
    """The TOML file's tables; a ConfigError when it is missing (with `missing_hint`) or malformed."""
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist. {missing_hint}")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}. Fix the syntax.") from exc


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one `section.key=value` override; the value is read as TOML, else taken as a string."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} has no '='. Write it as section.key=value, e.g. train.lr=1e-3.")
    key, text = item.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"override key {key!r} must name a section and a key, e.g. train.lr=1e-3.")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    node = raw
    for part in parts[:-1]:
        if part.isdigit() and isinstance(node, list):
            index = int(part)
            if index >= len(node):
                raise ConfigError(
                    f"override {item!r}: index {index} is past the end of the list ({len(node)})."
                )
            node = node[index]
            continue
        node = node.setdefault(part, {})
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"override {item!r}: {part!r} is a value, not a section.")
    node[parts[-1]] = value


def suggest(name: str, options: typing.Iterable[str]) -> str:
    options = [o for o in options if isinstance(o, str)]  # train.compile's choices include true/false
    # A typo usually keeps the real key as a prefix (`lr_typo`, `seq_length`); prefer the longest such key.
    prefixed = [o for o in options if name.startswith(o) and len(o) >= 2]
    close = sorted(prefixed, key=len, reverse=True) or difflib.get_close_matches(
        name, options, n=1, cutoff=0.5
    )
    return f" (did you mean {close[0]!r}?)" if close else ""


def build(cls: type, raw: Any, prefix: str, origin: str) -> Any:
    where = prefix.rstrip(".") or "the top level"
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: {where} must be a table, got {type(raw).__name__}.")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields:
            raise ConfigError(
                f"{origin}: unknown key {prefix}{key}{suggest(key, fields)}. "
                f"Valid keys in {where}: {', '.join(fields)}."
            )
    values = {}
    for name, f in fields.items():
        if name not in raw:
            continue
        values[name] = coerce(hints[name], raw[name], f"{prefix}{name}", f.metadata, origin)
    return cls(**values)


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is list:
        return f"a list of {type_name(typing.get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "true or false",
        dict: "a table",
    }.get(tp, str(tp))


def coerce(tp: Any, value: Any, key: str, meta: typing.Mapping, origin: str) -> Any:
    def wrong() -> ConfigError:
        return ConfigError(
            f"{origin}: {key} must be {type_name(tp)}, got {value!r} ({type(value).__name__}). "
            f"Fix the value in the config or the --set override."
        )

    if dataclasses.is_dataclass(tp):
        return build(tp, value, key + ".", origin)
    if typing.get_origin(tp) is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise wrong()
        return [coerce(item_tp, v, f"{key}[{i}]", {}, origin) for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise wrong()
    elif tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise wrong()
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong()
        value = float(value)
    elif tp is str:
        if not isinstance(value, str):
            raise wrong()
        value = expand_env(value, key, origin)
    elif tp is dict:
        if not isinstance(value, dict):
            raise wrong()
    lo_hi = meta.get("range") if meta else None
    if lo_hi is not None and not (lo_hi[0] <= value <= lo_hi[1]):
        raise ConfigError(
            f"{origin}: {key} = {value!r} is out of range; it must lie in [{num(lo_hi[0])}, {num(lo_hi[1])}]."
        )
    choices = meta.get("choices") if meta else None
    if choices is not None and value not in choices:
        raise ConfigError(
            f"{origin}: {key} = {value!r} is not one of {', '.join(map(repr, choices))}"
            f"{suggest(str(value), choices)}."
        )
    return value


def num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, help) for every key: the reference printed by `smelt config --help`-style output."""
    rows = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            rows += describe(tp, f"{prefix}{f.name}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        rows.append((prefix + f.name, json.dumps(default), f.metadata.get("help", "")))
    return rows
