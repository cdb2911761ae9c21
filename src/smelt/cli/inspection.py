"""`smelt inspect ...`: one word for looking inside the artifacts of several stages. Each verb's parser
and handler belong to its package (`add_inspect_parsers` in its commands module); `smelt inspect
langid`, which looks at any text rather than an artifact, is defined here over data/langid.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from smelt.cli.data import add_inspect_parsers as add_document_verbs
from smelt.cli.tokens import add_inspect_parsers as add_token_verbs
from smelt.data.langid import BACKENDS as LANGID_BACKENDS


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    inspect = subparsers.add_parser(
        "inspect", help="look inside artifacts", description="Inspection commands."
    )
    looks = inspect.add_subparsers(dest="inspect_command", metavar="WHAT", required=True)
    add_token_verbs(looks)  # shards, batches
    add_document_verbs(looks)  # documents
    add_langid_verb(looks)  # langid


def add_langid_verb(looks: argparse._SubParsersAction) -> None:
    p = looks.add_parser(
        "langid",
        help="language id of a file or folder of text; per-language accuracy when file names are labels",
        description="Classify every text under PATH as `smelt curate` does (data.langid): each non-empty line "
        "of a .txt/.md file (or the whole file with --unit file) and each record of a .jsonl/.jsonl.gz file. "
        "Prints the languages found or, with --labels, each language's accuracy and its wrong answers.",
    )
    p.add_argument("path", metavar="FILE|DIR", help="a text file or a folder of them")
    p.add_argument(
        "--labels",
        choices=("none", "file", "dir"),
        default="none",
        help="the language each text is in: the file name before its first dot (file: de.txt), its top "
        "folder (dir: de/...), or none (default: list the languages found)",
    )
    p.add_argument(
        "--unit", choices=("line", "file"), default="line", help="a text file's texts (default: line)"
    )
    p.add_argument("--backend", choices=LANGID_BACKENDS, default="py3langid", help="as data.langid.backend")
    p.add_argument("--max-chars", type=int, default=1000, help="as data.langid.max_chars (default: 1000)")
    p.add_argument("--limit", type=int, default=0, help="texts per file (default: 0, all)")
    p.add_argument("--field", default="text", help="jsonl: the field holding the text (default: text)")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the figures as JSON to PATH")
    p.set_defaults(func=_inspect_langid)


def _inspect_langid(args: argparse.Namespace) -> int:
    from smelt.data.langid import format_langid, langid_report, langid_texts
    from smelt.errors import UserError

    if args.limit < 0 or args.max_chars < 1:
        raise UserError("--limit must be 0 (all) or more, and --max-chars 1 or more.")
    items = langid_texts(Path(args.path), args.labels, args.unit, args.field, args.limit)
    report = langid_report(items, args.backend, args.max_chars)
    print(format_langid(report))
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps({"path": args.path, "label_source": args.labels, **report}, indent=2) + "\n"
        )
        print(f"written: {out}")
    return 0
