"""Pilot checks (`smelt train --check`): the stage-0 rungs of the pilot ladder, before spending compute.

Each check catches a class of bug that otherwise shows up days into a run, if at all:
- step-0 loss ~ ln V (within 0.1): a wrong init, a broken loss mask or a vocab mismatch moves it;
- every parameter receives a gradient: a detached branch or an unused module trains nothing silently;
- a fixed batch of 8 sequences overfits to near-zero loss: the model and optimizer can learn at all;
- two runs with the same seed are bitwise identical for 20 steps on CPU: nondeterminism would make
  every later comparison between runs noise.
The checks run on the configured model, data and tokenizer, in fp32 on the CPU, single process.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path

import torch

from smelt.config import Config
from smelt.metric_records import METRICS, read_records
from smelt.model.transformer import Transformer
from smelt.train.parallel.mesh import check_layout_keys
from smelt.train.setup import read_vocab_size
from smelt.train.trainer import train

STEP0_TOLERANCE = 0.1
OVERFIT_ROWS = 8
OVERFIT_STEPS = 300
OVERFIT_TARGET = 0.1  # nats
OVERFIT_LR = 1e-3  # safe across sizes; the check is whether it can learn, not how fast
REPRO_STEPS = 20


def _cpu_config(cfg: Config, **train: object) -> Config:
    # One process: the mesh keys are checked on their own (check_layout_keys), not launched.
    tc = dataclasses.replace(
        cfg.train, device="cpu", precision="fp32", compile=False, tensor_parallel=1, context_parallel=1,
        pipeline_parallel=1, data_parallel=0, **train,
    )  # fmt: skip
    return dataclasses.replace(cfg, train=tc)


def _fixed_batch(cfg: Config, tokens_dir: Path, tokenizer_dir: Path):  # noqa: ANN202 - a loader Batch
    from smelt.tokens.loader import TokenLoader  # lazy: tokens/ is a sibling stage

    loader = TokenLoader.from_config(cfg, tokens_dir, tokenizer_dir, 0, 1)
    try:
        return loader.global_batch(1)
    finally:
        loader.close()


def _forward(model: Transformer, batch, rows: int, doc_masking: bool) -> torch.Tensor:  # noqa: ANN001
    docs = {"doc_ids": batch.doc_ids[:rows], "position_ids": batch.position_ids[:rows]} if doc_masking else {}
    _, loss = model(batch.inputs[:rows], batch.targets[:rows], **docs)
    return loss


def pilot_checks(cfg: Config, tokens_dir: Path, tokenizer_dir: Path) -> list[tuple[str, bool, str]]:
    """Run the pilot checks; returns (name, passed, detail) rows for a pass/fail table."""
    tokens_dir, tokenizer_dir = Path(tokens_dir), Path(tokenizer_dir)
    results: list[tuple[str, bool, str]] = []
    tc = cfg.train  # the mesh keys: ConfigError when they cannot be launched
    if tc.tensor_parallel > 1 or tc.context_parallel > 1 or tc.pipeline_parallel > 1 or tc.data_parallel:
        results.append(("parallel layout", True, check_layout_keys(cfg)))
    for sized in cfg.sized:  # what follows the model's size, and where each value came from
        far = "; more than 3x from its rule: keep it only if measured" if sized.far_from_rule else ""
        results.append((sized.key, True, sized.describe() + far))
    cfg = _cpu_config(cfg)
    vocab = read_vocab_size(tokenizer_dir)
    batch = _fixed_batch(cfg, tokens_dir, tokenizer_dir)
    rows = min(OVERFIT_ROWS, batch.inputs.shape[0])

    torch.manual_seed(cfg.run.seed)
    model = Transformer(cfg.model, vocab)
    loss = _forward(model, batch, rows, cfg.train.doc_masking)
    expected = math.log(vocab)
    results.append((
        "step-0 loss ~ ln V", abs(loss.item() - expected) <= STEP0_TOLERANCE,
        f"{loss.item():.3f} vs ln {vocab} = {expected:.3f} (tolerance {STEP0_TOLERANCE})",
    ))  # fmt: skip

    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    results.append((
        "every parameter gets a gradient", not missing,
        "all parameters" if not missing else f"no gradient: {', '.join(missing[:5])}"
        + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""),
    ))  # fmt: skip

    torch.manual_seed(cfg.run.seed)
    model = Transformer(cfg.model, vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=OVERFIT_LR, betas=(0.9, 0.95), weight_decay=0.0)
    final, steps = float("nan"), 0
    for steps in range(1, OVERFIT_STEPS + 1):  # noqa: B007 - the count is reported
        loss = _forward(model, batch, rows, cfg.train.doc_masking)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        final = loss.item()
        if final < OVERFIT_TARGET:
            break
    results.append((
        f"overfit {rows} sequences", final < OVERFIT_TARGET,
        f"loss {final:.4f} after {steps} steps (target < {OVERFIT_TARGET})",
    ))  # fmt: skip

    results.append(_reproducibility(cfg, tokens_dir, tokenizer_dir))
    return results


def _reproducibility(cfg: Config, tokens_dir: Path, tokenizer_dir: Path) -> tuple[str, bool, str]:
    from smelt.checkpoint.store import load_model

    steps = REPRO_STEPS
    batch_tokens = cfg.train.batch_tokens or cfg.train.seq_len * cfg.train.micro_batch
    run_cfg = _cpu_config(cfg, tokens=steps * batch_tokens, log_every=1, eval_every=0, eval_tokens=0)
    run_cfg = dataclasses.replace(run_cfg, checkpoint=dataclasses.replace(cfg.checkpoint, every_steps=0))
    with tempfile.TemporaryDirectory(prefix="smelt-check-") as tmp:
        summaries, traces = [], []
        for name in ("a", "b"):
            out = Path(tmp) / name
            summaries.append(train(run_cfg, tokens_dir, tokenizer_dir, out))
            traces.append([r for r in read_records(out / METRICS) if r.get("kind") == "train"])
        a, _ = load_model(Path(summaries[0]["checkpoint"]))
        b, _ = load_model(Path(summaries[1]["checkpoint"]))
        same_weights = all(
            torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
        )
    same_losses = [_strip_timing(t) for t in traces[0]] == [_strip_timing(t) for t in traces[1]]
    detail = f"{steps} steps: losses {'identical' if same_losses else 'differ'}, "
    detail += f"weights {'identical' if same_weights else 'differ'}"
    return f"same seed, bitwise identical ({steps} steps)", same_losses and same_weights, detail


def _strip_timing(record: dict) -> tuple:
    return (record["step"], record["loss"], record["grad_norm"], record["lr"])
