"""`smelt export hf`: a committed checkpoint directory -> a Hugging Face folder. The conversion of a
model is model/hf.py's; loading the checkpoint is this package's, so the arrow points one way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from smelt.checkpoint.store import load_model
from smelt.errors import UserError
from smelt.model.hf import check_exportable, export_model, hf_config


def export_hf(
    checkpoint_dir: str | Path, tokenizer_dir: str | Path | None, out_dir: str | Path, dtype: str = "float32"
) -> dict[str, Any]:
    """`smelt export hf`: a checkpoint directory -> a folder `AutoModelForCausalLM` loads. Returns a summary."""
    choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in choices:
        raise UserError(f"export dtype {dtype!r} is not one of {', '.join(choices)}.")
    model, meta = load_model(Path(checkpoint_dir))
    check_exportable(model.cfg)
    out = export_model(model, out_dir, tokenizer_dir, choices[dtype])
    return {
        "path": str(out),
        "architecture": hf_config(model.cfg, model.vocab_size, choices[dtype])["architectures"][0],
        "step": meta.get("step"),
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": dtype,
    }
