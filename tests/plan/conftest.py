"""Helpers for the planning tests: run the planning commands as the `smelt` CLI does."""

from __future__ import annotations

from collections.abc import Sequence

import pytest


def smelt(argv: Sequence[str]) -> int:
    """`smelt ARGV` through smelt.cli (UserError -> exit 2 and a message)."""
    from smelt.cli import main

    return main(list(argv))


@pytest.fixture
def cli():
    return smelt
