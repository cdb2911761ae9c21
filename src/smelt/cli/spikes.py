"""`smelt train triage RUN [--step N]` (replay a spike and label it) and `smelt data drop RUN --spike N`
(put the documents it names on the run's drop list, which the next tokenize honours)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from smelt.errors import UserError
from smelt.metric_records import METRICS


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    data = subparsers.add_parser("data", help="the run's drop list: documents left out of the next tokenize")
    verbs = data.add_subparsers(dest="data_command", metavar="VERB", required=True)
    p = verbs.add_parser(
        "drop",
        help="add the documents a triaged spike names to RUN/drops.jsonl, which the next tokenize leaves out",
        description="Read RUN/train/spikes/step_N.json (written by `smelt train triage` or the run itself) and "
        "append its suspects (or --doc, or --all) to RUN/drops.jsonl with the spike's step as the reason. The "
        "next `smelt tokenize` or `smelt run` leaves them out and lists them in tokens/dropped.jsonl.",
    )
    p.add_argument("run", metavar="RUN", help="run directory, e.g. runs/quickstart")
    p.add_argument("--spike", type=int, required=True, metavar="STEP", help="the triaged spike's step")
    p.add_argument("--doc", action="append", default=[], metavar="ID", help="drop this document of the batch")
    p.add_argument("--all", action="store_true", help="drop every document of the spiking batch")
    p.set_defaults(func=_drop)


def verb_parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """`train triage RUN`, beside `train CONFIG`."""
    p = argparse.ArgumentParser(
        prog="smelt train triage",
        description="Replay a loss or gradient spike from the checkpoint before it in a side process and label "
        "it: 'data' when it reproduces bit for bit, 'nondeterministic or hardware' when not; list the "
        "documents of its batch, highest loss first. Without --step, list the run's spikes and their labels.",
    )
    p.add_argument("run", metavar="RUN", help="run directory, e.g. runs/quickstart")
    p.add_argument("--step", type=int, default=None, help="the spike's step (a spike alert in metrics.jsonl)")
    p.add_argument("--rows", type=int, default=10, help="documents shown, highest loss first (0: all)")
    p.set_defaults(command="train-triage", func=_triage)
    return {("train", "triage"): p}


def _train_dir(run: str) -> Path:
    train_dir = Path(run) / "train"
    if not (train_dir / METRICS).is_file():
        raise UserError(
            f"{train_dir / METRICS} does not exist: RUN must be a run directory that has trained, "
            f"such as runs/quickstart."
        )
    return train_dir


def _triage(args: argparse.Namespace) -> int:
    from smelt.checkpoint.drill import DrillFailed
    from smelt.metric_records import read_records
    from smelt.train.spikes import read_triage, spike_alerts, triage, triage_report

    train_dir = _train_dir(args.run)
    if args.step is None:
        spikes = spike_alerts(read_records(train_dir / METRICS))
        if not spikes:
            print(f"no loss or gradient spike alert in {train_dir / METRICS}")
            return 0
        print(f"{'step':>8}  {'alerts':<22} {'label':<30} suspects")
        for step, alerts in sorted(spikes.items()):
            done = read_triage(train_dir, step) or {}
            label = done.get("label") or ("failed: see the file" if done.get("error") else "not triaged")
            kinds = ",".join(a["alert"] for a in alerts)
            print(f"{step:>8}  {kinds:<22} {label:<30} {', '.join(done.get('suspects', [])) or '-'}")
        print(f"\ntriage one: smelt train triage {args.run} --step STEP")
        return 0
    try:
        result = triage(train_dir, args.step)
    except DrillFailed as exc:
        print(f"FAIL: {exc}")
        return 1
    print(triage_report(result, args.run, shown=args.rows))
    return 0


def _drop(args: argparse.Namespace) -> int:
    from smelt.tokens.drop_list import add_to_drop_list, drop_list_path
    from smelt.train.spikes import DATA, read_triage

    train_dir = _train_dir(args.run)
    result = read_triage(train_dir, args.spike)
    if result is None or result.get("label") is None:
        raise UserError(
            f"the spike at step {args.spike} has no triage in {train_dir / 'spikes'}"
            f"{' (it failed: ' + result['error'] + ')' if result and result.get('error') else ''}. Run "
            f"`smelt train triage {args.run} --step {args.spike}` first."
        )
    if result["label"] != DATA and not args.doc:
        raise UserError(
            f"the spike at step {args.spike} is labelled {result['label']!r}: it did not reproduce, so its batch "
            f"alone does not cause it and dropping documents would not prevent it. To drop some anyway, name "
            f"them with --doc ID."
        )
    chosen = _chosen(args, result["documents"])
    run = Path(args.run)
    reason = f"spike at step {args.spike} ({', '.join(f['alert'] for f in result['figures'])}; triage: {result['label']})"
    entries = [{"source": d["source"], "id": d["id"], "split": d.get("split", "train"), "reason": reason,
                "spike_step": args.spike, "run": str(run)} for d in chosen]  # fmt: skip
    path = drop_list_path(run)
    added = add_to_drop_list(path, entries)
    listed = ", ".join(f"{e['source']}/{e['id']}" for e in entries)
    print(f"{len(added)} document(s) added to {path} ({len(entries) - len(added)} already listed): {listed}")
    print(
        f"the next `smelt tokenize CONFIG` (or `smelt run CONFIG`) leaves them out; the token shards are stale "
        f"until then. Then retrain (`smelt train CONFIG --restart`). A fork (`--from`) reads the drop list of "
        f"its own run directory: copy {path} there first."
    )
    return 0


def _chosen(args: argparse.Namespace, documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The documents of the batch to drop: --doc, --all, or the triage's suspects."""
    if any(d.get("id") is None for d in documents):
        raise UserError(
            f"the triage of step {args.spike} could not name its documents by id (the run has no documents/ "
            f"directory), so there is nothing to put on a drop list."
        )
    if args.doc:
        by_id = {d["id"]: d for d in documents}
        missing = [i for i in args.doc if i not in by_id]
        if missing:
            shown = ", ".join(d["id"] for d in documents[:10])
            raise UserError(
                f"--doc {missing[0]}: not a document of the batch of step {args.spike} (highest loss first: "
                f"{shown}{', ...' if len(documents) > 10 else ''})."
            )
        return [by_id[i] for i in args.doc]
    if args.all:
        return documents
    suspects = [d for d in documents if d.get("suspect")]
    if not suspects:
        raise UserError(
            f"no document of the batch of step {args.spike} stands out from the others, so the triage names no "
            f"suspect. Look at them (`smelt train triage {args.run} --step {args.spike} --rows 0`), then name "
            f"documents with --doc ID or drop the whole batch with --all."
        )
    return suspects
