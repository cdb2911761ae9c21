"""The token commands: `smelt tokenize`, `smelt inspect shards` and `smelt inspect batches`."""

from __future__ import annotations

import argparse
from pathlib import Path

from smelt.cli.arguments import add_config_args, add_stage_output_args


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "tokenize",
        help="documents -> token shards",
        description="Encode every split and source into tokens/<split>/<source>/NNNNN.bin + .idx.",
    )
    add_config_args(p)
    add_stage_output_args(p, "tokens")
    p.set_defaults(func=_tokenize)


def add_inspect_parsers(looks: argparse._SubParsersAction) -> None:
    """`smelt inspect shards` and `smelt inspect batches` (smelt.cli.inspection gathers the verbs)."""
    p = looks.add_parser(
        "shards",
        help="decode a window of a token shard with document boundaries marked",
        description="Decode tokens of one shard, marking where each document begins, and "
        "summarize token frequencies.",
    )
    p.add_argument("tokens", help="tokens directory of a run, e.g. runs/quickstart/tokens")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the run's)")
    p.add_argument("--split", default="train")
    p.add_argument("--source", required=True, help="source name")
    p.add_argument("--shard", type=int, default=0)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--length", type=int, default=256)
    p.set_defaults(func=_inspect_shards)

    p = looks.add_parser(
        "batches",
        help="decode what the model sees at a training step, with sources and document boundaries",
        description="Decode the global batch of step N: the source of every row and where each document "
        "starts. For a release (`smelt release`), replayed from its data order and the token shards; for a run "
        "directory or a pipeline TOML file, recomputed by the run's loader (mixture, curriculum, shuffle, packing).",
    )
    add_config_args(p, "a release directory, a run directory or a pipeline TOML file", force=False)
    p.add_argument(
        "--tokens", default=None, help="a release's token shards (default: its tokens/, else the run's)"
    )
    p.add_argument("--step", type=int, required=True, help="optimizer step (1 is the first)")
    p.add_argument("--rows", type=int, default=8, help="rows of the global batch to show (0: all)")
    p.set_defaults(func=_inspect_batches)


def _tokenize(args: argparse.Namespace) -> int:
    from smelt.cli.pipeline import run_stage_command

    overrides = list(args.overrides)
    if args.workers is not None:
        overrides.append(f"tokens.workers={args.workers}")
    code = run_stage_command("tokenize", args.config, overrides, args.force)
    if code == 0 and args.publish:
        from smelt.config import load_config
        from smelt.layout import stage_dir
        from smelt.manifest import MANIFEST
        from smelt.storage import publish
        from smelt.tokens.shards import SHARDS_JSON, STATS_JSON

        tokens = stage_dir(load_config(args.config, overrides).run_dir, "tokenize")
        splits = [p.name for p in tokens.iterdir() if p.is_dir()]
        publish(tokens, args.publish, "tokenize", splits, last=(STATS_JSON, SHARDS_JSON, MANIFEST))
    return code


def _inspect_shards(args: argparse.Namespace) -> int:
    from smelt.tokens.decoded import describe_window

    tokens = Path(args.tokens)
    tokenizer = Path(args.tokenizer) if args.tokenizer else tokens.parent / "tokenizer"
    print(describe_window(tokens, args.split, args.source, args.shard, args.start, args.length, tokenizer))
    return 0


def _inspect_batches(args: argparse.Namespace) -> int:
    from smelt.tokens.batches import inspect_batches

    return inspect_batches(args)
