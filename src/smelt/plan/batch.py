"""Batch-size helpers: the learning rate when the batch changes, and the critical batch.

Changing the global batch mid-plan (a bigger cluster, a batch ramp) changes the gradient noise; the
square-root rule keeps the update's signal-to-noise roughly constant for Adam-type optimizers
(Malladi et al. 2022). Past the critical batch (McCandlish et al. 2018; Kaplan et al. 2020), doubling the
batch no longer halves the number of steps, so the extra tokens per step buy little.
"""

from __future__ import annotations

import math

from smelt.errors import UserError

# Kaplan et al. (2020), eq. 1.4: B_crit(L) ~ B* / L^(1 / alpha_B), with L in nats per token.
CRITICAL_BATCH_TOKENS_AT_UNIT_LOSS = 2.0e8
CRITICAL_BATCH_ALPHA = 0.21


def scale_lr(lr: float, from_batch: float, to_batch: float) -> float:
    """Peak learning rate after the batch grows (or shrinks) k = to/from times: lr x sqrt(k)."""
    for flag, value in (("--lr", lr), ("--batch-tokens", from_batch), ("--new-batch-tokens", to_batch)):
        if not (math.isfinite(value) and value > 0):
            raise UserError(f"{flag} must be a positive number, got {value}.")
    return lr * math.sqrt(to_batch / from_batch)


def critical_batch_tokens(loss: float) -> float:
    """Kaplan et al.'s critical batch in tokens at a given loss (nats/token): ~2e8 / L^4.8.

    Fitted on WebText2 with GPT-2's tokenizer, so it is an order-of-magnitude guide, not a law of
    every corpus; its use here is to flag batches several times above it.
    """
    if not (math.isfinite(loss) and loss > 0):
        raise UserError(f"--loss must be a positive number of nats per token, got {loss}.")
    return CRITICAL_BATCH_TOKENS_AT_UNIT_LOSS / loss ** (1.0 / CRITICAL_BATCH_ALPHA)


def batch_rows(
    lr: float | None, batch_tokens: float, new_batch_tokens: float | None, loss: float | None
) -> tuple[list[tuple[str, str]], list[str]]:
    """Rows and warnings for `smelt plan batch`."""
    rows: list[tuple[str, str]] = [("batch", f"{batch_tokens:,.0f} tokens")]
    warnings: list[str] = []
    if new_batch_tokens is not None:
        k = new_batch_tokens / batch_tokens
        rows.append(("new batch", f"{new_batch_tokens:,.0f} tokens ({k:.3g}x)"))
        if lr is not None:
            new_lr = scale_lr(lr, batch_tokens, new_batch_tokens)
            rows.append(
                ("learning rate", f"{lr:.3g} -> {new_lr:.3g} (x sqrt({k:.3g}) = x{math.sqrt(k):.3g})")
            )
            rows.append(
                ("re-warm", "from ~50% of the new peak over 100-500M tokens (field guide, section 7)")
            )
    if loss is not None:
        critical = critical_batch_tokens(loss)
        rows.append((f"critical batch at loss {loss:g}", f"~{critical:,.0f} tokens (Kaplan et al. 2020)"))
        for name, value in (("batch", batch_tokens), ("new batch", new_batch_tokens)):
            if value is not None and value > 2 * critical:
                warnings.append(
                    f"the {name} ({value:,.0f} tokens) is {value / critical:.1f}x the critical batch: "
                    f"beyond it, larger batches cost tokens without saving steps."
                )
    return rows, warnings
