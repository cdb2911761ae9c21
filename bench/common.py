"""Shared by the benchmark scripts: machine description and the result file."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


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
