"""The evaluation command: `smelt eval RUN [--checkpoint latest|all|STEP] [--tasks ...]`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from smelt.cli.arguments import add_common
from smelt.config import Config
from smelt.errors import UserError


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval",
        help="held-out loss, bits-per-byte, benchmark tasks and gallery of checkpoints",
        description="Evaluate a run: RUN is a run directory (e.g. runs/quickstart) or its "
        "pipeline TOML file. Writes RUN/eval/step_NNNNNNN.json per checkpoint, and RUN/eval/curves.jsonl "
        "and RUN/eval/gallery.json across the evaluated checkpoints.",
    )
    p.add_argument("run", help="run directory or pipeline TOML file")
    p.add_argument(
        "--checkpoint",
        default="latest",
        help="latest (default), all (every retained checkpoint not yet evaluated) or a step number",
    )
    p.add_argument(
        "--tasks",
        default=None,
        help="comma-separated task names or task files (NAME.toml paths) (default: eval.tasks); '' for none",
    )
    p.add_argument("--limit", type=int, default=None, help="items per task (default: eval.limit; 0: all)")
    p.add_argument(
        "--tasks-dir", default=None, help="benchmark files and task files (default: eval.tasks_dir)"
    )
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="PATH",
        help="score bits per byte on a text set (.txt, .md, .jsonl, .jsonl.gz, .parquet, or a folder of "
        "them) next to gzip and xz on the same bytes, instead of the run's validation split (repeatable)",
    )
    p.add_argument(
        "--data-field",
        default="text",
        help="--data jsonl field / parquet column holding the text (default: text)",
    )
    p.add_argument(
        "--contamination",
        action="store_true",
        help="the contamination meter instead: benchmark items against swapped-answer controls, and the "
        "canaries' memorisation (RUN/eval/contamination/; --tasks and --limit choose the items)",
    )
    add_common(p)
    p.set_defaults(func=_eval)


def _eval(args: argparse.Namespace) -> int:
    from smelt.run.summary import eval_rows
    from smelt.tables import print_table

    cfg = config_for_run(args.run, args.overrides)
    if args.tasks_dir is not None:
        cfg.eval.tasks_dir = args.tasks_dir
    if args.contamination:
        return _contamination(cfg, args)
    if args.checkpoint != "latest" or args.tasks is not None or args.limit is not None or args.data:
        return _eval_checkpoint(
            cfg, args.checkpoint, args.tasks, args.limit, args.force, args.data, args.data_field
        )
    from smelt.eval.run import TasksLeftOut, evaluate_checkpoints, write_views
    from smelt.run.pipeline import run_stage

    try:
        outcome = run_stage(cfg, "eval", force=args.force, check_upstream=True)
        result = outcome.result
        if outcome.skipped:
            # The stage's manifest holds its config and upstream artifacts, not the content of the task
            # and benchmark files: score what changed there (nothing, when nothing did).
            (result,) = evaluate_checkpoints(cfg, cfg.run_dir, "latest")
    except TasksLeftOut as exc:  # the good tasks were scored: show them, then name the bad ones
        write_views(cfg.run_dir / "eval")
        for result in exc.results:
            print_table(eval_rows(result))
        raise
    write_views(cfg.run_dir / "eval")
    print_table(eval_rows(result))
    return 0


def config_for_run(run: str, overrides: list[str]) -> Config:
    """The config of a run directory (its config.json, followed if the run was moved), or of a
    pipeline TOML file, with `overrides` applied."""
    from smelt.config import load_config

    path = Path(run)
    if path.is_dir():
        saved = path / "config.json"
        if not saved.is_file():
            raise UserError(
                f"{path} is not a smelt run directory (no config.json). Pass a run directory "
                f"written by `smelt run`, e.g. runs/quickstart, or its pipeline TOML file."
            )
        from smelt.config import apply_override, config_from_dict

        raw = json.loads(saved.read_text())
        for item in overrides:
            apply_override(raw, item)
        cfg = config_from_dict(raw, origin=str(saved))
        if cfg.run_dir.resolve() != path.resolve():  # the run was moved: follow it
            cfg.run.dir, cfg.run.name = str(path.parent), path.name
        return cfg
    return load_config(path, overrides)


def _eval_checkpoint(
    cfg: Config,
    checkpoint: str,
    tasks: str | None,
    limit: int | None,
    force: bool = False,
    data: list[str] | None = None,
    data_field: str = "text",
) -> int:
    """Score what the checkpoints' step files lack of what was asked for, and print what was asked
    for (a step file may hold more: other tasks and text sets scored before)."""
    from smelt.eval.run import TasksLeftOut, evaluate_checkpoints, plan_request
    from smelt.run.summary import eval_rows
    from smelt.tables import print_table

    if limit is not None and limit < 0:
        raise UserError(f"--limit {limit} must be 0 (every item) or a positive number of items per task.")
    names = None if tasks is None else [t.strip() for t in tasks.split(",") if t.strip()]
    if data and names is None:
        names = []  # --data alone scores the text sets only
    request = plan_request(cfg, cfg.run_dir, names, limit, data or (), data_field, heldout=not data)
    left_out = None
    try:
        results = evaluate_checkpoints(cfg, cfg.run_dir, checkpoint, force=force, request=request)
    except TasksLeftOut as exc:  # the good tasks were scored: show them, then name the bad ones
        left_out, results = exc, exc.results
    for result in results:
        asked = {**result, "tasks": {n: t for n, t in result.get("tasks", {}).items() if n in request.specs}}
        if data:
            asked.pop("heldout", None)
        print_table(eval_rows(asked) + data_rows(result, list(request.data)))
        print()
    print(f"written: {cfg.run_dir / 'eval'} (step files, curves.jsonl, gallery.json)")
    if left_out is not None:
        raise left_out
    return 0


def data_rows(result: dict, labels: list[str]) -> list[tuple[str, str]]:
    """One row per text set: the model's bits per byte, then the compressors' on the same bytes."""
    rows = []
    for label in labels:
        f = result.get("data", {})[label]
        rows.append(
            (
                f"{label}: loss / bits-per-byte",
                f"{f['loss']:.4f} / {f['bits_per_byte']:.4f} "
                f"({f['documents']} documents, {f['bytes']:,} bytes, {f['tokens']:,} tokens)",
            )
        )
        rows.append((f"{label}: gzip / xz bits-per-byte", f"{f['gzip_bits_per_byte']:.4f} / "
                     f"{f['xz_bits_per_byte']:.4f} whole set; {f['gzip_window_bits_per_byte']:.4f} / "
                     f"{f['xz_window_bits_per_byte']:.4f} per {f['seq_len']}-token window"))  # fmt: skip
    return rows


def _contamination(cfg: Config, args: argparse.Namespace) -> int:
    from smelt.eval.contamination_run import contamination_rows, evaluate_contamination
    from smelt.tables import print_table

    if args.data:
        raise UserError("--contamination and --data are separate runs: drop --data, or run it on its own.")
    if args.limit is not None and args.limit < 0:
        raise UserError(
            f"--limit {args.limit} must be 0 (every item) or a positive number of items per task."
        )
    names = None if args.tasks is None else [t.strip() for t in args.tasks.split(",") if t.strip()]
    for result in evaluate_contamination(cfg, args.checkpoint, names or None, args.limit, args.force):
        print_table(contamination_rows(result))
        print()
    print(f"written: {cfg.run_dir / 'eval' / 'contamination'}")
    return 0
