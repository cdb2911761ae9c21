"""What `smelt ladder` does with a planned ladder: write its launch scripts, or run its rungs here and
fit the scaling law on their results (planning in plan/ladder.py; the command's flags in cli/plan.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from smelt.config import Config
from smelt.plan import ladder as L


def emit_scripts(
    cfg: Config,
    config_path: str,
    overrides: list[str],
    rungs: list[L.Rung],
    gpus_per_run: int,
    gpus_per_node: int,
    slurm: bool,
) -> list[Path]:
    """RUN/ladder/commands.sh (the data stages, one torchrun line per rung, the fit) and, for Slurm,
    slurm.sh; returns the files written."""
    out = L.ladder_dir(cfg)
    commands = L.data_commands(config_path, overrides) + L.train_commands(
        cfg, config_path, overrides, rungs, gpus_per_run, gpus_per_node
    )
    commands.append(f"smelt scaling fit {out}")
    (out / "commands.sh").write_text("#!/bin/bash\nset -euo pipefail\n" + "\n".join(commands) + "\n")
    written = [out / "commands.sh"]
    if slurm:
        text = L.slurm_script(cfg, config_path, overrides, rungs, gpus_per_run, gpus_per_node)
        (out / "slurm.sh").write_text(text)
        written.append(out / "slurm.sh")
    return written


MIN_RUNS_TO_FIT = 5  # L(N, D) has 5 parameters


def run_and_fit(
    cfg: Config,
    rungs: list[L.Rung],
    plan: dict[str, Any],
    run_stage: Any,
    force: bool,
    bootstrap: int,
    isoflop: bool,
) -> tuple[list[dict[str, Any]], Any]:
    """Train every rung here, record the results in the plan file, and fit the law when there are
    enough of them; returns (the results, the fit's report or None)."""
    results = L.run_ladder(cfg, rungs, run_stage, force=force)
    L.write_plan(cfg, rungs, {**plan, "results": results})
    if len(results) < MIN_RUNS_TO_FIT:
        return results, None
    from smelt.plan.points import read_runs
    from smelt.plan.scaling import scaling_fit

    points = read_runs([L.ladder_dir(cfg)])
    report = scaling_fit(
        points, L.ladder_dir(cfg) / "scaling_fit", bootstrap_samples=bootstrap, isoflop=isoflop
    )
    return results, report
