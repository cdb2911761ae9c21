"""The report commands: `smelt report RUN [RUN ...]` and `smelt decide TITLE --runs ... --metric M`."""

from __future__ import annotations

import argparse
from pathlib import Path

from smelt.progress import log


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    sub = subparsers
    p = sub.add_parser(
        "report",
        help="HTML report of one run, or a comparison of several",
        description="With one RUN, write RUN/report.html: one self-contained page (inline SVG plots, no "
        "scripts, no network) with the manifest chain, data retention, mixture, tokenizer figures, loss, "
        "learning rate, gradients, throughput and MFU, events, evaluations, the gallery, decisions and a "
        "summary. With several runs, write a comparison against tokens and FLOPs with the config diff and "
        "final metrics, with noise bands over runs that differ only in run.seed.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directory, e.g. runs/quickstart")
    p.add_argument(
        "--out",
        default=None,
        help="output HTML file (default: RUN/report.html, or compare-<hash>.html next to the first run)",
    )
    p.add_argument(
        "--tensorboard",
        default=None,
        metavar="DIR",
        help="also write metrics.jsonl as TensorBoard event files under DIR (DIR/<run> for several runs)",
    )
    p.add_argument(
        "--decisions",
        default=None,
        metavar="FILE",
        help="decision log (default: decisions.jsonl next to the run)",
    )
    p.set_defaults(func=_report)

    p = sub.add_parser(
        "decide",
        help="record a decision and the runs and metric it rests on",
        description="Append a decision record (question, runs, the metric's final value in each run, "
        "outcome, date) to the decision log; the reports of the runs involved show it.",
    )
    p.add_argument("title", help='the question the runs answer, e.g. "Does QK-norm help at 124M?"')
    p.add_argument("--runs", nargs="+", required=True, metavar="RUN", help="the run directories compared")
    p.add_argument(
        "--metric", required=True, help="final metric compared, e.g. final_val_loss or heldout_bits_per_byte"
    )
    p.add_argument("--outcome", default=None, help="what was decided, e.g. 'keep QK-norm'")
    p.add_argument(
        "--log", default=None, metavar="FILE", help="decision log (default: decisions.jsonl next to the runs)"
    )
    p.set_defaults(func=_decide)


def _report(args: argparse.Namespace) -> int:
    from smelt.report.compare import write_comparison
    from smelt.report.single import write_run_report

    if len(args.runs) == 1:
        path = write_run_report(args.runs[0], args.out, args.decisions)
    else:
        path = write_comparison(args.runs, args.out, args.decisions)
    if args.tensorboard:
        from smelt.report.sinks import export_tensorboard

        for run_dir in args.runs:
            target = (
                Path(args.tensorboard) if len(args.runs) == 1 else Path(args.tensorboard) / Path(run_dir).name
            )
            logdir, count = export_tensorboard(run_dir, target)
            print(f"tensorboard: {count} records -> {logdir} (view: tensorboard --logdir {args.tensorboard})")
    print(f"report: {path}")
    return 0


def _decide(args: argparse.Namespace) -> int:
    from smelt.report.decisions import decide
    from smelt.report.single import write_run_report

    record = decide(args.title, args.runs, args.metric, args.outcome, args.log)
    width = max(len(e["name"]) for e in record["runs"])
    print(f"decision: {record['question']}")
    for entry in record["runs"]:
        mark = "  <- best" if entry["name"] == record["best"] else ""
        print(f"  {entry['name']:<{width}}  {args.metric} = {entry['value']:.6g}{mark}")
    if record["outcome"]:
        print(f"outcome: {record['outcome']}")
    print(f"logged to {record['log']}")
    for run_dir in args.runs:  # keep reports that already exist up to date with the new decision
        if (Path(run_dir) / "report.html").is_file():
            write_run_report(run_dir, decisions_log=record["log"])
            log(f"updated {Path(run_dir) / 'report.html'}")
    return 0
