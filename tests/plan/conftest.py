"""Helpers for the planning tests: run the planning commands as the `smelt` CLI does."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import pytest

from smelt.errors import UserError
from smelt.plan import commands


def _wired_into_cli() -> bool:
    from smelt.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return "ladder" in sub.choices and "scaling" in sub.choices


def smelt(argv: Sequence[str]) -> int:
    """`smelt ARGV` for the planning commands: through smelt.cli once it hooks them in, else through
    the same two calls on a bare parser, with cli.py's contract (UserError -> exit 2 and a message)."""
    if _wired_into_cli():
        from smelt.cli import main

        return main(list(argv))
    parser = argparse.ArgumentParser(prog="smelt")
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan")
    commands.add_parsers(sub, plan.add_subparsers(dest="plan_command", required=True))
    args = parser.parse_args(list(argv))
    try:
        result = commands.run(args)
    except UserError as exc:
        import sys

        print(f"smelt: error: {exc}", file=sys.stderr)
        return 2
    assert result is not None
    return result


@pytest.fixture
def cli():
    return smelt
