"""Preference optimisation on pairs: DPO (against a frozen reference) or SimPO (reference-free).

DPO (Rafailov et al. 2023): loss = -log sigmoid(beta * ((log pi(c) - log ref(c)) - (log pi(r) - log ref(r))))
over the summed log-probs of each reply given the shared prompt. The reference is the parent, and its
log-probs are computed once, before the first step, and cached in RUN/train/reference_logps.json (keyed
by the parent checkpoint, the pairs and the sequence length), so no second model is held in memory.
With the policy equal to the reference the margin is 0 and the loss ln 2.

SimPO (Meng et al. 2024): loss = -log sigmoid(beta * (mean log pi(c) - mean log pi(r)) - gamma), the
per-token mean log-prob as the reward, so no reference and no length bias toward long replies.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from smelt.chat_template import ChatFormat
from smelt.config import hash_json
from smelt.model.transformer import IGNORE_INDEX
from smelt.posttrain.config import DPOSection, PostTrainConfig
from smelt.posttrain.data import pair_split
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

REFERENCE_FILE = "reference_logps.json"


@dataclass
class PairIds:
    """One pair as two rows: prompt + reply ids, and which ids are reply targets."""

    chosen: tuple[list[int], list[bool]]
    rejected: tuple[list[int], list[bool]]
    truncated: bool


def encode_pair(chat: ChatFormat, pair: dict[str, Any], seq_len: int) -> PairIds:
    """Ids of prompt + each side; a prompt too long is cut from its start (the EOS kept), a reply at its end."""
    prompt_len = len(chat.encode(pair["prompt"]).ids)
    rows, cut = [], False
    for side in ("chosen", "rejected"):
        encoded = chat.encode(pair["prompt"] + pair[side])
        ids, mask = encoded.ids, [False] * prompt_len + encoded.mask[prompt_len:]
        if len(ids) > seq_len:
            cut = True
            reply = len(ids) - prompt_len
            keep_prompt = max(1, seq_len - min(reply, seq_len * 3 // 4))
            drop = prompt_len - keep_prompt
            ids, mask = ids[:1] + ids[1 + drop :], mask[:1] + mask[1 + drop :]
            ids, mask = ids[:seq_len], mask[:seq_len]
        rows.append((ids, mask))
    return PairIds(rows[0], rows[1], cut)


def batch_rows(rows: list[tuple[list[int], list[bool]]], pad_id: int, device: torch.device):
    """Right-padded inputs and targets (-100 except reply tokens) [B, T - 1]."""
    width = max(len(ids) for ids, _ in rows) - 1
    inputs = torch.full((len(rows), width), pad_id, dtype=torch.long)
    targets = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    for i, (ids, mask) in enumerate(rows):
        n = len(ids) - 1
        inputs[i, :n] = torch.tensor(ids[:-1])
        targets[i, :n] = torch.tensor(
            [t if m else IGNORE_INDEX for t, m in zip(ids[1:], mask[1:], strict=True)]
        )
    return inputs.to(device), targets.to(device)


def sequence_logps(
    model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-prob of each row's targets [B], number of targets [B])."""
    _, parts = model(inputs, targets, reduction="none", loss_parts=True)
    counts = (targets != IGNORE_INDEX).sum(dim=1)
    return -parts["ce"].sum(dim=1), counts


def pair_logps(
    stage_model: torch.nn.Module, pairs: list[PairIds], pad_id: int, device, precision
) -> dict[str, torch.Tensor]:
    """Chosen and rejected summed log-probs and lengths of a batch of pairs (one forward for both)."""
    rows = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    inputs, targets = batch_rows(rows, pad_id, device)
    with precision.autocast():
        logps, counts = sequence_logps(stage_model, inputs, targets)
    n = len(pairs)
    return {"chosen": logps[:n].float(), "rejected": logps[n:].float(),
            "chosen_len": counts[:n].float(), "rejected_len": counts[n:].float()}  # fmt: skip


