"""The evaluation command: `smelt eval RUN [--checkpoint latest|all|STEP] [--tasks ...]`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from smelt.arguments import add_common
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
    p.add_argument("--tasks", default=None, help="comma-separated tasks (default: eval.tasks); '' for none")
    p.add_argument("--limit", type=int, default=None, help="items per task (default: eval.limit; 0: all)")
    p.add_argument("--tasks-dir", default=None, help="benchmark files (default: eval.tasks_dir)")
    add_common(p)
    p.set_defaults(func=_eval)


def _eval(args: argparse.Namespace) -> int:
    from smelt.summary import eval_rows, print_table

    cfg = config_for_run(args.run, args.overrides)
    if args.tasks_dir is not None:
        cfg.eval.tasks_dir = args.tasks_dir
    if args.checkpoint != "latest" or args.tasks is not None or args.limit is not None:
        return _eval_checkpoint(cfg, args.checkpoint, args.tasks, args.limit, args.force)
    from smelt.eval.run import write_views
    from smelt.pipeline import run_stage

    outcome = run_stage(cfg, "eval", force=args.force, check_upstream=True)
    write_views(cfg.run_dir / "eval")
    print_table(eval_rows(outcome.result))
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
    cfg: Config, checkpoint: str, tasks: str | None, limit: int | None, force: bool = False
) -> int:
    from smelt.eval.run import evaluate_checkpoints
    from smelt.summary import eval_rows, print_table

    if limit is not None and limit < 0:
        raise UserError(f"--limit {limit} must be 0 (every item) or a positive number of items per task.")
    names = None if tasks is None else [t.strip() for t in tasks.split(",") if t.strip()]
    results = evaluate_checkpoints(cfg, cfg.run_dir, checkpoint, names, limit, force=force)
    for result in results:
        print_table(eval_rows(result))
        print()
    print(f"written: {cfg.run_dir / 'eval'} (step files, curves.jsonl, gallery.json)")
    return 0
