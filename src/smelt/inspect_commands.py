"""`smelt inspect ...`: one word for looking inside the artifacts of several stages. Each verb's parser
and handler belong to its package (`add_inspect_parsers` in its commands module)."""

from __future__ import annotations

import argparse

from smelt.data.commands import add_inspect_parsers as add_document_verbs
from smelt.tokens.commands import add_inspect_parsers as add_token_verbs


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    inspect = subparsers.add_parser(
        "inspect", help="look inside artifacts", description="Inspection commands."
    )
    looks = inspect.add_subparsers(dest="inspect_command", metavar="WHAT", required=True)
    add_token_verbs(looks)  # shards, batches
    add_document_verbs(looks)  # documents