def preference_loss(
    policy: dict[str, torch.Tensor], reference: dict[str, torch.Tensor] | None, cfg: DPOSection
) -> dict[str, torch.Tensor]:
    """The loss (mean over pairs) and per-pair rewards of the chosen and rejected replies."""
    if cfg.loss == "simpo":
        chosen = cfg.simpo_beta * policy["chosen"] / policy["chosen_len"].clamp(min=1)
        rejected = cfg.simpo_beta * policy["rejected"] / policy["rejected_len"].clamp(min=1)
        logits = chosen - rejected - cfg.simpo_gamma
    else:
        if reference is None:
            raise ValueError("DPO needs reference log-probs")
        chosen = cfg.beta * (policy["chosen"] - reference["chosen"])
        rejected = cfg.beta * (policy["rejected"] - reference["rejected"])
        logits = chosen - rejected
    return {"loss": -F.logsigmoid(logits).mean(), "chosen_reward": chosen, "rejected_reward": rejected}


@torch.no_grad()
def reference_logps(stage: Stage, encoded: list[PairIds], batch_size: int) -> dict[str, list[float]]:
    """Summed log-probs of every pair under the stage's model as it is now (the parent): the reference."""
    was = stage.model.training
    stage.model.eval()
    out: dict[str, list[float]] = {"chosen": [], "rejected": []}
    for start in range(0, len(encoded), batch_size):
        got = pair_logps(stage.model, encoded[start : start + batch_size], stage.tokenizer.pad_id, stage.device,
                         stage.precision)  # fmt: skip
        out["chosen"] += got["chosen"].tolist()
        out["rejected"] += got["rejected"].tolist()
    stage.model.train(was)
    return out


def cached_reference(
    stage: Stage, encoded: list[PairIds], key: dict[str, Any], batch_size: int
) -> dict[str, list[float]]:
    """Reference log-probs from RUN/train/reference_logps.json when its key matches, else computed and cached."""
    path = stage.train_dir / REFERENCE_FILE
    digest = hash_json(key)
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("key") == digest:
            return saved["logps"]
    logps = reference_logps(stage, encoded, batch_size)
    if stage.is_main:  # every rank computed the same values
        path.write_text(json.dumps({"key": digest, "what": key, "logps": logps}))
    return logps


@torch.no_grad()
def heldout_metrics(
    stage: Stage, encoded: list[PairIds], reference: dict[str, list[float]] | None, batch_size: int
) -> dict[str, float]:
    """Preference accuracy on held-out pairs: `logp_accuracy` (mean token log-prob of the chosen reply above
    the rejected one's), and with a reference `reward_accuracy` (DPO's implicit reward margin > 0, a tie
    counting half) and the mean margin."""
    if not encoded:
        return {}
    was = stage.model.training
    stage.model.eval()
    wins, reward_wins, margins = 0.0, 0.0, []
    for start in range(0, len(encoded), batch_size):
        got = pair_logps(stage.model, encoded[start : start + batch_size], stage.tokenizer.pad_id, stage.device,
                         stage.precision)  # fmt: skip
        chosen_mean = got["chosen"] / got["chosen_len"].clamp(min=1)
        rejected_mean = got["rejected"] / got["rejected_len"].clamp(min=1)
        wins += float((chosen_mean > rejected_mean).sum())
        if reference is not None:
            ref_c = torch.tensor(reference["chosen"][start : start + batch_size])
            ref_r = torch.tensor(reference["rejected"][start : start + batch_size])
            margin = (got["chosen"].cpu() - ref_c) - (got["rejected"].cpu() - ref_r)
            reward_wins += float((margin > 0).sum() + 0.5 * (margin == 0).sum())
            margins += margin.tolist()
    stage.model.train(was)
    out = {"logp_accuracy": wins / len(encoded), "pairs": len(encoded)}
    if reference is not None:
        out["reward_accuracy"] = reward_wins / len(encoded)
        out["reward_margin"] = sum(margins) / len(margins)
    return out


def run_dpo(cfg: PostTrainConfig, force: bool = False, stage: Stage | None = None) -> dict[str, Any]:
    """Train the parent on preference pairs; returns the summary (also RUN/summary.json)."""
    with guarded(cfg, "dpo"):
        return _run_dpo(cfg, force, stage)


