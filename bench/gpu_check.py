"""The CUDA path of the product, proven in one command: `make gpu-check` (this script) on one NVIDIA GPU.

Usage: python bench/gpu_check.py [--dry-run] [--only ITEM,...] [--work DIR] [--budget-s 480] [--out FILE]

Each item runs in its own process (a CUDA error or a hung kernel in one cannot take the others down),
under a share of the wall-time budget, and ends PASS, FAIL (with its error) or SKIP (out of time, or
what it needs failed). The items (bench/gpu_check_items.py says what each does and measures):

    quickstart        `smelt quickstart` on CUDA: every stage, held-out bits per byte below xz's
    export_hf         `smelt export hf`, transformers on CUDA: logits parity and greedy `generate`
    posttrain         `smelt posttrain run`: SFT then GRPO, 30 steps each, from the quickstart model
    kill_resume       SIGKILL mid-run, resume: the records equal an uninterrupted run's (deterministic)
    fsdp_1gpu         FSDP2 in a one-process NCCL group: the same losses as the unwrapped model
    checkpoint_stall  the async checkpoint's training stall against a synchronous DCP save (124M)
    pytest_gpu        `pytest -m gpu`: CUDA RNG in checkpoints, pinned staging, fp16 scaling, flex, compile
    model_124m        llama-124m, bf16, compiled, flex and SDPA document masking, 100 steps on the
                      quickstart's packed tokens: tokens/s, both MFUs, peak memory against `smelt plan memory`

Writes bench/results/gpu_check.json: OVERALL, per item its status, figures and error, the device and the
wall time. Exit 0 when every item passed, 1 when one failed, 2 without CUDA (unless --dry-run).

--dry-run runs every item on the CPU at tiny shapes (gloo for the process group, SDPA for attention, no
compile) and writes into the work directory instead: it tests this script, not the GPU, and a test
runs it (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
from common import smelt_env  # noqa: E402 (bench/ on the path first)

# (name, seconds it may take at most on the GPU, the items whose outputs it reads, whether its figures
# are timings that need the GPU to itself). The untimed items run side by side (--jobs) once the
# quickstart they read is done; the timed ones run alone, after them. The caps come from an H200
# (docs/benchmarks.md, "GPU"): quickstart 90 s, export 35 s, FSDP2 31 s, pytest 83 s, stall 58 s.
ITEMS: list[tuple[str, int, tuple[str, ...], bool]] = [
    ("quickstart", 180, (), True),
    ("export_hf", 120, ("quickstart",), False),
    ("posttrain", 300, ("quickstart",), False),
    ("kill_resume", 240, ("quickstart",), False),
    ("fsdp_1gpu", 120, (), False),
    ("pytest_gpu", 240, (), False),
    ("checkpoint_stall", 120, (), True),
    ("model_124m", 360, ("quickstart",), True),
]
ITEM_NAMES = [item[0] for item in ITEMS]

NO_CUDA = (
    "error: `make gpu-check` proves smelt's CUDA path (training, checkpoints, resume, export, "
    "post-training on one NVIDIA GPU) and this machine has no CUDA device (torch.cuda.is_available() is "
    "False; torch {version}). Run it on a machine with an NVIDIA GPU, or `make gpu-check ARGS=--dry-run` "
    "(python bench/gpu_check.py --dry-run) to run every item on the CPU at tiny shapes."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="every item on the CPU at tiny shapes")
    p.add_argument("--only", default="", help=f"comma-separated items (of {', '.join(ITEM_NAMES)})")
    p.add_argument("--work", default="", help="scratch directory for the runs (default: a new temp dir)")
    p.add_argument("--budget-s", type=float, default=480.0, help="wall-time budget for all items")
    p.add_argument("--jobs", type=int, default=0, help="untimed items side by side (default 4 on a GPU, "
                   "1 with --dry-run)")  # fmt: skip
    p.add_argument("--out", default="", help="result file (default bench/results/gpu_check.json; "
                   "with --dry-run, WORK/gpu_check.json)")  # fmt: skip
    p.add_argument("--item", default="", help=argparse.SUPPRESS)  # the child process of one item
    return p.parse_args(argv)


class ItemProcess:
    """One item running in its own process group, with its deadline."""

    def __init__(self, name: str, args: argparse.Namespace, work: Path, timeout_s: float) -> None:
        self.name, self.work, self.timeout_s = name, work, timeout_s
        self.result_file = work / "items" / f"{name}.json"
        self.result_file.unlink(missing_ok=True)
        self.log = work / "items" / f"{name}.log"
        command = [sys.executable, str(Path(__file__).resolve()), "--item", name, "--work", str(work)]
        if args.dry_run:
            command.append("--dry-run")
        self.started = time.perf_counter()
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=smelt_env(PYTHONUNBUFFERED="1"),
                                         cwd=REPO, start_new_session=True)  # fmt: skip
        self.killed = False

    def poll(self) -> bool:
        """True once the process has ended (killed at its deadline if need be)."""
        if self.proc.poll() is not None:
            return True
        if time.perf_counter() - self.started > self.timeout_s:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.killed = True
            return True
        return False

    def result(self) -> dict[str, Any]:
        """Its result file, or FAIL with why it has none (and whatever figures it had written so far)."""
        if self.result_file.is_file():
            result = json.loads(self.result_file.read_text())
        else:
            tail = self.log.read_text(errors="replace")[-1500:]
            why = f"timed out after {self.timeout_s:.0f} s" if self.killed else (
                f"exited {self.proc.returncode} without a result")  # fmt: skip
            partial = self.work / "items" / f"{self.name}.partial.json"
            figures = json.loads(partial.read_text()) if partial.is_file() else {}
            result = {"status": "FAIL", "error": f"{why}; log tail: {tail}", "figures": figures}
        result["wall_s"] = round(time.perf_counter() - self.started, 1)
        return result


def run_items(args: argparse.Namespace, work: Path, names: list[str], deadline: float) -> dict[str, Any]:
    """Run the items: those that read another's output once it passed, the untimed ones --jobs at a
    time, a timed one only with nothing else running. Returns each item's result."""
    results: dict[str, dict[str, Any]] = {}
    for name in ITEM_NAMES:  # an item not run now counts as its last result in this work directory
        earlier = work / "items" / f"{name}.json"
        if name not in names and earlier.is_file():
            results[name] = json.loads(earlier.read_text())
    pending = [item for item in ITEMS if item[0] in names]
    running: list[tuple[ItemProcess, bool]] = []
    while pending or running:
        for proc, timed in list(running):
            if proc.poll():
                running.remove((proc, timed))
                results[proc.name] = proc.result()
                report(proc.name, results[proc.name])
        for item in list(pending):
            name, cap_s, needs, timed = item
            failed = [n for n in needs if n in results and results[n]["status"] != "PASS"]
            missing = [n for n in needs if n not in names and n not in results]
            if failed or missing:
                why = f"needs {', '.join(failed or missing)}, which " + (
                    "did not pass" if failed else "has not run in this work directory")  # fmt: skip
                results[name] = {"status": "SKIP", "error": why, "figures": {}}
            elif deadline - time.perf_counter() < 10:
                results[name] = {"status": "SKIP", "error": "out of time (--budget-s)", "figures": {}}
            elif any(n not in results for n in needs):
                continue  # what it reads is still running
            elif running and (timed or any(t for _, t in running) or len(running) >= args.jobs):
                continue
            else:
                timeout = min(cap_s, deadline - time.perf_counter())
                print(f"== {name} (at most {timeout:.0f} s{'' if timed else ', beside others'})", flush=True)
                running.append((ItemProcess(name, args, work, timeout), timed))
                pending.remove(item)
                continue
            pending.remove(item)
            report(name, results[name])
        time.sleep(0.2)
    return {name: results[name] for name in names if name in results}


