"""Parallel layouts on this machine: tokens/s, peak memory per rank and bytes communicated per step for
DDP, FSDP2, TP 2 and FSDP2 x TP 2 (and pipeline / context parallelism when `smelt train --check` accepts
them) at 2 and 4 CPU processes (gloo), next to what `smelt plan memory` predicts per GPU.

Usage: python bench/parallel.py [--d-model 256] [--layers 4] [--heads 8] [--seq-len 256] [--micro-batch 4]
                                [--steps 12] [--procs 2,4] [--name parallel]
Every layout trains the same model on the same global batch (seq_len x micro_batch x 4 sequences, so that
1, 2 and 4 data-parallel ranks all take whole micro batches), from synthetic tokens, fp32, one thread per
rank, no evaluation and no checkpoint until the end.

How it measures, per rank (a worker under torchrun, this same file with --worker):
- bytes communicated: a TorchDispatchMode sees every collective and point-to-point op, since torch
  dispatches ProcessGroup calls (c10d::allreduce_, _allgather_base_, ..., DDP's reducer included) and
  DTensor's functional collectives (_c10d_functional.*) through the dispatcher. Each op counts its
  collective size S in bytes, nccl-tests' convention: the buffer all-reduced or broadcast, the gathered
  output of an all-gather, the input of a reduce-scatter, the tensor sent or received. On a ring a rank
  sends about 2 (n-1)/n S for an all-reduce and (n-1)/n S for an all-gather or reduce-scatter;
- per step: the difference between the totals at the end of the last optimizer step and of the first
  (a global optimizer step post-hook), over the steps between, so set-up (DDP's broadcast of the
  weights, the first step's lazy initialization) and the final checkpoint are left out;
- tokens/s: the global batch tokens of those same steps over the wall time between the two hooks;
- peak memory: the process's resident high-water mark (VmHWM) at the last step's hook, and its resident
  size before the model was built (Python, torch and the loader), so the difference is what training
  added; `smelt plan memory` predicts model state + activations per GPU (fp32, no recompute, no
  overhead) for the same layout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

VOCAB = 4096
COMM_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
# The ops of those namespaces that move data (others wait, wrap tensors for autograd or synchronize).
COMM_OPS = ("allreduce", "all_reduce", "allgather", "all_gather", "reduce_scatter", "reduce_", "broadcast",
            "alltoall", "all_to_all", "gather_", "scatter_", "send", "recv")  # fmt: skip


def layouts(procs: int) -> dict[str, dict]:
    """The `[train]` keys of each layout on `procs` processes."""
    out = {
        "ddp": {"parallel": "ddp"},
        "fsdp": {"parallel": "fsdp"},
        "tp2" if procs == 2 else "ddp_x_tp2": {"parallel": "ddp", "tensor_parallel": 2},
        "pp2" if procs == 2 else "fsdp_x_pp2": {"parallel": "fsdp", "pipeline_parallel": 2},
        "cp2" if procs == 2 else "fsdp_x_cp2": {"parallel": "fsdp", "context_parallel": 2},
    }
    if procs == 4:
        out["fsdp_x_tp2"] = {"parallel": "fsdp", "tensor_parallel": 2}
    return out


def raw_config(args: argparse.Namespace, keys: dict) -> dict:
    batch_tokens = args.seq_len * args.micro_batch * 4
    return {
        "run": {"seed": 1},
        "model": {
            "d_model": args.d_model, "n_layers": args.layers, "n_heads": args.heads,
            "n_kv_heads": args.heads // 2, "max_seq_len": args.seq_len,
            "tie_embeddings": False,  # pipeline stages hold the embedding and the head apart
        },
        "train": {
            "seq_len": args.seq_len, "micro_batch": args.micro_batch, "batch_tokens": batch_tokens,
            "tokens": batch_tokens * args.steps, "precision": "fp32", "threads": 1, "log_every": args.steps,
            "eval_every": 0, "eval_tokens": 0, "monitor_every": 0, **keys,
        },
        "checkpoint": {"every_steps": 0},
    }  # fmt: skip


def synthetic_data(root: Path) -> tuple[Path, Path]:
    tokens = root / "tokens"
    for split, n in (("train", 1_000_000), ("val", 20_000)):
        directory = tokens / split / "synth"
        directory.mkdir(parents=True)
        np.random.default_rng(0).integers(0, VOCAB - 128, n).astype("<u2").tofile(directory / "00000.bin")
        np.array([0], dtype="<i8").tofile(directory / "00000.idx")
    (tokens / "meta.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": VOCAB, "eos_id": 1}))
    tokenizer = root / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "smelt.json").write_text(json.dumps({"vocab_size": VOCAB}))
    return tokens, tokenizer


def status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


# ---- the worker: one rank under torchrun ----------------------------------------------------------


def _collective_bytes(value: object) -> int:
    """Bytes of a tensor or a (nested) list of tensors; 0 for anything else."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_collective_bytes(v) for v in value)
    return 0


