"""What telemetry costs: the time a step with telemetry takes over one without, and its share of the
run at train.telemetry_every.

Usage: python bench/telemetry.py [STEPS] [--preset small-5m] [--micro-batch 16] [--seq-len 256]
           [--precision auto] [--threads 1] [--repeats 3] [--every 100]

Each repeat trains once through smelt's Trainer on synthetic tokens (vocabulary 8192, documents of 300
tokens so the document mask is in play) with telemetry and update ratios at every other step
(train.telemetry_every = 2) and every step logged (train.log_every = 1). Each even step (with
telemetry) is paired with the odd step before it (without): neighbours see the same load on a shared
machine, where separate runs did not. A run's extra time is the median of its pairs' differences after
the first SKIP_STEPS steps (start-up), its plain step time the median of those odd steps; the cost at the
cadence E is extra / (E x plain step). The result gives min / median / max over the repeats and the load
average before and after: on a shared machine the figures are only comparable within one result file.

Wall time on a machine that other work loads swings from step to step; the CPU time a step uses does
not. So the same pairs are also timed in CPU seconds (time.process_time, one thread) outside the
Trainer: the model's forward, backward and AdamW step, plain and with `Telemetry.begin` and its
optimizer hooks (update ratios and Adam moments), `--cpu-pairs` times in turn.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from common import write_result
from train_throughput import spread

from smelt.config import config_from_dict
from smelt.train.trainer import train

VOCAB = 8192
EOS = 1
SKIP_STEPS = 5


def synthetic_tokens(root: Path) -> Path:
    tokens = root / "tokens"
    rng = np.random.default_rng(0)
    for split, n in (("train", 2_000_000), ("val", 20_000)):
        directory = tokens / split / "synth"
        directory.mkdir(parents=True)
        ids = rng.integers(2, VOCAB - 128, n).astype("<u2")
        starts = np.arange(0, n, 300, dtype="<i8")
        ids[starts[1:] - 1] = EOS  # documents of 300 tokens, each ended by EOS
        ids.tofile(directory / "00000.bin")
        starts.tofile(directory / "00000.idx")
    (tokens / "meta.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": VOCAB, "eos_id": EOS}))
    return tokens


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("steps", nargs="?", type=int, default=25, help="optimizer steps per run (default 25)")
    p.add_argument("--preset", default="small-5m")
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--precision", default="auto")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="train.threads (1: steadiest on a machine shared with other work)",
    )
    p.add_argument("--repeats", type=int, default=5, help="pairs of runs (min / median / max)")
    p.add_argument("--every", type=int, default=100, help="the cadence to price (train.telemetry_every)")
    p.add_argument(
        "--cpu-pairs", type=int, default=8, help="plain / telemetry step pairs timed in CPU seconds"
    )
    p.add_argument("--name", default="telemetry")
    return p.parse_args()


def paired_times(args: argparse.Namespace, root: Path, tokens: Path, name: str) -> tuple[float, float, dict]:
    """(median plain step seconds, median extra seconds of a telemetry step, the first telemetry record)
    of one run with telemetry at every other step."""
    batch = args.micro_batch * args.seq_len
    cfg = config_from_dict(
        {
            "model": {"preset": args.preset},
            "train": {
                "seq_len": args.seq_len, "micro_batch": args.micro_batch, "tokens": batch * args.steps,
                "precision": args.precision, "log_every": 1, "eval_every": 0, "eval_tokens": 4096,
                "compile": False, "telemetry_every": 2, "monitor_every": -1, "threads": args.threads,
            },
            "checkpoint": {"every_steps": 0},
        }
    )  # fmt: skip
    out = root / name
    train(cfg, tokens, root / "tok", out)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    seconds = {r["step"]: batch / r["tokens_per_s"] for r in lines if r["kind"] == "train"}
    pairs = [(seconds[s - 1], seconds[s]) for s in seconds if s % 2 == 0 and s - 1 > SKIP_STEPS]
    telemetry = next((r for r in lines if r["kind"] == "telemetry"), {})
    return statistics.median(a for a, _ in pairs), statistics.median(b - a for a, b in pairs), telemetry


def cpu_pairs(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """CPU seconds of plain steps and of the extra telemetry adds to a step, pair by pair."""
    import torch

    from smelt.model.transformer import Transformer, doc_ids_from_tokens, position_ids_from_doc_ids
    from smelt.train.optim import build_optimizer
    from smelt.train.precision import resolve_precision
    from smelt.train.telemetry import Telemetry

    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    cfg = config_from_dict({"model": {"preset": args.preset}, "train": {"precision": args.precision}})
    torch.manual_seed(0)
    model = Transformer(cfg.model, VOCAB)
    optimizer = build_optimizer(model, cfg.train, cpu)
    precision = resolve_precision(args.precision, cpu)
    telemetry = Telemetry(
        model, optimizer, lambda record: None, every=1, ratio_every=-1, sharded=False, precision=precision,
        doc_masking=True, vocab_size=VOCAB,
    )  # fmt: skip
    ids = torch.randint(
        2, VOCAB - 128, (args.micro_batch, args.seq_len + 1), generator=torch.Generator().manual_seed(0)
    )
    ids[:, 150] = EOS
    inputs, targets = ids[:, :-1], ids[:, 1:]
    doc_ids = doc_ids_from_tokens(inputs, EOS)
    batch = SimpleNamespace(inputs=inputs, doc_ids=doc_ids, position_ids=position_ids_from_doc_ids(doc_ids))
    part = SimpleNamespace(micro=[batch])

    def step(due: bool) -> float:
        started = time.process_time()
        if due:
            telemetry.begin(2, 0, [part])
        with precision.autocast():
            _, loss = model(inputs, targets, doc_ids=batch.doc_ids, position_ids=batch.position_ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        telemetry.pending = None
        return time.process_time() - started

    step(False), step(True)  # allocations and the first fused AdamW call
    plain, extra = [], []
    for _ in range(args.cpu_pairs):
        a, b = step(False), step(True)
        plain.append(a)
        extra.append(b - a)
    return plain, extra


def main() -> None:
    args = parse_args()
    os.environ.setdefault("SMELT_QUIET", "1")
    root = Path(tempfile.mkdtemp())
    tokens = synthetic_tokens(root)
    (root / "tok").mkdir()
    (root / "tok" / "smelt.json").write_text(json.dumps({"vocab_size": VOCAB}))
    load_before = [round(x, 2) for x in os.getloadavg()]
    started = time.perf_counter()
    plain, extra, sample = [], [], {}
    for i in range(args.repeats):
        step_s, extra_s, sample = paired_times(args, root, tokens, f"run-{i}")
        plain.append(step_s)
        extra.append(extra_s)
        print(f"repeat {i + 1}: {step_s:.4f} s per step without telemetry, {extra_s:+.4f} s with it")
    cost = [e / (args.every * a) for e, a in zip(extra, plain, strict=True)]
    cpu_plain, cpu_extra = cpu_pairs(args)
    cpu_cost = [e / (args.every * a) for e, a in zip(cpu_extra, cpu_plain, strict=True)]
    write_result(
        args.name,
        {
            "preset": args.preset,
            "precision": args.precision,
            "threads": args.threads,
            "batch_tokens": args.micro_batch * args.seq_len,
            "sample_tokens": sample.get("sample_tokens"),
            "steps_per_run": args.steps,
            "repeats": args.repeats,
            "step_s_without": spread(plain, digits=4),
            "extra_s_per_telemetry_step": spread(extra, digits=4),
            "extra_share_of_a_step_pct": spread([e / a for e, a in zip(extra, plain, strict=True)], 100, 2),
            "telemetry_every": args.every,
            f"cost_at_every_{args.every}_pct": spread(cost, 100, 3),
            "cpu_pairs": args.cpu_pairs,
            "cpu_step_s_without": spread(cpu_plain, digits=4),
            "cpu_extra_s_per_telemetry_step": spread(cpu_extra, digits=4),
            "cpu_extra_share_of_a_step_pct": spread(
                [e / a for e, a in zip(cpu_extra, cpu_plain, strict=True)], 100, 2
            ),
            f"cpu_cost_at_every_{args.every}_pct": spread(cpu_cost, 100, 3),
            "bench_s": round(time.perf_counter() - started, 1),
            "load_average_before": load_before,
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
    )


if __name__ == "__main__":
    main()
