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

# (name, seconds it may take at most on the GPU, the items whose outputs it reads), in running order:
# the cheap checks of the product first, the long compiled 124M runs last.
ITEMS: list[tuple[str, int, tuple[str, ...]]] = [
    ("quickstart", 150, ()),
    ("export_hf", 60, ("quickstart",)),
    ("posttrain", 120, ("quickstart",)),
    ("kill_resume", 90, ("quickstart",)),
    ("fsdp_1gpu", 60, ()),
    ("checkpoint_stall", 60, ()),
    ("pytest_gpu", 120, ()),
    ("model_124m", 240, ("quickstart",)),
]
ITEM_NAMES = [name for name, _, _ in ITEMS]

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
    p.add_argument("--out", default="", help="result file (default bench/results/gpu_check.json; "
                   "with --dry-run, WORK/gpu_check.json)")  # fmt: skip
    p.add_argument("--item", default="", help=argparse.SUPPRESS)  # the child process of one item
    return p.parse_args(argv)


def child_env() -> dict[str, str]:
    """The environment of every process: smelt importable from this checkout without an install."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_item_process(name: str, args: argparse.Namespace, work: Path, timeout_s: float) -> dict[str, Any]:
    """One item in its own process group; its result file, or FAIL with why it has none."""
    result_file = work / "items" / f"{name}.json"
    result_file.unlink(missing_ok=True)
    log = work / "items" / f"{name}.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--item", name, "--work", str(work)]
    if args.dry_run:
        command.append("--dry-run")
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=child_env(),
                                cwd=REPO, start_new_session=True)  # fmt: skip
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    seconds = round(time.perf_counter() - started, 1)
    if result_file.is_file():
        result = json.loads(result_file.read_text())
    else:
        tail = log.read_text(errors="replace")[-1500:]
        why = f"timed out after {timeout_s:.0f} s" if proc.returncode == -signal.SIGKILL else (
            f"exited {proc.returncode} without a result")  # fmt: skip
        result = {"status": "FAIL", "error": f"{why}; log tail: {tail}", "figures": {}}
    result["wall_s"] = seconds
    return result


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
    only = [n for n in args.only.split(",") if n]
    unknown = sorted(set(only) - set(ITEM_NAMES))
    if unknown:
        print(f"error: --only names no item {', '.join(unknown)}; the items are {', '.join(ITEM_NAMES)}.",
              file=sys.stderr)  # fmt: skip
        return 2
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="smelt-gpu-check-"))
    (work / "items").mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    deadline = started + args.budget_s
    results: dict[str, dict[str, Any]] = {}
    for name, cap_s, needs in ITEMS:
        if only and name not in only:
            continue
        failed_needs = [n for n in needs if n in results and results[n]["status"] != "PASS"]
        missing = [n for n in needs if n not in results and not (work / "items" / f"{n}.json").is_file()]
        left = deadline - time.perf_counter()
        if failed_needs or missing:
            why = f"needs {', '.join(failed_needs or missing)}, which " + (
                "did not pass" if failed_needs else "has not run in this work directory")  # fmt: skip
            results[name] = {"status": "SKIP", "error": why, "figures": {}}
        elif left < 10:
            results[name] = {"status": "SKIP", "error": "out of time (--budget-s)", "figures": {}}
        else:
            print(f"== {name} (at most {min(cap_s, left):.0f} s)", flush=True)
            results[name] = run_item_process(name, args, work, min(cap_s, left))
        status = results[name]
        print(
            f"   {status['status']} {status.get('wall_s', '')} s {status.get('error', '')[:300]}", flush=True
        )
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
