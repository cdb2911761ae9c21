"""Parallel layouts on this machine: tokens/s, peak memory per rank and bytes communicated per step for
DDP, FSDP2, TP 2 and FSDP2 x TP 2 (and pipeline / context parallelism when `smelt train --check` accepts
them) at 2 and 4 CPU processes (gloo), next to what `smelt plan memory` predicts per GPU.

Usage: python bench/parallel.py [--d-model 256] [--layers 4] [--heads 8] [--seq-len 256] [--micro-batch 4]
                                [--steps 12] [--procs 2,4] [--layouts fsdp,tp2,...] [--name parallel]
       python bench/parallel.py --plan-vs-measured   (d_model 1024, 4 layers, 16 heads, sequences of 64,
                                micro batch 1, 4 steps, 2 processes, FSDP2, TP 2 and PP 2)
The second form is `smelt plan memory` against each rank's measured peak at a width where the weights
dominate (55.6M parameters: 890 MB of fp32 weights, gradients and Adam moments unsharded, against under
20 MB of activations). It turns train.keep_host_memory off and sets MALLOC_MMAP_THRESHOLD_=131072 in the
workers, so that glibc maps every block of 128 kB or more on its own and unmaps it when freed: the
resident size then follows the live tensors, as a GPU allocator's count of allocated bytes does (with
smelt's defaults it also holds the freed blocks kept for reuse). It writes "plan_vs_measured" into
bench/results/scale.json (NAME.json with --name), keeping what else that file holds.
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
from typing import Any

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

    from smelt.train import trainer

    rank = int(os.environ["RANK"])
    cfg = config_from_dict(json.loads(Path(config_path).read_text()))
    rss_before_kb = status_kb("VmRSS")
    at_build: dict[str, int] = {}
    build = trainer.build_training_model

    def measured_build(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        at_build["rss_kb"] = status_kb("VmRSS")  # the process before any weight exists
        built = build(*args, **kwargs)
        at_build["after_kb"] = status_kb("VmRSS")
        return built

    trainer.build_training_model = measured_build
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
        trainer.build_training_model = build
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
        "rss_at_build_mb": at_build["rss_kb"] / 1024,
        "rss_after_build_mb": at_build["after_kb"] / 1024,
        "peak_rss_first_step_mb": marks[0][3] / 1024,
        "final_train_loss": summary.get("final_train_loss"),
    }
    (Path(out) / f"rank_{rank}.json").write_text(json.dumps(result))


# ---- the driver -----------------------------------------------------------------------------------


def accepted(raw: dict, procs: int) -> str | None:
    """None when `smelt train --check`'s layout check accepts the keys on `procs` processes, else why not."""
    from smelt.config import config_from_dict
    from smelt.errors import ConfigError
    from smelt.train.parallel.mesh import check_layout_keys

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