def _run_dpo(cfg: PostTrainConfig, force: bool, stage: Stage | None) -> dict[str, Any]:
    split = pair_split(cfg.data, cfg.run.seed)
    train_pairs, held = split.train, split.held
    stage = stage or open_stage(cfg, "dpo", force)
    encoded = [encode_pair(stage.chat, p, stage.seq_len) for p in train_pairs]
    held_encoded = [encode_pair(stage.chat, p, stage.seq_len) for p in held]
    o, d = cfg.optim, cfg.dpo
    use_reference = d.loss == "dpo"
    key = {"parent": str(stage.parent.checkpoint), "parent_step": stage.parent.step, "seq_len": stage.seq_len,
           "pairs": hash_json([train_pairs, held]), "precision": stage.precision.name}  # fmt: skip
    reference = held_reference = None
    begin(stage, split)
    if use_reference:
        both = cached_reference(stage, encoded + held_encoded, key, o.batch_size)
        n = len(encoded)
        reference = {k: torch.tensor(v[:n]) for k, v in both.items()}
        held_reference = {k: v[n:] for k, v in both.items()}
    else:  # SimPO: the parent's margins still tell how far the policy moved on held-out pairs
        held_reference = reference_logps(stage, held_encoded, o.batch_size)
    loop = Loop(stage, make_optimizer(stage), make_schedule(stage), Cursor(len(encoded), cfg.run.seed + 1),
                o.batch_size)  # fmt: skip
    loop.restore()
    start_event(stage, o.steps, loss=d.loss, train_pairs=len(encoded), heldout_pairs=len(held),
                truncated=sum(p.truncated for p in encoded), **split.stats())  # fmt: skip
    log(f"[dpo] {d.loss}: {len(encoded)} pairs, {len(held)} held out; {o.steps} steps of {o.batch_size}")

    def heldout(step: int) -> dict[str, Any]:
        figures = heldout_metrics(stage, held_encoded, held_reference, o.batch_size)
        stage.log_record({"kind": "eval", "step": step, "tokens": stage.tokens,
                          **{f"heldout_{k}": v for k, v in figures.items()}})  # fmt: skip
        return figures

    if loop.start_step == 0:
        loop.carry[BEFORE] = heldout(0)
    stage.model.train()

    def step_fn(index: list[int], lr: float, step: int) -> dict[str, Any]:
        # Each rank takes an equal share of the pairs; gradient averaging over ranks makes the mean.
        mine = stage.own(index)
        policy = pair_logps(stage.model, [encoded[i] for i in mine], stage.tokenizer.pad_id, stage.device,
                            stage.precision)  # fmt: skip
        ref = None
        if reference is not None:
            at = torch.tensor(mine)
            ref = {k: v[at].to(stage.device) for k, v in reference.items()}
        out = preference_loss(policy, ref, d)
        out["loss"].backward()
        chosen, rejected = out["chosen_reward"].detach(), out["rejected_reward"].detach()
        local = torch.stack([
            out["loss"].detach(), (chosen - rejected).mean(), (chosen > rejected).float().mean(), chosen.mean(),
            rejected.mean(), (policy["chosen"] / policy["chosen_len"].clamp(min=1)).detach().mean(),
            (policy["rejected"] / policy["rejected_len"].clamp(min=1)).detach().mean(),
        ]).double()  # fmt: skip
        means = (stage.all_sum(local) / stage.world_size).tolist()
        names = ("loss", "reward_margin", "reward_accuracy", "chosen_reward", "rejected_reward", "logp_chosen",
                 "logp_rejected")  # fmt: skip
        stats: dict[str, Any] = dict(zip(names, means, strict=True))
        stats["grad_norm"] = optimizer_step(stage, loop.optimizer, lr)
        stats["tokens"] = sum(len(encoded[i].chosen[0]) + len(encoded[i].rejected[0]) for i in index)
        if step == 0:
            loop.carry["first_loss"] = stats["loss"]
        return stats

    last = loop.run(step_fn, heldout)
    after = heldout(o.steps)
    return finish(stage, loop, o.steps, {
        "loss": d.loss, "first_loss": loop.carry.get("first_loss"), "ln2": math.log(2),
        "final_loss": last.get("loss"), "heldout_before": loop.carry[BEFORE], "heldout_after": after,
        "train_pairs": len(encoded), "heldout_pairs": len(held), **split.stats(),
    })  # fmt: skip
