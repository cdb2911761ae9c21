"""Supervised fine-tuning on conversations: loss on assistant tokens only, packed rows with
per-example attention masks and positions, its own schedule, validation loss on held-out items.

Packing: each conversation is one document of a row (its own doc id, RoPE positions from 0), so it
never attends to its neighbours; a target is trained only when the token it predicts is an assistant
token of the same conversation. Conversations longer than the sequence length are cut at its end.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from smelt.chat_template import ChatFormat, Encoded
from smelt.model.transformer import IGNORE_INDEX, position_ids_from_doc_ids
from smelt.posttrain.config import PostTrainConfig
from smelt.posttrain.data import conversation_split
from smelt.posttrain.loop import BEFORE, Cursor, Loop
from smelt.posttrain.stage import (
    Stage,
    begin,
    finish,
    guarded,
    make_optimizer,
    make_schedule,
    open_stage,
    optimizer_step,
    start_event,
)
from smelt.progress import log


@dataclass
class Packed:
    """Rows [R, T]: inputs, targets (-100 where untrained), document ids and positions."""

    inputs: torch.Tensor
    targets: torch.Tensor
    doc_ids: torch.Tensor
    position_ids: torch.Tensor
    truncated: int  # conversations cut at the sequence length

    def rows(self, index: list[int], device: torch.device) -> tuple[torch.Tensor, ...]:
        at = torch.tensor(index, dtype=torch.long)
        return tuple(t[at].to(device) for t in (self.inputs, self.targets, self.doc_ids, self.position_ids))

    def __len__(self) -> int:
        return self.inputs.shape[0]


def example_targets(encoded: Encoded) -> tuple[list[int], list[int]]:
    """(inputs, targets) of one conversation: position t predicts ids[t + 1], trained when it is masked."""
    ids, mask = encoded.ids, encoded.mask
    targets = [ids[t + 1] if mask[t + 1] else IGNORE_INDEX for t in range(len(ids) - 1)]
    return ids[:-1], targets


def pack(examples: list[Encoded], seq_len: int, pad_id: int) -> Packed:
    """First-fit packing of conversations (in the given order) into rows of seq_len tokens."""
    pieces, truncated = [], 0
    for encoded in examples:
        inputs, targets = example_targets(encoded)
        if len(inputs) > seq_len:
            inputs, targets, truncated = inputs[:seq_len], targets[:seq_len], truncated + 1
        if any(t != IGNORE_INDEX for t in targets):
            pieces.append((inputs, targets))
    rows: list[list[tuple[list[int], list[int]]]] = []
    free: list[int] = []
    for piece in pieces:
        slot = next((i for i, room in enumerate(free) if room >= len(piece[0])), None)
        if slot is None:
            rows.append([])
            free.append(seq_len)
            slot = len(rows) - 1
        rows[slot].append(piece)
        free[slot] -= len(piece[0])
    R = max(1, len(rows))
    inputs = torch.full((R, seq_len), pad_id, dtype=torch.long)
    targets = torch.full((R, seq_len), IGNORE_INDEX, dtype=torch.long)
    doc_ids = torch.zeros((R, seq_len), dtype=torch.long)
    for r, row in enumerate(rows):
        at = 0
        for d, (ids, tgt) in enumerate(row, 1):
            inputs[r, at : at + len(ids)] = torch.tensor(ids)
            targets[r, at : at + len(ids)] = torch.tensor(tgt)
            doc_ids[r, at : at + len(ids)] = d
            at += len(ids)
        doc_ids[r, at:] = len(row) + 1  # padding is a document of its own
    return Packed(inputs, targets, doc_ids, position_ids_from_doc_ids(doc_ids), truncated)


def encode_items(chat: ChatFormat, items: list[dict[str, Any]]) -> list[Encoded]:
    return [chat.encode(item["messages"]) for item in items]


def masked_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, ...], reduction: str = "mean") -> dict:
    """lm_loss parts of packed rows (token mean over trained targets, or per token with "none")."""
    inputs, targets, doc_ids, position_ids = batch
    _, parts = model(inputs, targets, doc_ids=doc_ids, position_ids=position_ids, loss_parts=True,
                     reduction=reduction)  # fmt: skip
    return parts


@torch.no_grad()
def validation_loss(stage: Stage, packed: Packed, batch_size: int) -> float | None:
    """Token-mean cross-entropy over every trained target of the held-out rows."""
    if len(packed) == 0 or not bool((packed.targets != IGNORE_INDEX).any()):
        return None
    was = stage.model.training
    stage.model.eval()
    total, count = 0.0, 0
    for start in range(0, len(packed), batch_size):
        batch = packed.rows(list(range(start, min(start + batch_size, len(packed)))), stage.device)
        with stage.precision.autocast():
            ce = masked_loss(stage.model, batch, reduction="none")["ce"]
        total += float(ce.double().sum())
        count += int((batch[1] != IGNORE_INDEX).sum())
    stage.model.train(was)
    return total / max(count, 1)


def run_sft(cfg: PostTrainConfig, force: bool = False, stage: Stage | None = None) -> dict[str, Any]:
    """Fine-tune the parent on conversations; returns the summary (also RUN/summary.json)."""
    with guarded(cfg, "sft"):
        return _run_sft(cfg, force, stage)


def _run_sft(cfg: PostTrainConfig, force: bool, stage: Stage | None) -> dict[str, Any]:
    split = conversation_split(cfg.data, cfg.run.seed, "sft")
    train_items, held = split.train, split.held
    stage = stage or open_stage(cfg, "sft", force)
    pad = stage.tokenizer.pad_id
    order = list(range(len(train_items)))
    random.Random(cfg.run.seed).shuffle(order)
    train = pack(encode_items(stage.chat, [train_items[i] for i in order]), stage.seq_len, pad)
    val = pack(encode_items(stage.chat, held), stage.seq_len, pad) if held else None
    begin(stage, split)
    o = cfg.optim
    loop = Loop(stage, make_optimizer(stage), make_schedule(stage), Cursor(len(train), cfg.run.seed + 1),
                o.batch_size)  # fmt: skip
    loop.restore()
    trained = int((train.targets != IGNORE_INDEX).sum())
    start_event(stage, o.steps, train_items=len(train_items), heldout_items=len(held), rows=len(train),
                truncated=train.truncated, trained_tokens_per_epoch=trained, seq_len=stage.seq_len,
                **split.stats())  # fmt: skip
    log(f"[sft] {len(train_items)} conversations in {len(train)} rows of {stage.seq_len} "
        f"({trained} trained tokens, {train.truncated} cut), {len(held)} held out; {o.steps} steps")  # fmt: skip

    def validate(step: int) -> float | None:
        value = validation_loss(stage, val, o.batch_size) if val is not None else None
        if value is not None:
            stage.log_record({"kind": "eval", "step": step, "tokens": stage.tokens, "val_loss": value})
        return value

    if loop.start_step == 0:
        loop.carry[BEFORE] = validate(0)
    stage.model.train()

    def step_fn(index: list[int], lr: float, step: int) -> dict[str, Any]:
        # The loss is the token mean over the whole global batch: each rank sums its rows' losses and
        # divides by the batch's trained-target count, times the world size that gradient averaging divides by.
        targets = int((train.targets[torch.tensor(index)] != IGNORE_INDEX).sum())
        batch = train.rows(stage.own(index), stage.device)
        with stage.precision.autocast():
            parts = masked_loss(stage.model, batch, reduction="none")
        (parts["loss"].sum() * (stage.world_size / max(targets, 1))).backward()
        ce = stage.all_sum(parts["ce"].detach().double().sum()) / max(targets, 1)
        norm = optimizer_step(stage, loop.optimizer, lr)
        return {
            "loss": float(ce),
            "grad_norm": norm,
            "target_tokens": targets,
            "tokens": len(index) * train.inputs.shape[1],
        }

    last = loop.run(step_fn, validate)
    final_val = validate(o.steps)
    return finish(stage, loop, o.steps, {
        "train_loss": last.get("loss"), "val_loss_before": loop.carry.get(BEFORE), "val_loss": final_val,
        "train_items": len(train_items), "heldout_items": len(held), "truncated": train.truncated,
        **split.stats(),
    })  # fmt: skip
