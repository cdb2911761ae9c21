"""When something periodic is due in the training loop: every n steps, optionally at the first step, and
at the last step or not (the final validation and save are the end of the run's, not the loop's)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Every:
    """Due at every multiple of `n` (0: never) before the run's `last` step, at step 1 when `first`, and at
    `last` when `at_last`."""

    n: int
    last: int
    first: bool = False
    at_last: bool = False

    def due(self, step: int) -> bool:
        if step >= self.last:
            return self.at_last and step == self.last
        return (self.first and step == 1) or (self.n > 0 and step % self.n == 0)
