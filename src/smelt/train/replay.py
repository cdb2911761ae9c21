"""The side process of `smelt checkpoint drill`: resume a run's checkpoint into a scratch directory and
run a few of its steps the way the trainer does, writing each step's loss and gradient norm.

    python -m smelt.train.replay REQUEST.json RESULT.json

REQUEST names the checkpoint, the token and tokenizer directories, the resolved config (from the
checkpoint's meta.json, with the drill's overrides applied), how many steps to run and the scratch
directory. The steps go through the Trainer's own phases (build, resume, next batch, step, alert
decision, apply or skip), so the drill checks the path a real resume takes. Nothing is written into
the run; the scratch directory is the caller's to delete. With "probe_step" in the request (a spike's
triage), the model also scores that step's batch per document just before the step (train/spike_probe.py).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from smelt.config import config_from_dict
from smelt.train.optim import set_lr
from smelt.train.parallel.distributed import device_for, init_distributed, shutdown
from smelt.train.trainer import Trainer


def replay(request: dict[str, Any], probe: list | None = None) -> list[dict[str, Any]]:
    """Each replayed step's {"step", "loss", "grad_norm", "action"}, from the checkpoint's next step on;
    `probe` receives the segment losses of step request["probe_step"] (when given)."""
    cfg = config_from_dict(request["config"], origin=f"{request['checkpoint']}/meta.json")
    started = time.time()
    device = device_for(cfg.train.device, 0)
    ctx = init_distributed(device)
    trainer = Trainer(
        cfg, Path(request["tokens"]), Path(request["tokenizer"]), Path(request["scratch"]),
        Path(request["checkpoint"]), ctx, device, started,
    )  # fmt: skip
    trainer.build()
    trainer.resume()
    steps: list[dict[str, Any]] = []
    try:
        last = min(trainer.plan.steps, trainer.start_step + int(request["steps"]))
        for step in range(trainer.start_step + 1, last + 1):  # the order of Trainer.train's loop
            parts = trainer.next_batch(step)
            if probe is not None and step == request.get("probe_step"):
                from smelt.train.spike_probe import segment_losses

                probe.extend(segment_losses(trainer, parts))
            lr = trainer.schedule(step - 1)
            set_lr(trainer.optimizer, lr)
            loss, norm = trainer.step(parts)
            tokens = trainer.plan.tokens_at(step)
            decision = trainer.alerts.decide(step, tokens, loss, norm)
            trainer.apply_or_skip(step, tokens, decision, loss, norm, lr)
            steps.append({"step": step, "loss": loss, "grad_norm": norm, "action": decision.action})
    finally:
        trainer.checkpointer.close()
        trainer.loader.close()
        trainer.metrics.close()
        shutdown(ctx)
    return steps


def main(argv: list[str]) -> int:
    request_path, result_path = argv
    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    probe: list = []
    steps = replay(request, probe)
    Path(result_path).write_text(json.dumps({"steps": steps, "probe": probe}), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