def planned(raw: dict, procs: int) -> tuple[Any, list[Any]]:
    """`smelt plan memory`'s figures for this layout (fp32 Adam, no recompute, no overhead): the Memory and
    the stage each of the `procs` ranks holds ("pp" is the mesh's outermost dimension)."""
    from smelt.config import config_from_dict
    from smelt.plan.memory import Layout, ModelShape, memory

    cfg = config_from_dict(raw)
    tc = cfg.train
    tp, pp = tc.tensor_parallel, tc.pipeline_parallel
    dp = procs // (tp * pp * tc.context_parallel)
    layout = Layout(
        tp=tp, pp=pp, dp=dp, zero=3 if tc.parallel == "fsdp" and dp > 1 else 0, recompute="none",
        micro_batch=tc.micro_batch, seq_len=tc.seq_len // tc.context_parallel,
        microbatches=tc.batch_tokens // (tc.seq_len * tc.micro_batch * dp), precision="fp32",
        sequence_parallel=tp > 1,
    )  # fmt: skip
    mem = memory(ModelShape.from_config(cfg.model, VOCAB), layout, overhead_gb=0.0)
    per_stage = procs // pp
    return mem, [mem.stages[0 if r // per_stage == 0 else -1] for r in range(procs)]


def predicted_gb(raw: dict, procs: int) -> dict[str, float]:
    """What `smelt plan memory` says the fullest GPU holds for this layout."""
    from smelt.plan.memory import GB

    peak = planned(raw, procs)[0].peak
    return {"model_state": peak.model_state / GB, "activations": (peak.activations + peak.logits) / GB}


# What the plan-vs-measured runs set so that the resident size follows the live tensors, as a GPU
# allocator's count of allocated bytes does: train.keep_host_memory off, and glibc's malloc serving every
# block of 128 kB or more with its own mapping, returned on free (no dynamic threshold, so no freed block
# waits in the heap). With smelt's defaults the resident size also holds the freed blocks kept for reuse.
LIVE_MEMORY = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def run_layout(
    raw: dict, procs: int, tokens: Path, tokenizer: Path, out: Path, env_extra: dict | None = None
) -> list[dict]:
    out.mkdir(parents=True)
    config = out / "config.json"
    config.write_text(json.dumps(raw))
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "SMELT_QUIET": "1",
        "SMELT_PEAK_FLOPS": "1e12",
        **(env_extra or {}),
    }
    command = [str(torchrun), "--standalone", "--nproc-per-node", str(procs), __file__, "--worker",
               str(config), str(tokens), str(tokenizer), str(out)]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode:
        errors = [
            line for line in result.stderr.splitlines() if "Error" in line and "ChildFailedError" not in line
        ]
        raise RuntimeError(errors[-1] if errors else result.stderr[-1000:])
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(procs)]


# Defaults of the two measurements: tokens/s, bytes and memory of every layout at a small width; and
# `smelt plan memory` against the measured peak per rank at a width where the weights dominate.
THROUGHPUT = {"d_model": 256, "layers": 4, "heads": 8, "seq_len": 256, "micro_batch": 4, "steps": 12,
              "procs": "2,4", "name": "parallel"}  # fmt: skip
PLAN_VS_MEASURED = {"d_model": 1024, "layers": 4, "heads": 16, "seq_len": 64, "micro_batch": 1, "steps": 4,
                    "procs": "2", "name": "scale"}  # fmt: skip
MEMORY_LAYOUTS = ("fsdp", "tp2", "pp2")


def plan_vs_measured(ranks: list[dict], raw: dict, procs: int) -> dict[str, object]:
    """Per rank: what `smelt plan memory` predicts (model state + activations + logits, no overhead) and
    what training added to the process (peak resident size at the last step less the resident size when
    the model's build began), in MB, and plan / measured."""
    mem, stages = planned(raw, procs)
    plan = [s.total / 1e6 for s in stages]
    measured = [r["peak_rss_mb"] * 1.048576 - r["rss_at_build_mb"] * 1.048576 for r in ranks]
    return {
        "layout": mem.layout.describe(),
        "plan_mb_per_rank": [round(x, 1) for x in plan],
        "measured_mb_per_rank": [round(x, 1) for x in measured],
        "plan_over_measured_per_rank": [round(a / b, 3) for a, b in zip(plan, measured, strict=True)],
        "plan_breakdown_mb_per_rank": [
            {
                k: round(getattr(s, k) / 1e6, 1)
                for k in ("weights", "gradients", "optimizer", "zero3_buffers", "activations", "logits")
            }
            for s in stages
        ],  # fmt: skip
        "measured_after_build_mb_per_rank": [
            round((r["rss_after_build_mb"] - r["rss_at_build_mb"]) * 1.048576, 1) for r in ranks
        ],
    }


