"""A process's random number generators as JSON (Python, NumPy, torch CPU, CUDA): each rank's
`rank_RRRRR.json` in a checkpoint, so a resumed run draws what an uninterrupted one would."""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch


def _tensor_b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _b64_tensor(text: str) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(base64.b64decode(text), dtype=np.uint8).copy())


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """This process's RNG states (Python, NumPy, torch CPU, CUDA) as JSON."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch_cpu": _tensor_b64(torch.get_rng_state()),
    }
    if device is not None and device.type == "cuda":
        state["torch_cuda"] = [_tensor_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict[str, Any], device: torch.device | None = None) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_b64_tensor(state["torch_cpu"]))
    if device is not None and device.type == "cuda" and "torch_cuda" in state:
        torch.cuda.set_rng_state_all([_b64_tensor(s) for s in state["torch_cuda"]])
