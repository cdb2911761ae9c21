"""Benchmark scores during training: a small fixed subset of each task, scored every eval.every_steps.

Early in training only some formulations carry signal (cloze accuracy per character rises before
multiple-choice letters leave chance), so the loop logs every metric of each task, not just one.
The tasks are read and tokenized once, when the trainer starts. The call takes the plain module (not a
DDP or torch.compile wrapper), switches it to eval mode under no_grad, and restores its mode. Under
FSDP the parameters are sharded: call it on every rank with the FSDP-wrapped module (each forward
gathers the shards collectively) and log the result from rank 0 only.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from smelt.config import Config
from smelt.eval.harness import Prepared, prepare, score_prepared
from smelt.eval.tasks import configured_tasks_dir, get_spec, load_task, resolve_tasks_dir


class InLoopEval:
    """`InLoopEval(cfg, tokenizer_dir, device)(model, step)` -> {"task/metric": value}, and with
    eval.contamination_inloop, at every checkpoint step (checkpoint.every_steps and `last_step`),
    {"contamination": the meter's figures} (eval/contamination.py)."""

    def __init__(self, cfg: Config, tokenizer_dir: Path, device: torch.device, last_step: int = 0) -> None:
        from smelt.tokenizer.load import Tokenizer

        e = cfg.eval
        self.every = e.every_steps
        self.batch_size = e.batch_size
        self.device = device
        self.tokenizer = Tokenizer.load(tokenizer_dir)
        self.prepared: dict[str, Prepared] = {}
        self.meter, self.checkpoint_every, self.last_step = None, cfg.checkpoint.every_steps, last_step
        if e.contamination_inloop:
            from smelt.eval.contamination import ContaminationMeter
            from smelt.layout import STAGE_DIRS

            documents = Path(tokenizer_dir).parent / STAGE_DIRS["curate"]
            self.meter = ContaminationMeter(cfg, self.tokenizer, documents, cfg.model.max_seq_len)
        if not self.every or not (e.inloop_tasks or e.tasks):
            return
        tasks_dir = configured_tasks_dir(e.tasks_dir)
        specs = [get_spec(n, tasks_dir) for n in e.inloop_tasks or e.tasks]
        if not e.inloop_tasks:
            specs = [s for s in specs if s.formulation != "generate"]
        if any(s.needs_files() and s.root(tasks_dir) is None for s in specs):
            resolve_tasks_dir(e.tasks_dir)  # says where it looked and how to set it
        for spec in specs:
            task = load_task(spec, tasks_dir, e.inloop_items, e.shots)
            self.prepared[spec.name] = prepare(
                task, self.tokenizer, cfg.model.max_seq_len, e.overlong, e.convention
            )

    def due(self, step: int) -> bool:
        return self.tasks_due(step) or self.meter_due(step)

    def tasks_due(self, step: int) -> bool:
        return bool(self.every and self.prepared and step % self.every == 0)

    def meter_due(self, step: int) -> bool:
        every = self.checkpoint_every
        return self.meter is not None and (step == self.last_step or bool(every and step % every == 0))

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module, step: int) -> dict[str, Any]:
        """Every numeric metric of every task, keyed "task/metric" (a flat dict for metrics.jsonl), and
        the contamination meter's figures under "contamination" when it is due."""
        out: dict[str, Any] = {}
        if self.meter_due(step):
            started = time.perf_counter()
            out["contamination"] = self.meter(model, self.device, self.batch_size)
            out["contamination_s"] = round(time.perf_counter() - started, 3)
        if not self.tasks_due(step):
            return out
        for name, prep in self.prepared.items():
            result = score_prepared(model, self.tokenizer, prep, self.batch_size, self.device)
            for key in ("acc", "acc_per_char", "acc_per_token", "exact_match", "perplexity"):
                if key in result:
                    out[f"{name}/{key}"] = float(result[key])
        return out
