"""Environment variables in config strings: `${NAME}` and `${NAME:-default}`, as in a POSIX shell.

One config file then serves machines that keep data in different places, e.g.
`root = "${SMELT_SHARED_DATA:-../shared/data}/corpus/prose"`. Only this exact form is expanded (a
bare `$NAME` is left alone, so regexes and prices in strings are safe); `$${` writes a literal `${`.
"""

from __future__ import annotations

import os
import re

from smelt.errors import ConfigError

_REFERENCE = re.compile(r"\$(\$?)\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}")


def expand_env(value: str, key: str, origin: str) -> str:
    """`value` with each `${NAME}` replaced by the variable and each `${NAME:-default}` by the variable,
    or by `default` when it is unset or empty. A `${NAME}` whose variable is unset or empty is an error
    naming the key and how to fix it."""
    if "${" not in value:
        return value

    def replace(match: re.Match) -> str:
        escaped, name, has_default, default = match.groups()
        if escaped:
            return match.group(0)[1:]
        found = os.environ.get(name, "")
        if found:
            return found
        if has_default:
            return default
        raise ConfigError(
            f"{origin}: {key} = {value!r} uses the environment variable {name}, which is not set. "
            f"Set it (export {name}=...), or give a default in the config: ${{{name}:-default}}."
        )

    return _REFERENCE.sub(replace, value)