def write_plan_vs_measured(name: str, figures: dict[str, object]) -> None:
    """Put the figures under "plan_vs_measured" in bench/results/NAME.json, keeping what else it holds."""
    from common import RESULTS, machine

    path = RESULTS / f"{name}.json"
    result = json.loads(path.read_text()) if path.is_file() else {}
    command = " ".join([Path(sys.executable).name, "bench/parallel.py", *sys.argv[1:]])
    cpuinfo = Path("/proc/cpuinfo")
    bf16 = cpuinfo.is_file() and "avx512_bf16" in cpuinfo.read_text()
    note = (
        f"{os.cpu_count()} cores{', AVX-512 BF16' if bf16 else ''}; load average "
        f"{figures['load_average_1m_at_start']} when it started, {figures['load_average_1m_at_end']} when it "
        f"ended (other jobs ran beside it: the memory figures count bytes, not time)"
    )
    result["plan_vs_measured"] = {**figures, "machine": machine(), "machine_note": note, "command": command}
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result["plan_vs_measured"], indent=2))
    print(f"-> {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan-vs-measured", action="store_true",
                        help="measure `smelt plan memory` against each rank's peak for FSDP2, TP 2 and PP 2 at "
                             "a width where weights dominate; writes plan_vs_measured into bench/results/scale.json")  # fmt: skip
    parser.add_argument("--d-model", type=int)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--micro-batch", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--procs", help="process counts, e.g. 2,4")
    parser.add_argument("--layouts", help="only these layouts, e.g. fsdp,tp2")
    parser.add_argument("--name", help="bench/results/NAME.json")
    parser.add_argument(
        "--worker", nargs=4, metavar=("CONFIG", "TOKENS", "TOKENIZER", "OUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    for key, value in (PLAN_VS_MEASURED if args.plan_vs_measured else THROUGHPUT).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.plan_vs_measured and args.layouts is None:
        args.layouts = ",".join(MEMORY_LAYOUTS)
    chosen = set(args.layouts.split(",")) if args.layouts else None

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
    with tempfile.TemporaryDirectory(prefix="smelt-bench-parallel-") as tmp:
        tokens, tokenizer = synthetic_data(Path(tmp))
        for procs in [int(p) for p in args.procs.split(",")]:
            for name, keys in layouts(procs).items():
                if chosen is not None and name not in chosen:
                    continue
                raw = raw_config(args, keys)
                if args.plan_vs_measured:
                    raw["train"]["keep_host_memory"] = False
                label = f"{name}_{procs}p"
                why = accepted(raw, procs)
                if why:
                    not_built[label] = why
                    continue
                try:
                    live = LIVE_MEMORY if args.plan_vs_measured else None
                    ranks = run_layout(raw, procs, tokens, tokenizer, Path(tmp) / label, live)
                except RuntimeError as error:  # accepted by the check but failed to train: say so, go on
                    failed[label] = str(error)
                    print(f"{label}: failed: {error}", flush=True)
                    continue
                if args.plan_vs_measured:
                    figures[label] = plan_vs_measured(ranks, raw, procs)
                    print(f"{label}: {figures[label]}", flush=True)
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
                print(f"{label}: {ranks[0]['tokens_per_s']:.0f} tokens/s", flush=True)
    figures["not_built"] = not_built
    figures["failed"] = failed
    figures["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    if args.plan_vs_measured:
        keys = ("d_model", "layers", "heads", "seq_len", "micro_batch", "steps")
        figures["settings"] = {key: getattr(args, key) for key in keys}
        figures["measured"] = (
            "per rank, the resident high-water mark at the last optimizer step less the resident size when "
            "the model's build began, with train.keep_host_memory off and MALLOC_MMAP_THRESHOLD_=131072 so "
            "that it follows the live tensors; plan: smelt plan memory's model state, activations and logits "
            "for the rank's stage (fp32, no recompute, no overhead)"
        )
        write_plan_vs_measured(args.name, figures)
        return
    figures["comm_bytes_convention"] = (
        "collective size S per op (nccl-tests): all-reduce/broadcast buffer, all-gather output, reduce-scatter "
        "input, p2p tensor; summed over one optimizer step (first step and set-up excluded)"
    )
    write_result(args.name, figures)


if __name__ == "__main__":
    main()
