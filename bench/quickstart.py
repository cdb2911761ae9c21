"""Time `smelt quickstart` from scratch (and once more, cached) and record its figures."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write_result


def main() -> None:
    smelt = [sys.executable, "-m", "smelt.cli", "quickstart"]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.time()
        subprocess.run([*smelt, "--run-dir", tmp, *sys.argv[1:]], check=True)
        cold = time.time() - started
        summary = json.loads((Path(tmp) / "quickstart" / "summary.json").read_text())
        started = time.time()
        subprocess.run([*smelt, "--run-dir", tmp, *sys.argv[1:]], check=True, stdout=subprocess.DEVNULL)
        warm = time.time() - started
    stages = {f"stage_{name}_s": info["wall_time_s"] for name, info in summary["stages"].items()}
    write_result(
        "quickstart",
        {
            "quickstart_cold_s": round(cold, 1),
            "quickstart_cached_s": round(warm, 2),
            **stages,
            "documents_in": summary["documents_in"],
            "documents_kept": summary["documents_kept"],
            "params_total": summary["params_total"],
            "train_tokens": summary["train_tokens"],
            "train_tokens_per_s": round(summary["train_tokens_per_s"], 1),
            "train_mfu": summary["train_mfu"],
            "final_train_loss": summary["final_train_loss"],
            "final_val_loss": summary["final_val_loss"],
            "val_bits_per_byte_model": round(summary["val_bits_per_byte"], 4),
            "val_bits_per_byte_gzip": round(summary["val_gzip_bits_per_byte"], 4),
            "val_bits_per_byte_xz": round(summary["val_xz_bits_per_byte"], 4),
        },
    )


if __name__ == "__main__":
    main()
