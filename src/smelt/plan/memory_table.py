"""The tables `smelt plan memory` prints: one layout's bytes per GPU, and the layouts of a cluster."""

from __future__ import annotations

from smelt.plan.memory import GB, Memory, Recommendation


def memory_rows(mem: Memory) -> list[tuple[str, str]]:
    """The breakdown table of one layout (its worst stage)."""
    peak = mem.peak
    rows = [("layout", mem.layout.describe())]
    if mem.layout.pp > 1:
        rows.append(
            (
                "worst stage",
                f"{peak.stage} ({', '.join(f'{s.stage} {s.total / GB:.1f} GB' for s in mem.stages)})",
            )
        )
    rows += [
        ("weights", f"{peak.weights / GB:.2f} GB"),
        ("gradients", f"{peak.gradients / GB:.2f} GB"),
        ("optimizer state", f"{peak.optimizer / GB:.2f} GB"),
    ]
    if peak.zero3_buffers:
        rows.append(("ZeRO-3 gathered weights", f"{peak.zero3_buffers / GB:.2f} GB"))
    rows += [
        ("activations", f"{peak.activations / GB:.2f} GB"),
    ]
    if peak.logits:
        rows.append(("logits (fp32)", f"{peak.logits / GB:.2f} GB"))
    rows += [
        ("overhead", f"{peak.overhead / GB:.2f} GB"),
        ("total per GPU", f"{peak.total / GB:.2f} GB"),
    ]
    return rows


def alternatives_table(rec: Recommendation) -> str:
    header = f"{'TP':>3} {'PP':>3} {'DP':>5} {'ZeRO':>5} {'GB/GPU (micro batch 1)':>23}  fits"
    lines = [header, "-" * len(header)]
    chosen = (rec.layout.tp, rec.layout.pp, rec.layout.dp, rec.layout.zero)
    for layout, mem, ok in rec.alternatives:
        mark = "  <- recommended" if (layout.tp, layout.pp, layout.dp, layout.zero) == chosen else ""
        lines.append(
            f"{layout.tp:>3} {layout.pp:>3} {layout.dp:>5} {layout.zero:>5} {mem.peak.total / GB:>23.1f}  "
            f"{'yes' if ok else 'no'}{mark}"
        )
    return "\n".join(lines)
