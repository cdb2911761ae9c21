"""A model's random initialisation as data: the ordered list of draws `Transformer.reset_parameters`
makes, so that a model built on the meta device and sharded (FSDP2, TP, PP) can draw the same values
one tensor at a time and keep only its own shard of each (train/materialize.py).

Every draw comes from the global CPU generator in this order, whether it lands in a whole tensor (one
process) or in a full-size scratch tensor whose local shard is then kept, so an N-rank run starts from
exactly the weights of a 1-rank run with the same seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class InitStep:
    """One draw: the tensor `name` of the module at `module` (a path from the root, "" for the root)."""

    module: str
    name: str
    kind: str  # "trunc_normal" (mean 0, cut at 3 std), "ones", "zeros", or a torch default (below)
    std: float = 0.0

    @torch.no_grad()
    def draw(self, tensor: torch.Tensor) -> None:
        if self.kind == "trunc_normal":
            nn.init.trunc_normal_(tensor, mean=0.0, std=self.std, a=-3 * self.std, b=3 * self.std)
        elif self.kind == "ones":
            nn.init.ones_(tensor)
        elif self.kind == "zeros":
            tensor.zero_()
        elif self.kind == "linear_weight":  # what nn.Linear's constructor draws
            nn.init.kaiming_uniform_(tensor, a=math.sqrt(5))
        elif self.kind == "linear_bias":
            bound = 1 / math.sqrt(self.std) if self.std > 0 else 0  # std holds the layer's fan-in here
            nn.init.uniform_(tensor, -bound, bound)
        elif self.kind == "embedding_weight":  # what nn.Embedding's constructor draws
            nn.init.normal_(tensor)
        else:
            raise ValueError(f"unknown init kind {self.kind!r}")

    def target(self, root: nn.Module) -> torch.Tensor | None:
        """The tensor this step writes in `root`, or None where this rank does not hold it (a pipeline
        stage of another rank)."""
        try:
            module = root.get_submodule(self.module) if self.module else root
            tensor = getattr(module, self.name)
        except AttributeError:
            return None
        return tensor if isinstance(tensor, torch.Tensor) else None


def constructor_steps(root: nn.Module) -> list[InitStep]:
    """The draws that building `root` on a CPU makes before its own initialisation: torch's default
    init of each nn.Linear and nn.Embedding, in the order they were built (their registration order).
    Their values are overwritten, but they move the generator, so a model built on the meta device
    replays them to start its own draws where a one-process build does."""
    steps: list[InitStep] = []
    for path, module in root.named_modules():
        if type(module) is nn.Linear:
            steps.append(InitStep(path, "weight", "linear_weight"))
            if module.bias is not None:
                steps.append(InitStep(path, "bias", "linear_bias", float(module.in_features)))
        elif type(module) is nn.Embedding:
            steps.append(InitStep(path, "weight", "embedding_weight"))
    return steps


def apply_init(root: nn.Module, steps: list[InitStep]) -> None:
    """The steps drawn in place, in order (the one-process initialisation)."""
    for step in steps:
        tensor = step.target(root)
        if tensor is not None:
            step.draw(tensor)
