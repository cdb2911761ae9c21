"""The items of bench/gpu_check.py, each run in its own process: `run_item(name, work, dry_run)`.

An item returns its figures, or raises CheckFailed (a check that ran and did not hold, with the
figures it has) or any other exception (it could not run). Runs go under WORK/runs/; the smelt command
line runs as `python -m smelt` from this checkout, as a user would run it.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from common import smelt_env

from smelt.metric_records import read_records

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
QUICKSTART_TOML = REPO / "src" / "smelt" / "configs" / "quickstart.toml"


class CheckFailed(Exception):
    def __init__(self, message: str, figures: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.figures = figures or {}


@dataclass
class Context:
    work: Path
    dry: bool
    item: str = ""

    def partial(self, figures: dict[str, Any]) -> None:
        """The figures so far, which the parent reports if this item runs out of time."""
        (self.work / "items" / f"{self.item}.partial.json").write_text(json.dumps(figures, default=str))

    @property
    def runs(self) -> Path:
        return self.work / "runs"

    @property
    def quickstart(self) -> Path:
        return self.runs / "quickstart"

    @property
    def device(self) -> torch.device:
        return torch.device("cpu") if self.dry else torch.device("cuda", 0)

    @property
    def device_type(self) -> str:
        return self.device.type


# --- helpers ----------------------------------------------------------------------------------------


def smelt_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "smelt", *map(str, args)]


def smelt(ctx: Context, log_name: str, *args: str, timeout: float = 600) -> str:
    """Run one smelt command to its end; its output goes to WORK/logs/LOG_NAME.log. A nonzero exit
    raises with the end of that output."""
    log = ctx.work / "logs" / f"{log_name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:  # written as it goes: an item killed at its deadline leaves its log
        proc = subprocess.run(smelt_command(*args), cwd=REPO, env=smelt_env(), stdout=out, stderr=subprocess.STDOUT,
                              timeout=timeout)  # fmt: skip
    text = log.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"`smelt {' '.join(map(str, args))}` exited {proc.returncode}: {text[-1200:]}")
    return text


def sets(overrides: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in overrides.items():
        text = json.dumps(value) if isinstance(value, (bool, list)) else str(value)
        out += ["--set", f"{key}={text}"]
    return out


def records(metrics: Path, kind: str = "train") -> list[dict[str, Any]]:
    return [r for r in read_records(metrics) if r.get("kind") == kind]


def fresh(ctx: Context, name: str) -> Path:
    """WORK/runs/NAME, empty: an earlier attempt's directory (a rerun with --only) moves to
    WORK/superseded/, so each attempt measures a cold run and never finds its stages up to date."""
    run = ctx.runs / name
    if run.exists() or run.is_symlink():
        aside = ctx.work / "superseded" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        run.rename(aside)
    return run


def linked_run(ctx: Context, name: str) -> Path:
    """A new run directory that trains on the quickstart's documents, tokenizer and tokens (symlinks):
    `smelt train` with run.name = NAME then finds its inputs up to date."""
    run = fresh(ctx, name)
    run.mkdir(parents=True)
    for stage in ("documents", "tokenizer", "tokens"):
        link = run / stage
        if not link.exists():
            link.symlink_to(ctx.quickstart / stage, target_is_directory=True)
    return run


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quickstart_vocab(ctx: Context) -> int:
    return int(json.loads((ctx.quickstart / "tokenizer" / "smelt.json").read_text())["vocab_size"])


# --- 1. the quickstart ------------------------------------------------------------------------------


def quickstart(ctx: Context) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    if ctx.dry:  # the plumbing at tiny size: 3 steps, a small eval
        overrides = {"train.tokens": 12_288, "train.eval_every": 0, "eval.max_bytes": 20_000,
                     "eval.tasks": [], "eval.max_new_tokens": 8, "train.log_every": 1}  # fmt: skip
    fresh(ctx, "quickstart")
    started = time.perf_counter()
    smelt(ctx, "quickstart", "quickstart", "--run-dir", ctx.runs, *sets(overrides))
    wall = time.perf_counter() - started
    summary = json.loads((ctx.quickstart / "summary.json").read_text())
    train = json.loads((ctx.quickstart / "train" / "summary.json").read_text())
    figures = {
        "pipeline_s": round(wall, 1),
        "stage_s": {k: v.get("wall_time_s") for k, v in summary.get("stages", {}).items()},
        "train_device": train.get("device"),
        "precision": train.get("precision"),
        "train_tokens": train.get("tokens"),
        "train_tokens_per_s": round(train.get("tokens_per_s") or 0, 1),
        "train_mfu": train.get("mfu"),
        "val_bits_per_byte": summary.get("val_bits_per_byte"),
        "val_xz_bits_per_byte": summary.get("val_xz_bits_per_byte"),
    }
    if train.get("device", "").split(":")[0] != ctx.device_type:
        raise CheckFailed(f"training ran on {train.get('device')}, not {ctx.device_type}", figures)
    bpb, xz = summary.get("val_bits_per_byte"), summary.get("val_xz_bits_per_byte")
    if not ctx.dry and not (bpb is not None and xz is not None and bpb < xz):
        raise CheckFailed(f"held-out bits per byte {bpb} not below xz's {xz}", figures)
    return figures


# --- 2. export to Hugging Face ----------------------------------------------------------------------


def export_hf(ctx: Context) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from smelt.checkpoint.store import load_model
    from smelt.layout import checkpoints_dir, latest_checkpoint
    from smelt.model.generate import generate

    out = fresh(ctx, "hf")
    smelt(ctx, "export_hf", "export", "hf", ctx.quickstart, "--out", out)
    device = ctx.device
    torch.backends.cuda.matmul.allow_tf32 = False  # parity in true fp32
    torch.backends.cudnn.allow_tf32 = False
    ours, _ = load_model(latest_checkpoint(checkpoints_dir(ctx.quickstart)), device)
    ours.eval()
    theirs = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    text = "import os\n\n\nclass Parser:\n    def parse(self, text):\n        return text.split()\n"
    ids = tokenizer(text)["input_ids"]
    x = torch.tensor([ids], device=device)
    with torch.no_grad():
        logits_ours = ours(x)[0].float()
        logits_theirs = theirs(x).logits.float()
    diff = (logits_ours - logits_theirs).abs().max().item()
    new = 24
    with torch.no_grad():
        hf_ids = theirs.generate(x, max_new_tokens=new, do_sample=False, min_new_tokens=new,
                                 pad_token_id=tokenizer.pad_token_id)[0].tolist()  # fmt: skip
    our_ids = generate(ours, ids, max_new_tokens=new, temperature=0.0)
    figures = {
        "device": str(next(theirs.parameters()).device),
        "logits_max_abs_diff": diff,
        "prompt_tokens": len(ids),
        "greedy_tokens_equal": hf_ids == our_ids[: len(hf_ids)],
        "hf_generated": tokenizer.decode(hf_ids[len(ids) :]),
    }
    if diff > 1e-3:
        raise CheckFailed(f"logits differ by {diff:.3g} (> 1e-3 in fp32)", figures)
    if not figures["greedy_tokens_equal"]:
        raise CheckFailed("transformers' greedy generate and smelt's differ", figures)
    return figures


# --- 3. post-training -------------------------------------------------------------------------------


def posttrain(ctx: Context) -> dict[str, Any]:
    steps = 3 if ctx.dry else 30
    figures: dict[str, Any] = {}
    sft, grpo = fresh(ctx, "sft"), fresh(ctx, "grpo")
    common = {"optim.steps": steps, "optim.log_every": 1 if ctx.dry else 5}
    started = time.perf_counter()
    smelt(ctx, "sft", "posttrain", "run", REPO / "configs/posttrain/sft_addition.toml",
          *sets({"run.init_from": ctx.quickstart, "run.out": sft, "optim.eval_every": steps,
                 "data.heldout": 20, **common}))  # fmt: skip
    figures["sft_s"] = round(time.perf_counter() - started, 1)
    started = time.perf_counter()
    grpo_sets = {"run.init_from": sft, "run.out": grpo, "data.heldout": 20, "eval.items": 8 if ctx.dry else 20,
                 **common}  # fmt: skip
    if ctx.dry:
        grpo_sets.update({"grpo.group_size": 2, "optim.batch_size": 2})
    smelt(ctx, "grpo", "posttrain", "run", REPO / "configs/posttrain/grpo_addition.toml", *sets(grpo_sets))
    figures["grpo_s"] = round(time.perf_counter() - started, 1)
    for name, run in (("sft", sft), ("grpo", grpo)):
        summary = json.loads((run / "summary.json").read_text())
        flat = {k: v for k, v in summary.items() if isinstance(v, (int, float, str)) and len(str(v)) < 80}
        figures[f"{name}_summary"] = flat
        trained = records(run / "train" / "metrics.jsonl")
        figures[f"{name}_steps_logged"] = max((r.get("step", 0) for r in trained), default=0)
        start = [r for r in records(run / "train" / "metrics.jsonl", "event") if r.get("event") == "start"]
        device = figures[f"{name}_device"] = str(start[-1].get("device")) if start else "unknown"
        if figures[f"{name}_steps_logged"] != steps:
            raise CheckFailed(f"{name} logged {figures[f'{name}_steps_logged']} of {steps} steps", figures)
        if device.split(":")[0] != ctx.device_type:
            raise CheckFailed(f"{name} ran on {device}, not {ctx.device_type}", figures)
    return figures


# --- 4. SIGKILL and resume --------------------------------------------------------------------------


def committed_steps(run: Path) -> list[int]:
    from smelt.layout import checkpoints_dir, list_checkpoints, step_of

    return [step_of(p) for p in list_checkpoints(checkpoints_dir(run))]


def kill_resume(ctx: Context) -> dict[str, Any]:
    # On an H200 a small-5m step took about 50 ms and each run about 10 s to start (docs/benchmarks.md).
    steps, every = (12, 4) if ctx.dry else (160, 50)
    kill_after = every + (2 if ctx.dry else 20)
    overrides = {
        "model.preset": "tiny-1m" if ctx.dry else "small-5m",
        "train.tokens": steps * 4096,
        "train.log_every": 1,
        "train.eval_every": 0,
        "train.compile": False,
        "train.deterministic": True,
        "checkpoint.every_steps": every,
    }
    base = ["train", QUICKSTART_TOML, "--set", f"run.dir={ctx.runs}"]
    linked_run(ctx, "kr_reference")
    smelt(ctx, "kr_reference", *base, "--set", "run.name=kr_reference", *sets(overrides))
    killed = linked_run(ctx, "kr_killed")
    command = smelt_command(*base, "--set", "run.name=kr_killed", *sets(overrides))
    metrics = killed / "train" / "metrics.jsonl"
    with open(ctx.work / "logs" / "kr_killed_first.log", "w") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=smelt_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        last = 0
        while proc.poll() is None:
            logged = records(metrics)
            last = logged[-1]["step"] if logged else 0
            if last >= kill_after and committed_steps(killed):
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.02)
        proc.wait()
    if proc.returncode != -signal.SIGKILL:
        raise CheckFailed(f"the run ended (rc {proc.returncode}) before it could be killed mid-run")
    before_kill = records(metrics)
    killed_at = before_kill[-1]["step"]
    checkpoint_at = max(s for s in committed_steps(killed) if s <= killed_at)
    smelt(ctx, "kr_resumed", *base, "--set", "run.name=kr_killed", *sets(overrides))
    reference = {r["step"]: r for r in records(ctx.runs / "kr_reference" / "train" / "metrics.jsonl")}
    resumed: dict[int, dict[str, Any]] = {}
    for record in records(metrics):
        resumed[record["step"]] = record  # the resumed attempt's record of a redone step comes last
    first_attempt = {r["step"]: r for r in before_kill}
    differences = []
    for step, ref in reference.items():
        mine = resumed.get(step)
        if mine is None:
            differences.append((step, "missing"))
            continue
        for key in ("loss", "grad_norm"):
            if ref[key] != mine[key]:
                differences.append((step, f"{key} {ref[key]!r} != {mine[key]!r}"))
    redone_equal = all(first_attempt[s]["loss"] == resumed[s]["loss"]
                       for s in first_attempt if s > checkpoint_at and s in resumed)  # fmt: skip
    loss_diffs = [abs(reference[s]["loss"] - resumed[s]["loss"]) for s in reference if s in resumed]
    train_summary = json.loads((killed / "train" / "summary.json").read_text())
    figures = {
        "steps": steps,
        "killed_at_step": killed_at,
        "resumed_from_step": train_summary.get("resumed_from_step", checkpoint_at),
        "steps_redone": killed_at - checkpoint_at,
        "steps_compared": len(reference),
        "steps_differing": len(differences),
        "max_abs_loss_diff": max(loss_diffs, default=None),
        "redone_steps_equal_first_attempt": redone_equal,
        "bitwise": not differences,
        "goodput_lost_steps": (train_summary.get("goodput") or {}).get("lost_steps"),
        "device": train_summary.get("device"),
    }
    if differences:
        raise CheckFailed(f"{len(differences)} steps differ from the uninterrupted run, first: "
                          f"{differences[0]}", figures)  # fmt: skip
    return figures


# --- 5. FSDP2 on one GPU ----------------------------------------------------------------------------


def packed_batches(vocab: int, batch: int, seq: int, count: int, device: torch.device) -> list[dict]:
    from gpu import packed_rows

    return [packed_rows(batch, seq, max(seq // 4, 8), vocab, device, seed) for seed in range(count)]


def train_losses(
    model: torch.nn.Module, batches: list[dict], device: torch.device, lr: float = 3e-4
) -> list[float]:
    from smelt.config import config_from_dict
    from smelt.train.optim import build_optimizer

    optimizer = build_optimizer(model, config_from_dict({"train": {"lr": lr}}).train, device)
    losses = []
    for batch in batches:
        loss = forward_loss(model, batch, device)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def fsdp_1gpu(ctx: Context) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from smelt.model.sizing import preset_config
    from smelt.model.transformer import Transformer

    torch.use_deterministic_algorithms(True, warn_only=True)
    device = ctx.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, rank=0, world_size=1, device_id=device if device.type == "cuda" else None
    )
    preset, seq, batch, vocab = ("tiny-1m", 64, 2, 512) if ctx.dry else ("small-5m", 1024, 8, 4096)
    cfg = preset_config(preset, max_seq_len=seq)
    batches = packed_batches(vocab, batch, seq, 4 if ctx.dry else 10, device)
    results = {}
    for label in ("plain", "fsdp2"):
        torch.manual_seed(0)
        model = Transformer(cfg, vocab).to(device)
        if label == "fsdp2":  # as train/parallel/distributed.py's wrap_model: each block, then the root
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
        results[label] = train_losses(model, batches, device)
    dist.destroy_process_group()
    diffs = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(results["plain"], results["fsdp2"], strict=True)]
    figures = {
        "backend": backend,
        "steps": len(batches),
        "losses_plain": results["plain"],
        "losses_fsdp2": results["fsdp2"],
        "max_rel_loss_diff": max(diffs),
        "bitwise": results["plain"] == results["fsdp2"],
    }
    if max(diffs) > 1e-5:
        raise CheckFailed(f"FSDP2 losses differ from the unwrapped model's by up to {max(diffs):.3g} relative",
                          figures)  # fmt: skip
    return figures


# --- 6. the async checkpoint's stall ----------------------------------------------------------------


def checkpoint_stall(ctx: Context) -> dict[str, Any]:
    import shutil
    import tempfile

    from smelt.checkpoint.saver import Checkpointer
    from smelt.config import config_from_dict
    from smelt.model.sizing import preset_config
    from smelt.model.transformer import Transformer
    from smelt.train.optim import build_optimizer

    device = ctx.device
    preset, seq, batch, vocab = ("tiny-1m", 64, 2, 512) if ctx.dry else ("llama-124m", 1024, 8, 32768)
    torch.manual_seed(0)
    cfg = preset_config(preset, max_seq_len=seq)
    model = Transformer(cfg, vocab).to(device)
    rows = packed_batches(vocab, batch, seq, 1, device)
    optimizer = build_optimizer(model, config_from_dict({"train": {"lr": 3e-4}}).train, device)
    train_losses_with(model, optimizer, rows, device)  # warm, and so the optimizer state exists
    meta = {"model_config": cfg.__dict__.copy(), "vocab_size": vocab, "tokens": 0}
    root = Path(tempfile.mkdtemp(prefix="smelt-gpu-check-ckpt-", dir=ctx.work))
    try:
        saver = Checkpointer(root / "sync", keep_last=1, async_save=False)
        sync(device)
        started = time.perf_counter()
        saver.save(1, model, optimizer, meta, {"rng": {}}, batch_tokens=1)
        sync_s = time.perf_counter() - started
        saver.close()
        saver = Checkpointer(root / "async", keep_last=1, async_save=True)
        stalls, writes = [], []
        for step in (2, 3, 4):  # the first async save also allocates the pinned host buffers
            sync(device)
            started = time.perf_counter()
            saver.save(step, model, optimizer, meta, {"rng": {}}, batch_tokens=1)
            blocked = time.perf_counter() - started
            loss = forward_loss(model, rows[0], device)  # one forward+backward overlaps the write
            loss.backward()
            sync(device)
            waited = time.perf_counter()
            saver.before_update()  # the next update may not start before the copy is done
            stalls.append(blocked + time.perf_counter() - waited)
            writes.append(saver.wait()[0]["write_s"])
            optimizer.zero_grad(set_to_none=True)
        saver.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    params = sum(p.numel() for p in model.parameters())
    figures = {
        "preset": preset,
        "params": params,
        "state_gb": round(params * 12 / 2**30, 3),  # fp32 weights + two Adam moments
        "sync_dcp_s": round(sync_s, 3),
        "async_first_stall_s": round(stalls[0], 3),
        "async_stall_s": round(median(stalls[1:]), 3),
        "async_write_s": round(median(writes[1:]), 3),
        "stall_vs_sync": round(median(stalls[1:]) / sync_s, 3),
    }
    if not ctx.dry and median(stalls[1:]) >= sync_s:
        raise CheckFailed("the async save stalls training as long as a synchronous one", figures)
    return figures


def forward_loss(model: torch.nn.Module, batch: dict, device: torch.device) -> torch.Tensor:
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        _, loss = model(batch["inputs"], batch["targets"], doc_ids=batch["doc_ids"],
                        position_ids=batch["position_ids"])  # fmt: skip
    return loss


def train_losses_with(
    model: torch.nn.Module, optimizer: Any, batches: list[dict], device: torch.device
) -> None:
    for batch in batches:
        forward_loss(model, batch, device).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


# --- 7. pytest -m gpu -------------------------------------------------------------------------------


def pytest_gpu(ctx: Context) -> dict[str, Any]:
    import xml.etree.ElementTree as ET

    report = ctx.work / "pytest_gpu.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "-q", "-p", "no:cacheprovider",
         f"--junitxml={report}", "-W", "ignore::DeprecationWarning"],
        cwd=REPO, env=smelt_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    (ctx.work / "logs").mkdir(exist_ok=True)
    (ctx.work / "logs" / "pytest_gpu.log").write_text(proc.stdout + proc.stderr)
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None
              or c.find("error") is not None]  # fmt: skip
    figures = {**counts, "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
               "failed_tests": failed}  # fmt: skip
    for prop in suite.iter("property"):  # what a test measured (record_property): compile's cost on CUDA
        figures[prop.get("name")] = prop.get("value")
    if proc.returncode != 0:
        raise CheckFailed(f"pytest -m gpu exited {proc.returncode}: {', '.join(failed)} "
                          f"{proc.stdout[-800:]}", figures)  # fmt: skip
    if not ctx.dry and figures["passed"] == 0:
        raise CheckFailed("no test ran on CUDA", figures)
    return figures


# --- 8. llama-124m compiled, flex and SDPA ----------------------------------------------------------


def model_124m(ctx: Context) -> dict[str, Any]:
    from smelt.model.sizing import preset_config
    from smelt.plan.memory import Layout, ModelShape, memory

    vocab = quickstart_vocab(ctx)
    if ctx.dry:
        preset, seq, micro, steps, log_every = "tiny-1m", 64, 4, 6, 2
        variants = [("sdpa", False, steps)]
    else:
        preset, seq, micro, steps, log_every = "llama-124m", 1024, 16, 100, 10
        # The eager SDPA run measures what compiling buys (train/speed.py's CUDA constants).
        variants = [("flex", True, steps), ("sdpa", True, steps), ("sdpa", False, 30)]
    batch_tokens = seq * micro
    figures: dict[str, Any] = {"preset": preset, "vocab": vocab, "seq_len": seq, "micro_batch": micro}
    for attention, compiled, n in variants:
        label = f"{attention}_{'compiled' if compiled else 'eager'}"
        name = f"m124_{label}"
        linked_run(ctx, name)
        overrides = {
            "run.dir": ctx.runs, "run.name": name, "model.preset": preset, "model.attention": attention,
            "model.max_seq_len": seq, "train.seq_len": seq, "train.micro_batch": micro,
            "train.batch_tokens": batch_tokens, "train.tokens": n * batch_tokens, "train.lr": 6e-4,
            "train.warmup_tokens": 10 * batch_tokens, "train.compile": compiled, "train.eval_every": 0,
            "train.log_every": log_every, "checkpoint.every_steps": 0,
        }  # fmt: skip
        started = time.perf_counter()
        smelt(ctx, name, "train", QUICKSTART_TOML, *sets(overrides))
        wall = time.perf_counter() - started
        logged = records(ctx.runs / name / "train" / "metrics.jsonl")
        steady = logged[1:] or logged
        window_s = [log_every * batch_tokens / r["tokens_per_s"] for r in logged]
        summary = json.loads((ctx.runs / name / "train" / "summary.json").read_text())
        figures[label] = {
            "steps": summary.get("steps"),
            "wall_s": round(wall, 1),
            "first_window_s": round(window_s[0], 2),
            "steady_window_s": round(median(window_s[1:] or window_s), 3),
            "tokens_per_s": round(median([r["tokens_per_s"] for r in steady]), 1),
            "mfu_pct": round(100 * median([r["mfu"] for r in steady]), 2) if steady[0].get("mfu") else None,
            "mfu_model_pct": round(100 * median([r["mfu_model"] for r in steady]), 2)
            if steady[0].get("mfu_model")
            else None,
            "peak_memory_gb": round(max(r.get("memory_mb") or 0 for r in logged) / 1024, 2),
            "final_loss": logged[-1]["loss"],
            "first_loss": logged[0]["loss"],
            "peak_tflops": round(summary["peak_flops"] / 1e12, 1) if summary.get("peak_flops") else None,
            "device": summary.get("device"),
            "params": summary.get("params_total"),
        }
        ctx.partial(figures)
    model_cfg = preset_config(preset, max_seq_len=seq)
    predicted = memory(ModelShape.from_config(model_cfg, vocab), Layout(recompute="none", micro_batch=micro,
                                                                        seq_len=seq))  # fmt: skip
    figures["plan_memory_gb"] = round(predicted.peak.total / 2**30, 2)
    figures["plan_memory_without_overhead_gb"] = round(
        (predicted.peak.total - predicted.peak.overhead) / 2**30, 2
    )
    if not ctx.dry:
        eager, compiled = figures["sdpa_eager"], figures["sdpa_compiled"]
        figures["compile_cold_s"] = round(compiled["first_window_s"] - eager["first_window_s"], 1)
        figures["compile_speedup"] = round(compiled["tokens_per_s"] / eager["tokens_per_s"], 3)
    for label, run in figures.items():
        if isinstance(run, dict) and not (
            math.isfinite(run["final_loss"]) and run["final_loss"] < run["first_loss"]
        ):
            raise CheckFailed(f"{label}: the loss did not fall ({run['first_loss']} -> {run['final_loss']})",
                              figures)  # fmt: skip
        if isinstance(run, dict) and str(run["device"]).split(":")[0] != ctx.device_type:
            raise CheckFailed(f"{label} trained on {run['device']}", figures)
    return figures


ITEMS = {
    "quickstart": quickstart,
    "export_hf": export_hf,
    "posttrain": posttrain,
    "kill_resume": kill_resume,
    "fsdp_1gpu": fsdp_1gpu,
    "checkpoint_stall": checkpoint_stall,
    "pytest_gpu": pytest_gpu,
    "model_124m": model_124m,
}


def run_item(name: str, work: Path, dry_run: bool) -> int:
    """Run one item and write WORK/items/NAME.json: status, figures, error."""
    ctx = Context(Path(work), dry_run, name)
    (ctx.work / "items" / f"{name}.partial.json").unlink(missing_ok=True)
    (ctx.work / "logs").mkdir(parents=True, exist_ok=True)
    result: dict[str, Any]
    try:
        result = {"status": "PASS", "figures": ITEMS[name](ctx)}
    except CheckFailed as exc:
        result = {"status": "FAIL", "error": str(exc), "figures": exc.figures}
    except Exception as exc:  # noqa: BLE001 - the item's error goes into the result, the others go on
        traceback.print_exc()
        result = {"status": "FAIL", "error": f"{type(exc).__name__}: {exc}"[:2000], "figures": {}}
    (ctx.work / "items" / f"{name}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, default=str)[:3000])
    return 0 if result["status"] == "PASS" else 1
