"""The tokenizer commands: `smelt tokenizer train` and `smelt tokenizer eval`."""

from __future__ import annotations

import argparse
from pathlib import Path

from smelt.arguments import add_config_args, group
from smelt.errors import UserError


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    actions = group(
        subparsers, "tokenizer", "train a tokenizer", "Tokenizer commands.", "tokenizer_command", "ACTION"
    )
    p = actions.add_parser(
        "train",
        help="train a byte-level BPE tokenizer on the train split",
        description="Train byte-level BPE on a sample of the curated train split.",
    )
    add_config_args(p)
    p.set_defaults(func=_train)

    p = actions.add_parser(
        "eval",
        help="bytes per token, fertility and more, per source and language",
        description="Evaluate the run's tokenizer (or several, or one per vocab size) on a documents "
        "split: bytes per token, fertility, continued-word rate, longest and unused tokens; "
        "writes a table, JSON and an SVG plot under RUN/tokenizer_eval/.",
    )
    add_config_args(p, force=False)
    p.add_argument(
        "--tokenizer",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="compare this tokenizer directory too (repeatable)",
    )
    p.add_argument(
        "--vocab-sizes",
        default="",
        metavar="N,N,...",
        help="train one tokenizer per vocab size with [tokenizer] and compare them",
    )
    p.add_argument("--split", default="val", help="documents split to measure on (default: val)")
    p.set_defaults(func=_eval)


def _train(args: argparse.Namespace) -> int:
    from smelt.pipeline_commands import run_stage_command

    return run_stage_command("tokenizer", args.config, args.overrides, args.force)


def _eval(args: argparse.Namespace) -> int:
    from smelt.config import load_config
    from smelt.tokenizer.evaluate import document_groups, evaluate_tokenizers, train_and_evaluate

    cfg = load_config(args.config, args.overrides)
    documents, out_dir = cfg.run_dir / "documents", cfg.run_dir / "tokenizer_eval"
    if args.vocab_sizes:
        try:
            sizes = [int(x) for x in args.vocab_sizes.split(",") if x.strip()]
        except ValueError as exc:
            raise UserError(
                f"--vocab-sizes {args.vocab_sizes!r} must be integers separated by commas."
            ) from exc
        report = train_and_evaluate(cfg.tokenizer, documents, out_dir, cfg.run.seed, sizes, args.split)
    else:
        tokenizers: dict[str, Path] = {}
        if (cfg.run_dir / "tokenizer" / "tokenizer.json").is_file():
            tokenizers["run"] = cfg.run_dir / "tokenizer"
        for item in args.tokenizer:
            name, sep, directory = item.partition("=")
            if not sep or not name:
                raise UserError(
                    f"--tokenizer {item!r} must be NAME=DIR, e.g. --tokenizer big=runs/x/tokenizer."
                )
            tokenizers[name] = Path(directory)
        report = evaluate_tokenizers(tokenizers, document_groups(documents, args.split), out_dir)
    print(report["table"])
    for kind, path in report.get("paths", {}).items():
        print(f"  {kind:<5} {path}")
    return 0
