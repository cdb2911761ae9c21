"""The tokenizer commands: `smelt tokenizer train` and `smelt tokenizer eval`."""

from __future__ import annotations

import argparse
from pathlib import Path

from smelt.cli.arguments import add_common, add_config_args, group
from smelt.errors import UserError
from smelt.layout import TOKENIZER_JSON


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
        "split, or on any text with --data: bytes per token, fertility, continued-word rate, longest and "
        "unused tokens; writes a table, JSON and an SVG plot under RUN/tokenizer_eval/ (or --out).",
    )
    p.add_argument(
        "config", nargs="?", default=None, help="pipeline TOML file (optional with --data and --tokenizer)"
    )
    add_common(p, force=False)
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
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="PATH",
        help="measure on a text set instead of the curated split: a .txt, .md, .jsonl, .jsonl.gz or .parquet "
        "file, or a folder of them, one group per file (repeatable); no curation config needed",
    )
    p.add_argument(
        "--data-field",
        default="text",
        help="--data jsonl field / parquet column holding the text (default: text)",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="write tokenizer_eval.{json,md,svg} here (default: RUN/tokenizer_eval; with --data and no "
        "--out, the table is only printed)",
    )
    p.set_defaults(func=_eval)


def _train(args: argparse.Namespace) -> int:
    from smelt.cli.pipeline import run_stage_command

    return run_stage_command("tokenizer", args.config, args.overrides, args.force)


def _eval(args: argparse.Namespace) -> int:
    from smelt.config import load_config
    from smelt.tokenizer.evaluate import document_groups, evaluate_tokenizers, train_and_evaluate

    if args.config is None and not args.data:
        raise UserError(
            "smelt tokenizer eval needs a pipeline config (its curated documents and tokenizer), or --data PATH "
            "with --tokenizer NAME=DIR to measure a tokenizer on any text."
        )
    cfg = load_config(args.config, args.overrides) if args.config is not None else None
    if cfg is None and args.overrides:
        raise UserError(f"--set {args.overrides[0]} needs a pipeline config to apply to; pass CONFIG first.")
    groups = _data_groups(args.data, args.data_field) if args.data else None
    out_dir = Path(args.out) if args.out else None
    if out_dir is None and cfg is not None and groups is None:
        out_dir = cfg.run_dir / "tokenizer_eval"  # the run's own figures (the report reads them)
    if args.vocab_sizes:
        if cfg is None:
            raise UserError(
                "--vocab-sizes trains one tokenizer per size on a run's curated documents: pass the pipeline "
                "config (`smelt tokenizer eval CONFIG --vocab-sizes ... --data PATH`)."
            )
        try:
            sizes = [int(x) for x in args.vocab_sizes.split(",") if x.strip()]
        except ValueError as exc:
            raise UserError(
                f"--vocab-sizes {args.vocab_sizes!r} must be integers separated by commas."
            ) from exc
        trained = out_dir or cfg.run_dir / "tokenizer_eval"  # the tokenizers trained go there
        report = train_and_evaluate(
            cfg.tokenizer, cfg.run_dir / "documents", trained, cfg.run.seed, sizes, args.split, groups=groups
        )
    else:
        tokenizers: dict[str, Path] = {}
        if cfg is not None and (cfg.run_dir / "tokenizer" / TOKENIZER_JSON).is_file():
            tokenizers["run"] = cfg.run_dir / "tokenizer"
        for item in args.tokenizer:
            name, sep, directory = item.partition("=")
            if not sep or not name:
                raise UserError(
                    f"--tokenizer {item!r} must be NAME=DIR, e.g. --tokenizer big=runs/x/tokenizer."
                )
            tokenizers[name] = Path(directory)
        if not tokenizers and cfg is None:
            raise UserError(
                "--data without a pipeline config needs the tokenizer to measure: --tokenizer NAME=DIR "
                "(a directory with tokenizer.json, e.g. runs/quickstart/tokenizer)."
            )
        if groups is None:
            groups = document_groups(cfg.run_dir / "documents", args.split)
        report = evaluate_tokenizers(tokenizers, groups, out_dir)
    print(report["table"])
    for kind, path in report.get("paths", {}).items():
        print(f"  {kind:<5} {path}")
    return 0


# Bytes of text measured per group, as for a curated split (tokenizer.evaluate.document_groups).
DATA_BYTES_PER_GROUP = 1_000_000


def _data_groups(paths: list[str], field: str) -> dict[str, list[str]]:
    """--data sets as groups, one per file (eval/text_sets.py reads them, as for `smelt eval --data`)."""
    from smelt.eval.text_sets import text_set_groups

    return text_set_groups(paths, field, DATA_BYTES_PER_GROUP)
