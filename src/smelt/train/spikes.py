"""Spikes triaged by replay: is a loss or gradient spike in the data, or in the machine?

A spike alert (`loss_spike` or `grad_spike` in metrics.jsonl) is replayed in a side process, the
machinery of `smelt checkpoint drill` (`python -m smelt.train.replay`): the newest committed checkpoint
before the spike is resumed into a scratch directory and the steps up to the spike run through the
trainer's own phases. Then:

- "data": the spiking step's logged figures (the loss of a loss spike, the gradient norm of a gradient
  spike) come out of the replay bit for bit. The same weights on the same batch give the same spike,
  so the batch is the cause. Where a replay cannot be bitwise (a GPU without deterministic kernels, a
  run on several processes replayed on one: `bitwise_expected` says which), a replay that crosses the
  alert's logged threshold again counts as reproduced and is labelled "data" too, with the reason.
- "nondeterministic or hardware": the replay does not give the logged figures. The batch alone does
  not make the spike: look at the machine (a flaky GPU, a bad host, a silent data corruption) or at
  nondeterministic kernels.

Just before the spiking step the replay also scores that step's batch per document
(train/spike_probe.py), so the documents of the batch are listed from the data order
(tokens/step_documents.py) with their ids, sources, a snippet of what the model saw and their mean loss,
highest first; those far above the rest of the batch are the suspects that `smelt data drop RUN
--spike STEP` puts on the run's drop list. The result goes to `RUN/train/spikes/step_NNNNNNN.json`;
`python -m smelt.train.spikes TRAIN_DIR STEP [ALERTS.json]` is the side process the trainer starts on its
own (train/spike_watch.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from smelt.checkpoint.drill import DrillFailed, drill_config, side_process
from smelt.checkpoint.store import list_checkpoints, read_meta
from smelt.errors import UserError
from smelt.layout import CHECKPOINTS, STAGE_DIRS, step_dir_name, step_of
from smelt.metric_records import METRICS, read_records

SPIKE_ALERTS = ("loss_spike", "grad_spike")
DATA = "data"
NONDETERMINISTIC = "nondeterministic or hardware"
SPIKES_DIR = "spikes"
# Which replayed figure each alert is about.
_FIGURE = {"loss_spike": "loss", "grad_spike": "grad_norm"}


def spike_path(train_dir: Path, step: int) -> Path:
    return Path(train_dir) / SPIKES_DIR / f"{step_dir_name(step)}.json"


def read_triage(train_dir: Path, step: int) -> dict[str, Any] | None:
    path = spike_path(train_dir, step)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def spike_alerts(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """The spike alerts of a run's metrics, by step (in the order they were written)."""
    found: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        if record.get("event") == "alert" and record.get("alert") in SPIKE_ALERTS:
            found.setdefault(int(record["step"]), []).append(record)
    return found


def choose_start(checkpoints: Path, step: int, records: list[dict[str, Any]]) -> Path:
    """The newest committed checkpoint before `step`; a UserError when there is none, or when a rollback
    between it and the spike changed what the run trained on (the replay could not follow it)."""
    before = [p for p in list_checkpoints(checkpoints) if step_of(p) < step]
    if not before:
        raise UserError(
            f"no committed checkpoint under {checkpoints} before step {step}, so the spike cannot be replayed. "
            f"Save checkpoints during the run (checkpoint.every_steps) and keep enough of them "
            f"(checkpoint.keep_last) to cover the last few thousand steps."
        )
    start = before[-1]
    at = step_of(start)
    for record in records:
        if record.get("event") == "rollback" and at <= int(record["step"]) < step:
            raise UserError(
                f"step {record['step']} rolled back to step {record.get('to_step')} after checkpoint {start.name} "
                f"was saved, so replaying from it would not train on what the run did; a spike after a rollback "
                f"can be replayed from the next checkpoint saved after the rollback."
            )
    return start


def loader_for(meta: dict[str, Any], run_dir: Path) -> tuple[Any, Any]:
    """The run's training loader and batch plan, rebuilt from a checkpoint's config as the trainer made them."""
    from smelt.config import config_from_dict
    from smelt.tokens.loader import TokenLoader
    from smelt.train.batching import batch_plan

    cfg = config_from_dict(meta["config"], origin=f"{run_dir} checkpoint meta.json")
    world = int(meta.get("world_size") or 1)
    plan = batch_plan(cfg.train, world)
    loader_cfg = dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, batch_tokens=plan.loader_batch_tokens)
    )
    loader = TokenLoader.from_config(
        loader_cfg, run_dir / STAGE_DIRS["tokenize"], run_dir / STAGE_DIRS["tokenizer"], world_size=world,
        verify="size",
    )  # fmt: skip
    return loader, plan


