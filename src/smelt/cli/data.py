"""The curation commands: `smelt curate`, `smelt curate quality-train` and `smelt inspect documents`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from smelt.cli.arguments import add_config_args, add_stage_output_args


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "curate",
        help="raw files -> documents (and `curate quality-train`)",
        description="Read the sources of [data], extract, normalize, identify languages, filter, score, "
        "scrub PII, deduplicate, split, and write documents/<split>/<source>/part-NNNNN.parquet. "
        "`smelt curate quality-train CONFIG` trains the quality classifier that data.quality.model names.",
    )
    add_config_args(p)
    add_stage_output_args(p, "documents")
    p.set_defaults(func=_curate)


def add_inspect_parsers(looks: argparse._SubParsersAction) -> None:
    """`smelt inspect documents` (smelt.cli.inspection gathers the verbs)."""
    p = looks.add_parser(
        "documents",
        help="read kept, dropped or quarantined documents with reasons and scores",
        description="Print documents of a curate run: --dropped-by STEP (what a step removed, with "
        "the rule and scores), --quarantined (unreadable records and why), or --kept (a seeded "
        "sample of kept documents with their meta).",
    )
    p.add_argument("documents", help="documents directory or run directory, e.g. runs/quickstart")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--dropped-by", metavar="STEP", help="documents a step dropped")
    what.add_argument("--quarantined", action="store_true", help="quarantined records")
    what.add_argument("--kept", action="store_true", help="a random sample of kept documents")
    p.add_argument("--reason", default=None, help="only this drop or quarantine reason")
    p.add_argument("--source", default=None, help="only this source")
    p.add_argument("--split", default=None, help="--kept: only this split")
    p.add_argument("-n", type=int, default=20, help="how many documents (default: 20)")
    p.add_argument("--chars", type=int, default=2000, help="characters of text shown per document")
    p.add_argument("--seed", type=int, default=0, help="--kept: sample seed")
    p.set_defaults(func=_inspect_documents)


def verb_parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Verbs argparse cannot nest: `curate quality-train CONFIG` beside `curate CONFIG`."""
    p = argparse.ArgumentParser(
        prog="smelt curate quality-train",
        description="Train the quality classifier (hashed word n-gram logistic regression) on the "
        "sources named by data.quality.positive_sources and negative_sources; then set "
        "data.quality.model to the file it writes.",
    )
    add_config_args(p, force=False)
    p.add_argument("--out", default=None, help="model file (default: RUN/quality/model.safetensors)")
    p.set_defaults(command="curate-quality-train", func=_quality_train)
    return {("curate", "quality-train"): p}


def _curate(args: argparse.Namespace) -> int:
    from smelt.cli.pipeline import run_stage_command

    overrides = list(args.overrides)
    if args.workers is not None:
        overrides.append(f"data.workers={args.workers}")
    code = run_stage_command("curate", args.config, overrides, args.force)
    if code == 0 and args.publish:
        from smelt.config import load_config
        from smelt.data.curate import OWNED_OUTPUTS
        from smelt.layout import stage_dir
        from smelt.manifest import MANIFEST
        from smelt.storage import publish

        documents = stage_dir(load_config(args.config, overrides).run_dir, "curate")
        publish(documents, args.publish, "curate", OWNED_OUTPUTS, last=("stats.json", MANIFEST))
    return code


def _quality_train(args: argparse.Namespace) -> int:
    from smelt.config import load_config
    from smelt.data.quality import train_quality
    from smelt.tables import flat, print_table

    cfg = load_config(args.config, args.overrides)
    out = Path(args.out) if args.out else cfg.run_dir / "quality" / "model.safetensors"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = train_quality(cfg, out)
    print_table([(k, v) for k, v in flat(result).items()])
    print(f"\nquality classifier -> {out}\nuse it: --set data.quality.model={json.dumps(str(out))}")
    return 0


def _inspect_documents(args: argparse.Namespace) -> int:
    from smelt.data import review

    path = Path(args.documents)
    if args.kept:
        text = review.kept(path, args.source, args.split, args.n, args.chars, args.seed)
    elif args.quarantined:
        text = review.dropped_or_quarantined(
            path, review.QUARANTINED, None, args.reason, args.source, args.n, args.chars
        )
    else:
        text = review.dropped_or_quarantined(
            path, review.DROPPED, args.dropped_by, args.reason, args.source, args.n, args.chars
        )
    print(text)
    return 0