def worker(config_path: str, tokens: str, tokenizer: str, out: str) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils._python_dispatch import TorchDispatchMode

    from smelt.config import config_from_dict
    from smelt.train.trainer import train

    class CommBytes(TorchDispatchMode):
        """Sums each communication op's collective size S (see the module docstring), by op."""

        def __init__(self) -> None:
            super().__init__()
            self.bytes: Counter[str] = Counter()
            self.calls: Counter[str] = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            result = func(*args, **(kwargs or {}))
            name = func._schema.name  # e.g. "c10d::allreduce_"
            namespace, _, op = name.partition("::")
            if namespace in COMM_NAMESPACES and any(word in op for word in COMM_OPS):
                groups = [*args, *(kwargs or {}).values(), result]
                self.bytes[op] += max(_collective_bytes(g) for g in groups)
                self.calls[op] += 1
            return result

    rank = int(os.environ["RANK"])
    cfg = config_from_dict(json.loads(Path(config_path).read_text()))
    rss_before_kb = status_kb("VmRSS")
    mode = CommBytes()
    # (time, bytes by op so far, calls by op so far, resident high-water mark kB) after each step
    marks: list[tuple[float, Counter, Counter, int]] = []

    def after_step(optimizer, args, kwargs) -> None:  # noqa: ANN001
        marks.append((time.perf_counter(), Counter(mode.bytes), Counter(mode.calls), status_kb("VmHWM")))

    hook = register_optimizer_step_post_hook(after_step)
    try:
        with mode:
            summary = train(cfg, tokens, tokenizer, Path(out) / "run")
    finally:
        hook.remove()
    (t0, bytes0, calls0, _), (t1, bytes1, calls1, hwm) = marks[0], marks[-1]
    steps = len(marks) - 1
    per_step = {op: (bytes1[op] - bytes0[op]) / steps for op in bytes1}
    calls = {op: (calls1[op] - calls0[op]) / steps for op in calls1}
    result = {
        "rank": rank,
        "steps_measured": steps,
        "comm_bytes_per_step": sum(per_step.values()),
        "comm_bytes_per_step_by_op": {op: v for op, v in per_step.items() if v},
        "comm_calls_per_step_by_op": {op: v for op, v in calls.items() if v},
        "tokens_per_s": cfg.train.batch_tokens * steps / (t1 - t0),
        "peak_rss_mb": hwm / 1024,
        "rss_before_model_mb": rss_before_kb / 1024,
        "final_train_loss": summary.get("final_train_loss"),
    }
    (Path(out) / f"rank_{rank}.json").write_text(json.dumps(result))


# ---- the driver -----------------------------------------------------------------------------------


