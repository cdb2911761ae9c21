"""The checkpoint commands: `smelt export hf` and `smelt checkpoint list|verify|average|drill`."""

from __future__ import annotations

import argparse
from pathlib import Path

from smelt.cli.arguments import group


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    formats = group(
        subparsers,
        "export",
        "export a checkpoint for other tools",
        "Export commands.",
        "export_format",
        "FORMAT",
    )
    p = formats.add_parser(
        "hf",
        help="a Hugging Face folder (config.json, model.safetensors, tokenizer)",
        description="Write RUN/export/hf/, which transformers loads with "
        "AutoModelForCausalLM and AutoTokenizer.",
    )
    p.add_argument("run", help="run directory, e.g. runs/quickstart")
    p.add_argument(
        "--checkpoint", default="latest", help="latest (default), a step number or a checkpoint directory"
    )
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--out", default=None, help="output folder (default: RUN/export/hf)")
    p.set_defaults(func=_export_hf)

    actions = group(
        subparsers,
        "checkpoint",
        "list, verify and average checkpoints",
        "Checkpoint commands.",
        "checkpoint_command",
        "ACTION",
    )
    p = actions.add_parser(
        "list",
        help="every checkpoint of a run: step, tokens, size, committed, milestone",
        description="Table of RUN/train/checkpoints: step, tokens seen, size on disk, whether the save "
        "committed, milestone, weights-only; --verify also checks every file's sha256.",
    )
    p.add_argument("run", help="run directory (or its train/checkpoints folder)")
    p.add_argument("--verify", action="store_true", help="check every checksum (reads every file)")
    p.set_defaults(func=_list)

    p = actions.add_parser(
        "verify",
        help="check a checkpoint's files against their sha256 (exit 2 naming a damaged file)",
        description="Verify the latest committed checkpoint of RUN (or --step S, or --all, or RUN "
        "itself when it is a checkpoint directory); exit code 2 names the first damaged file.",
    )
    p.add_argument("run", help="run directory, its train/checkpoints folder, or one checkpoint directory")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, default=None, help="the checkpoint of this step")
    which.add_argument("--all", action="store_true", help="every committed checkpoint")
    p.set_defaults(func=_verify)

    p = actions.add_parser(
        "average",
        help="average the weights of several checkpoints into a new weights-only checkpoint",
        description="Uniform average (or, with --ema, an exponential moving average in step order) of the "
        "model weights of the last N or the chosen checkpoints, written as a new committed checkpoint "
        "without optimizer state (default: RUN/averaged/step_NNNNNNN-avgN), for eval and export.",
    )
    p.add_argument("run", help="run directory (or its train/checkpoints folder)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--last", type=int, metavar="N", help="the N newest checkpoints")
    which.add_argument("--steps", type=int, nargs="+", metavar="STEP", help="these steps")
    p.add_argument("--ema", type=float, default=None, metavar="DECAY", help="EMA with this decay, e.g. 0.9")
    p.add_argument("--out", default=None, help="checkpoint directory to write")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=_average)

    p = actions.add_parser(
        "drill",
        help="restore drill: replay the steps after the newest checkpoint and compare with metrics.jsonl",
        description="Resume the newest committed checkpoint of RUN that has logged steps after it in a side "
        "process (nothing is written into RUN), run the next steps and compare their losses and gradient "
        "norms with RUN/train/metrics.jsonl: exact on the CPU in fp32, within a tolerance otherwise. "
        "Exit 0 on a match, 1 on a mismatch, 2 on a user error.",
    )
    p.add_argument("run", help="run directory (or its train/checkpoints folder)")
    p.add_argument("--step", type=int, default=None, help="drill this checkpoint step instead of the newest")
    p.add_argument("--steps", type=int, default=None, help="steps to replay (default: one log window)")
    p.add_argument("--tolerance", type=float, default=None, help="relative tolerance instead of the default")
    p.set_defaults(func=_drill)


def _list(args: argparse.Namespace) -> int:
    from smelt.checkpoint.tools import list_table

    print(list_table(args.run, verify=args.verify))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from smelt.checkpoint.tools import corrupt_error, verify_lines

    # Each checkpoint's status on stdout; only the corrupt ones are errors (stderr, exit 2).
    lines, failures = verify_lines(args.run, step=args.step, every=args.all)
    print("\n".join(lines))
    if failures:
        raise corrupt_error(lines, failures)
    return 0


def _average(args: argparse.Namespace) -> int:
    from smelt.checkpoint.tools import average_run

    out, summary = average_run(args.run, args.last, args.steps, args.ema, args.out, args.force)
    kind = f"EMA (decay {args.ema:g})" if args.ema is not None else "uniform average"
    print(f"{kind} of steps {', '.join(map(str, summary['sources']))} -> {out}")
    print("a weights-only checkpoint: evaluate or export it by its directory; it cannot be resumed")
    return 0


def _drill(args: argparse.Namespace) -> int:
    from smelt.checkpoint.drill import DrillFailed, drill_report, run_drill

    try:
        result = run_drill(args.run, steps=args.steps, step=args.step, tolerance=args.tolerance)
    except DrillFailed as exc:
        print(f"FAIL: {exc}")
        return 1
    print(drill_report(result))
    return 0 if result.passed else 1


def _export_hf(args: argparse.Namespace) -> int:
    from smelt.checkpoint.export import export_hf
    from smelt.layout import checkpoints_dir, resolve_checkpoints
    from smelt.tables import flat, print_table

    run = Path(args.run)
    (checkpoint,) = resolve_checkpoints(checkpoints_dir(run), args.checkpoint, allow_all=False)
    out = Path(args.out) if args.out else run / "export" / "hf"
    summary = export_hf(checkpoint, run / "tokenizer", out, dtype=args.dtype)
    print_table([(k, v) for k, v in flat(summary).items()])
    return 0