def loader_steps(plan: Any, step: int) -> list[int]:
    """The loader steps that optimizer step `step` trained on (several under a batch ramp)."""

    def done(k: int) -> int:
        return k if not plan.units or k == 0 else plan._consumed[k - 1]

    return list(range(done(step - 1) + 1, done(step) + 1))


def triage(train_dir: Path, step: int, alerts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Replay the spike of `step`, label it and list its batch's documents; writes spikes/step_N.json.
    `alerts`: the step's alert records (read from metrics.jsonl when not given)."""
    train_dir = Path(train_dir)
    run_dir = train_dir.parent
    records = read_records(train_dir / METRICS)
    if alerts is None:
        spikes = spike_alerts(records)
        if step not in spikes:
            listed = ", ".join(str(s) for s in sorted(spikes)) or "none"
            raise UserError(
                f"{train_dir / METRICS} has no loss or gradient spike alert at step {step} (spikes at "
                f"steps: {listed}). Pass one of those to --step."
            )
        alerts = spikes[step]
    for needed in (run_dir / STAGE_DIRS["tokenize"], run_dir / STAGE_DIRS["tokenizer"]):
        if not needed.is_dir():
            raise UserError(
                f"{needed} does not exist: the replay trains on the run's own tokens and tokenizer."
            )
    start = choose_start(train_dir / CHECKPOINTS, step, records)
    at = step_of(start)
    meta = read_meta(start, verify=False)
    first = next((r for r in records if r.get("event") in ("start", "resume")), {})
    config, _, _ = drill_config(meta, first)
    exact, why = bitwise_expected(meta, config)
    began = time.time()
    result = side_process(config, start, run_dir / STAGE_DIRS["tokenize"], run_dir / STAGE_DIRS["tokenizer"],
                          step - at, probe_step=step)  # fmt: skip
    replayed = next((s for s in result["steps"] if s["step"] == step), None)
    if replayed is None:
        raise DrillFailed(
            f"the side process did not reach step {step} (it replayed {len(result['steps'])} steps)"
        )
    figures, label = compare(alerts, replayed, exact)
    bitwise = all(f["bitwise"] for f in figures)
    loader, plan = loader_for(meta, run_dir)
    try:
        from smelt.tokenizer.load import Tokenizer

        tokenizer = Tokenizer.load(run_dir / STAGE_DIRS["tokenizer"])
    except (UserError, OSError, ValueError, KeyError):
        tokenizer = None  # ids and losses still name the documents; the snippets show token ids
    from smelt.tokens.step_documents import batch_documents

    documents = batch_documents(
        loader, loader_steps(plan, step), run_dir / STAGE_DIRS["tokenize"],
        run_dir / STAGE_DIRS["curate"] if (run_dir / STAGE_DIRS["curate"]).is_dir() else None,
        tokenizer, probe=result.get("probe") or None,
    )  # fmt: skip
    loader.close()
    out = {
        "step": step, "label": label, "bitwise": bitwise, "exact_replay": exact, "why_not_bitwise": why,
        "checkpoint": str(start), "checkpoint_step": at, "replayed_steps": [at + 1, step],
        "replay_s": round(time.time() - began, 3), "figures": figures, "rows": plan.batch_tokens // plan.seq_len,
        "suspects": [d["id"] if d["id"] is not None else f"{d['source']}#{d['document']}"
                     for d in documents if d.get("suspect")],
        "documents": documents,
    }  # fmt: skip
    path = spike_path(train_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return out


def bitwise_expected(meta: dict[str, Any], config: dict[str, Any]) -> tuple[bool, str]:
    """Whether the replay of a checkpoint must give its run's figures bit for bit, and why not: the CPU's
    kernels are deterministic at any precision, a GPU's with train.deterministic; a run on several
    processes is replayed on one, whose sums run in another order."""
    world = int(meta.get("world_size") or 1)
    train = config.get("train", {})
    device = str(train.get("device") or "cpu")
    reasons = [f"the run trained on {world} processes, the replay runs on one"] if world > 1 else []
    if not device.startswith("cpu") and not train.get("deterministic"):
        reasons.append(f"the run trained on {device} without deterministic kernels (train.deterministic)")
    return not reasons, "; ".join(reasons)


def compare(
    alerts: list[dict[str, Any]], replayed: dict[str, Any], exact: bool
) -> tuple[list[dict[str, Any]], str]:
    """Each alert's logged figure against the replay's, and the label: "data" when every figure comes
    back bit for bit, or (where the replay cannot be bitwise, `exact` False) crosses its threshold again."""
    figures = []
    for alert in alerts:
        figure = _FIGURE[alert["alert"]]
        logged, again = _number(alert.get("value")), _number(replayed[figure])
        threshold = alert.get("threshold")
        figures.append({
            "alert": alert["alert"], "figure": figure, "logged": logged, "replayed": again,
            "threshold": threshold, "bitwise": logged == again,
            "crossed": threshold is not None and again == again and again > float(threshold),
            "message": alert.get("message", ""),
        })  # fmt: skip
    bitwise = all(f["bitwise"] for f in figures)
    reproduced = bitwise or (not exact and all(f["crossed"] for f in figures))
    return figures, DATA if reproduced else NONDETERMINISTIC


def _number(value: Any) -> float:
    """A logged figure as a float (metrics.jsonl writes a non-finite one as text)."""
    return float(value) if value is not None else math.nan


def triage_report(result: dict[str, Any], run: str | Path, shown: int = 10) -> str:
    """What `smelt train triage` prints: the replayed figures, the label and the batch's documents."""
    step, at = result["step"], result["checkpoint_step"]
    lines = [f"spike at step {step}; replayed steps {at + 1}-{step} from {result['checkpoint']} in a side process",
             f"{'alert':<12} {'figure':<10} {'logged':>16} {'replayed':>16}  same bits"]  # fmt: skip
    for f in result["figures"]:
        lines.append(f"{f['alert']:<12} {f['figure']:<10} {f['logged']:>16.9g} {f['replayed']:>16.9g}  "
                     f"{'yes' if f['bitwise'] else 'no'}")  # fmt: skip
    if result["label"] == DATA and result["bitwise"]:
        why = "the replay gives the spike bit for bit: the same weights on the same batch spike again"
    elif result["label"] == DATA:
        why = f"the replay crosses the alert threshold again ({result['why_not_bitwise']}, so it cannot be bitwise)"
    else:
        why = (
            "the replay does not give the logged figures: look at the machine or at nondeterministic kernels"
        )
    lines.append(f"label: {result['label']} ({why})")
    documents = result["documents"]
    lines.append(f"\n{len(documents)} document(s) in the batch of step {step}, highest loss first:")
    lines.append(f"{'loss':>8} {'vs rest':>8} {'tokens':>7}  {'source':<12} {'id':<24} snippet")
    for doc in documents[: shown if shown > 0 else len(documents)]:
        loss = f"{doc['loss']:.3f}" if "loss" in doc else "-"
        name = doc["id"] if doc["id"] is not None else f"#{doc['document']}"
        mark = "  <- suspect" if doc.get("suspect") else ""
        lines.append(f"{loss:>8} {_excess(doc):>8} {doc['tokens']:>7}  {doc['source']:<12} {name:<24} "
                     f"{doc['snippet'][:60]!r}{mark}")  # fmt: skip
    if len(documents) > shown > 0:
        lines.append(f"... {len(documents) - shown} more in {spike_path(Path(run) / 'train', step)}")
    if result["label"] == DATA and result["suspects"]:
        lines.append(f"\nsuspects: {', '.join(result['suspects'])}; leave them out of the next tokenize with "
                     f"`smelt data drop {run} --spike {step}`")  # fmt: skip
    return "\n".join(lines)


def _excess(doc: dict[str, Any]) -> str:
    """How far a document's mean loss lies above the rest of its batch's, in nats ("-" without losses)."""
    return f"{doc['excess']:+.3f}" if "excess" in doc else "-"


def main(argv: list[str]) -> int:
    """The trainer's side process: triage one spike, writing its file (with the error when it fails)."""
    train_dir, step = Path(argv[0]), int(argv[1])
    alerts = json.loads(Path(argv[2]).read_text(encoding="utf-8")) if len(argv) > 2 else None
    try:
        triage(train_dir, step, alerts)
    except (UserError, DrillFailed, OSError) as exc:
        path = spike_path(train_dir, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"step": step, "label": None, "error": str(exc)}) + "\n", encoding="utf-8")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
