"""Argument definitions shared by the command modules (`src/smelt/cli/<area>.py`).

Every command module exposes `add_parsers(subparsers)`; `smelt.cli` calls them in the order of its
COMMAND_MODULES. The helpers here keep the common flags (`--set`, `--force`) spelled the
same everywhere, and let two packages put verbs under one word (`smelt inspect documents` from data,
`smelt inspect shards` from tokens). Only argparse is imported: building the parser must stay cheap.
"""

from __future__ import annotations

import argparse


def add_common(parser: argparse.ArgumentParser, force: bool = True) -> None:
    """`--set` for a command that reads a pipeline config; `--force` only where a cached result
    could be reused (a command that recomputes everything every time has nothing to force)."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (repeatable), e.g. --set train.lr=1e-3",
    )
    if force:
        parser.add_argument("--force", action="store_true", help="rerun even when the stage is up to date")


def add_config_args(
    parser: argparse.ArgumentParser, config_help: str = "pipeline TOML file", force: bool = True
) -> None:
    """The positional pipeline file, then `--set` (and `--force`)."""
    parser.add_argument("config", help=config_help)
    add_common(parser, force)


def add_stage_output_args(parser: argparse.ArgumentParser, output: str) -> None:
    """`--workers` and `--publish URL` of a stage that writes RUN/`output` with worker processes."""
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default: the config's)")
    parser.add_argument(
        "--publish",
        metavar="URL",
        default=None,
        help=f"then copy the {output} directory to URL (s3://, gs://, ... through fsspec; "
        "a rerun uploads only what changed)",
    )


def group(
    subparsers: argparse._SubParsersAction,
    name: str,
    help: str,
    description: str,
    dest: str,
    metavar: str,
) -> argparse._SubParsersAction:
    """The verbs under the top-level word `name` (e.g. `inspect`), created by whichever command module
    asks first; later modules add their verbs to the same word."""
    parser = subparsers.choices.get(name)
    if parser is None:
        parser = subparsers.add_parser(name, help=help, description=description)
        return parser.add_subparsers(dest=dest, metavar=metavar, required=True)
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
