"""`smelt quickstart` and `smelt run`, and the two ways every stage command ends: one stage run and
its result table (`run_stage_command`), or the whole chain and its summary (`run_all`)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from smelt.cli.arguments import add_common, add_config_args
from smelt.config import Config, load_config

QUICKSTART_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "quickstart.toml"


def add_fork_and_restart_args(parser: argparse.ArgumentParser) -> None:
    """The flags `smelt run` and `smelt train` share: --restart, --from, and the supervisor's."""
    parser.add_argument(
        "--restart",
        action="store_true",
        help="start a stage whose plan changed over: its old directory (checkpoints and all) is "
        "moved to RUN/superseded/, never deleted",
    )
    parser.add_argument(
        "--from",
        dest="init_from",
        default=None,
        metavar="RUN[:STEP]",
        help="fork: start from that run's checkpoint (newest, or STEP; or a step_NNNNNNN dir) "
        "under this config's plan (same as --set train.init_from=...)",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="relaunch after a crash (resuming from the latest checkpoint) up to N times, "
        "then give up with a summary; restarts go to RUN/restarts.jsonl (default: 0)",
    )
    parser.add_argument(
        "--restart-backoff",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="wait before the first restart, doubled for each next one, at most 300 s (default: 5)",
    )


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "quickstart",
        help="the whole pipeline on the built-in corpus (Python's stdlib)",
        description="Run configs/quickstart.toml: curate the .py files of this Python's "
        "standard library, train a tokenizer and a small model, evaluate it.",
    )
    add_common(p)
    p.add_argument("--run-dir", default=None, help="parent directory for the run (default: runs)")
    p.set_defaults(func=_quickstart)

    p = subparsers.add_parser(
        "run",
        help="all stages of a pipeline, skipping the ones that are up to date",
        description="Run curate, tokenizer, tokenize, train and eval in order.",
    )
    add_config_args(p)
    add_fork_and_restart_args(p)
    p.set_defaults(func=_run)


def with_init_from(overrides: list[str], init_from: str | None) -> list[str]:
    """`--from X` is `--set train.init_from=X`."""
    return [*overrides, f"train.init_from={json.dumps(init_from)}"] if init_from else list(overrides)


def _quickstart(args: argparse.Namespace) -> int:
    from smelt.run.pipeline import STAGES

    overrides = list(args.overrides)
    if args.run_dir:
        overrides.append(f"run.dir={json.dumps(args.run_dir)}")
    return run_all(load_config(QUICKSTART_CONFIG, overrides), args.force, STAGES)


def _run(args: argparse.Namespace) -> int:
    from smelt.run.pipeline import STAGES, run_pipeline

    overrides = with_init_from(args.overrides, args.init_from)
    cfg = load_config(args.config, overrides)
    if not args.max_restarts:
        return run_all(cfg, args.force, STAGES, restart=args.restart)
    # The stages before training here, training as a supervised child (relaunched from its latest
    # checkpoint after a crash), then the rest, which finds training done.
    from smelt.train.ops.supervise import run_supervised

    run_pipeline(cfg, STAGES[: STAGES.index("train")], force=args.force, restart=args.restart)
    code = run_supervised(
        args.config,
        overrides,
        args.max_restarts,
        args.restart_backoff,
        force=args.force,
        restart=args.restart,
    )
    return code if code else run_all(cfg, False, STAGES)


def run_all(cfg: Config, force: bool, stages: tuple[str, ...], restart: bool = False) -> int:
    """Run `stages` in order, write RUN/summary.json and the run report, print the summary."""
    from smelt.manifest import write_json
    from smelt.report.single import write_run_report
    from smelt.run.pipeline import run_pipeline
    from smelt.run.summary import print_summary, summarize

    started = time.time()
    outcomes = run_pipeline(cfg, stages, force=force, restart=restart)
    summary = summarize(cfg, outcomes, time.time() - started)
    write_json(cfg.run_dir / "summary.json", summary)
    print_summary(summary)
    print(f"  {'report':<10} {write_run_report(cfg.run_dir)}")
    return 0


def run_stage_command(
    stage: str,
    config: str,
    overrides: list[str],
    force: bool,
    restart: bool = False,
    resume_from: int | None = None,
) -> int:
    """`smelt curate|tokenizer train|tokenize|train CONFIG`: run one stage (checking that its inputs
    are current), then print its result."""
    from smelt.progress import launch_rank
    from smelt.run.pipeline import run_stage
    from smelt.tables import flat, print_table

    cfg = load_config(config, overrides)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    if resume_from is not None:
        from smelt.train.ops.supervise import prepare_resume_from

        prepare_resume_from(cfg, resume_from, restart=force or restart)
    outcome = run_stage(cfg, stage, force=force, restart=restart, check_upstream=True)
    if stage == "train" and launch_rank() == 0:  # `smelt eval RUN` and reports read the run's config
        from smelt.manifest import write_json

        write_json(cfg.run_dir / "config.json", cfg.to_dict())
    if stage == "curate":
        from smelt.data.stats import retention_table

        print(retention_table(outcome.result))
        print(f"\nper source and reason: {outcome.directory / 'stats.json'}; plot: retention.svg")
    else:
        print_table([(k, v) for k, v in flat(outcome.result).items()][:40])
    print(f"\n{stage}: {'up to date' if outcome.skipped else 'done'} -> {outcome.directory}")
    return 0
