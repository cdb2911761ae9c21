"""Shared by the benchmark scripts: machine description and the result file."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]


def shared_data(*needed: str) -> Path:
    """The shared data directory: $SMELT_SHARED_DATA when set, else ../shared/data beside the repository.
    When a path in `needed` (relative to it) is missing, print where it looked and exit with status 2,
    like smelt's own errors for bad input."""
    configured = os.environ.get("SMELT_SHARED_DATA")
    root = Path(configured) if configured else REPO.parent / "shared" / "data"
    missing = [name for name in needed if not (root / name).exists()]
    if missing or not root.is_dir():
        where = f"$SMELT_SHARED_DATA = {configured}" if configured else f"{root} (beside the repository)"
        print(
            f"error: the shared data set is not where this benchmark looked: {where} lacks "
            f"{', '.join(missing) or 'everything'} (looked for {root / (missing or [''])[0]}). Set "
            f"SMELT_SHARED_DATA to the folder that holds corpus/ and eval/, e.g. "
            f"SMELT_SHARED_DATA=/path/to/shared/data python {Path(sys.argv[0]).as_posix()}.",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return root


def smelt_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child that runs smelt from this checkout (src/ on PYTHONPATH,
    so no install is needed, as on a GPU machine's own Python)."""
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    return env


def machine() -> dict[str, object]:
    import torch

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def write_result(name: str, figures: dict[str, object]) -> Path:
    """Write bench/results/NAME.json (flat figures + machine + command) and print a table."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {**figures, "machine": machine(), "command": " ".join([Path(sys.executable).name, *sys.argv])}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")
    print(f"-> {path}")
    return path