def accepted(raw: dict, procs: int) -> str | None:
    """None when `smelt train --check`'s layout check accepts the keys on `procs` processes, else why not."""
    from smelt.config import config_from_dict
    from smelt.errors import ConfigError
    from smelt.train.mesh import check_layout_keys

    raw = {**raw, "train": {**raw["train"], "data_parallel": procs // model_parallel(raw["train"])}}
    try:
        check_layout_keys(config_from_dict(raw))
    except ConfigError as error:
        return str(error)
    return None


def model_parallel(train: dict) -> int:
    return (
        train.get("tensor_parallel", 1) * train.get("pipeline_parallel", 1) * train.get("context_parallel", 1)
    )


def predicted_gb(raw: dict, procs: int) -> dict[str, float]:
    """What `smelt plan memory` says one GPU holds for this layout (fp32 Adam, no recompute, no overhead)."""
    from smelt.config import config_from_dict
    from smelt.plan.memory import GB, Layout, ModelShape, memory

    cfg = config_from_dict(raw)
    tc = cfg.train
    tp, pp = tc.tensor_parallel, tc.pipeline_parallel
    dp = procs // (tp * pp * tc.context_parallel)
    layout = Layout(
        tp=tp, pp=pp, dp=dp, zero=3 if tc.parallel == "fsdp" and dp > 1 else 0, recompute="none",
        micro_batch=tc.micro_batch, seq_len=tc.seq_len // tc.context_parallel,
        microbatches=tc.batch_tokens // (tc.seq_len * tc.micro_batch * dp), precision="fp32",
    )  # fmt: skip
    peak = memory(ModelShape.from_config(cfg.model, VOCAB), layout, overhead_gb=0.0).peak
    return {"model_state": peak.model_state / GB, "activations": (peak.activations + peak.logits) / GB}


def run_layout(raw: dict, procs: int, tokens: Path, tokenizer: Path, out: Path) -> list[dict]:
    out.mkdir(parents=True)
    config = out / "config.json"
    config.write_text(json.dumps(raw))
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SMELT_QUIET": "1", "SMELT_PEAK_FLOPS": "1e12"}
    command = [str(torchrun), "--standalone", "--nproc-per-node", str(procs), __file__, "--worker",
               str(config), str(tokens), str(tokenizer), str(out)]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode:
        errors = [
            line for line in result.stderr.splitlines() if "Error" in line and "ChildFailedError" not in line
        ]
        raise RuntimeError(errors[-1] if errors else result.stderr[-1000:])
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(procs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--procs", default="2,4", help="process counts, e.g. 2,4")
    parser.add_argument("--name", default="parallel", help="bench/results/NAME.json")
    parser.add_argument(
        "--worker", nargs=4, metavar=("CONFIG", "TOKENS", "TOKENIZER", "OUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import write_result

    load = os.getloadavg()
    figures: dict[str, object] = {
        "model": f"d_model {args.d_model}, {args.layers} layers, {args.heads} heads ({args.heads // 2} kv), vocab {VOCAB}",
        "seq_len": args.seq_len, "micro_batch": args.micro_batch, "batch_tokens": args.seq_len * args.micro_batch * 4,
        "steps": args.steps, "load_average_1m_at_start": round(load[0], 2),
    }  # fmt: skip
    not_built: dict[str, str] = {}
    failed: dict[str, str] = {}
    rows = []
    with tempfile.TemporaryDirectory(prefix="smelt-bench-parallel-") as tmp:
        tokens, tokenizer = synthetic_data(Path(tmp))
        for procs in [int(p) for p in args.procs.split(",")]:
            for name, keys in layouts(procs).items():
                raw = raw_config(args, keys)
                label = f"{name}_{procs}p"
                why = accepted(raw, procs)
                if why:
                    not_built[label] = why
                    continue
                try:
                    ranks = run_layout(raw, procs, tokens, tokenizer, Path(tmp) / label)
                except RuntimeError as error:  # accepted by the check but failed to train: say so, go on
                    failed[label] = str(error)
                    print(f"{label}: failed: {error}", flush=True)
                    continue
                predicted = predicted_gb(raw, procs)
                figures[f"{label}_tokens_per_s"] = round(ranks[0]["tokens_per_s"], 1)
                figures[f"{label}_comm_mb_per_step_per_rank"] = [
                    round(r["comm_bytes_per_step"] / 1e6, 3) for r in ranks
                ]
                figures[f"{label}_comm_mb_per_step_by_op_rank0"] = {
                    op: round(v / 1e6, 3) for op, v in ranks[0]["comm_bytes_per_step_by_op"].items()
                }
                figures[f"{label}_comm_calls_per_step_by_op_rank0"] = ranks[0]["comm_calls_per_step_by_op"]
                figures[f"{label}_peak_rss_mb_per_rank"] = [round(r["peak_rss_mb"], 1) for r in ranks]
                figures[f"{label}_rss_added_mb_per_rank"] = [
                    round(r["peak_rss_mb"] - r["rss_before_model_mb"], 1) for r in ranks
                ]
                figures[f"{label}_plan_memory_mb_per_gpu"] = round(1e3 * sum(predicted.values()), 1)
                figures[f"{label}_plan_memory_model_state_mb"] = round(1e3 * predicted["model_state"], 1)
                figures[f"{label}_final_train_loss"] = round(ranks[0]["final_train_loss"], 6)
                rows.append((label, ranks, predicted))
                print(f"{label}: {ranks[0]['tokens_per_s']:.0f} tokens/s", flush=True)
    figures["not_built"] = not_built
    figures["failed"] = failed
    figures["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    figures["comm_bytes_convention"] = (
        "collective size S per op (nccl-tests): all-reduce/broadcast buffer, all-gather output, reduce-scatter "
        "input, p2p tensor; summed over one optimizer step (first step and set-up excluded)"
    )
    write_result(args.name, figures)


if __name__ == "__main__":
    main()