def report(name: str, result: dict[str, Any]) -> None:
    print(
        f"   {name}: {result['status']} {result.get('wall_s', '')} s {result.get('error', '')[:300]}",
        flush=True,
    )


# What the items import besides torch (pyproject.toml's dependencies that the pipeline loads, and
# transformers for the export check), by import name and package name.
NEEDED = {"tokenizers": "tokenizers", "pyarrow": "pyarrow", "numpy": "numpy", "safetensors": "safetensors",
          "tqdm": "tqdm", "zstandard": "zstandard", "numba": "numba", "fsspec": "fsspec",
          "transformers": "transformers", "pytest": "pytest"}  # fmt: skip


def missing_packages() -> list[str]:
    import importlib.util

    return [package for module, package in NEEDED.items() if importlib.util.find_spec(module) is None]


def flatten(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A flat result (design.md: named figures whose keys carry their units), item name first."""
    flat: dict[str, Any] = {}
    for name, result in results.items():
        flat[f"{name}_status"] = result["status"]
        flat[f"{name}_wall_s"] = result.get("wall_s")
        if result.get("error"):
            flat[f"{name}_error"] = result["error"]
        for key, value in result.get("figures", {}).items():
            if isinstance(value, dict):  # one run's figures (model_124m's flex_compiled, ...)
                flat.update({f"{name}_{key}_{k}": v for k, v in value.items()})
            else:
                flat[f"{name}_{key}"] = value
    return flat


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("error: PyTorch is not importable by this Python (" + sys.executable + "); run `make "
              "gpu-check` from a checkout whose `make install` has run, or with a Python that has torch.",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.item:
        from gpu_check_items import run_item

        return run_item(args.item, Path(args.work), args.dry_run)
    if not args.dry_run and not torch.cuda.is_available():
        print(NO_CUDA.format(version=torch.__version__), file=sys.stderr)
        return 2
    missing = missing_packages()
    if missing:
        print(f"error: this Python ({sys.executable}) lacks {', '.join(missing)}, which smelt's pipeline or "
              f"the export check imports. Install them (`pip install {' '.join(missing)}`, or the wheels where "
              "the machine has no index), or run from a checkout whose `make install` has run.",
              file=sys.stderr)  # fmt: skip
        return 2
    only = [n for n in args.only.split(",") if n]
    unknown = sorted(set(only) - set(ITEM_NAMES))
    if unknown:
        print(f"error: --only names no item {', '.join(unknown)}; the items are {', '.join(ITEM_NAMES)}.",
              file=sys.stderr)  # fmt: skip
        return 2
    args.jobs = args.jobs or (1 if args.dry_run else 4)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="smelt-gpu-check-"))
    (work / "items").mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = run_items(args, work, only or ITEM_NAMES, started + args.budget_s)
    overall = "PASS" if all(r["status"] == "PASS" for r in results.values()) else "FAIL"
    figures: dict[str, Any] = {
        "overall": overall,
        "dry_run": args.dry_run,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.dry_run else "cpu",
        "wall_s": round(time.perf_counter() - started, 1),
        "budget_s": args.budget_s,
        "items_passed": sum(r["status"] == "PASS" for r in results.values()),
        "items": len(results),
        **flatten(results),
    }
    from common import write_result

    out = Path(args.out) if args.out else (work / "gpu_check.json" if args.dry_run else None)
    if out is None:
        write_result("gpu_check", figures)
    else:
        from common import machine

        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({**figures, "machine": machine(), "command": " ".join(sys.argv)},
                                  indent=2, sort_keys=True) + "\n")  # fmt: skip
        print(f"-> {out}")
    print(f"gpu-check: {overall} ({figures['items_passed']} of {len(results)} items passed, "
          f"{figures['wall_s']} s)")  # fmt: skip
    return 0 if overall == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
