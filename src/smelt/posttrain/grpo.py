"""RL with verifiable rewards: GRPO (Shao et al. 2024) with the KV-cache generator.

Each step takes optim.batch_size prompts, samples grpo.group_size replies to each (temperature,
top-k), scores them with the reward plug-in, and turns rewards into advantages within each group
(reward minus the group mean, over the group's standard deviation; a group whose replies all score
the same teaches nothing and gets 0). One policy-gradient update per batch of samples (so the
importance ratio is 1 and PPO's clip never binds), with a KL penalty to the frozen reference (the
parent) by the k3 estimator exp(ref - logp) - (ref - logp) - 1, per token:

    loss = mean over replies of mean over their tokens of (-A * ratio + kl_coef * KL)

Per-step reward, reply length and KL go to metrics.jsonl; the held-out mean reward, greedy and sampled as
in training (group_size replies per prompt at the training temperature), before and after.
"""

from __future__ import annotations

from typing import Any

import torch

from smelt.model.transformer import IGNORE_INDEX
from smelt.posttrain.chat import prompt_of
from smelt.posttrain.config import PostTrainConfig
from smelt.posttrain.data import conversation_split
from smelt.posttrain.evaluate import generate_replies, mean_reward
from smelt.posttrain.loop import BEFORE, Cursor, Loop
from smelt.posttrain.rewards import resolve_reward
from smelt.posttrain.stage import (
    Stage,
    begin,
    finish,
    guarded,
    load_policy,
    make_optimizer,
    make_schedule,
    open_stage,
    optimizer_step,
    start_event,
)
from smelt.progress import log


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(r - group mean) / (group std + 1e-4) for rewards laid out group by group; 0 in a uniform group."""
    grouped = rewards.view(-1, group_size)
    mean, std = grouped.mean(dim=1, keepdim=True), grouped.std(dim=1, keepdim=True, unbiased=False)
    return ((grouped - mean) / (std + 1e-4)).view(-1)


def token_logps(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) at every position [B, T] (0 where the target is ignored)."""
    _, parts = model(inputs, targets, reduction="none", loss_parts=True)
    return -parts["ce"]


def rows_of(prompts: list[list[int]], replies: list[list[int]], pad_id: int, device: torch.device):
    """Right-padded prompt + reply rows: inputs and targets (-100 except reply tokens) [B, T - 1]."""
    width = max(len(p) + len(r) for p, r in zip(prompts, replies, strict=True)) - 1
    inputs = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    targets = torch.full((len(prompts), width), IGNORE_INDEX, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, replies, strict=True)):
        ids = p + r
        inputs[i, : len(ids) - 1] = torch.tensor(ids[:-1])
        if r:
            targets[i, len(p) - 1 : len(ids) - 1] = torch.tensor(r)
    return inputs.to(device), targets.to(device)


def grpo_loss(
    logps: torch.Tensor,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    replies: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the loss, the mean per-token KL to the reference) of one batch of replies. `replies`: divide the
    sum of per-reply losses by this count of replies with tokens (a rank's share of a larger batch)
    instead of taking the mean of these."""
    ratio = torch.exp(logps - logps.detach())
    per_token = -advantages[:, None] * ratio
    kl = torch.zeros_like(logps)
    if ref_logps is not None:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + kl_coef * kl
    maskf = mask.float()
    lengths = maskf.sum(dim=1)
    has = lengths > 0
    per_reply = (per_token * maskf).sum(dim=1)[has] / lengths[has]
    mean_kl = (kl * maskf).sum() / maskf.sum().clamp(min=1)
    if replies is not None:
        return per_reply.sum() / max(replies, 1) + per_token.sum() * 0.0, mean_kl.detach()
    return per_reply.mean() if bool(has.any()) else per_token.sum() * 0.0, mean_kl.detach()


def run_grpo(cfg: PostTrainConfig, force: bool = False, stage: Stage | None = None) -> dict[str, Any]:
    """Improve the parent on a verifiable task; returns the summary (also RUN/summary.json)."""
    with guarded(cfg, "grpo"):
        return _run_grpo(cfg, force, stage)


def _run_grpo(cfg: PostTrainConfig, force: bool, stage: Stage | None) -> dict[str, Any]:
    reward = resolve_reward(cfg.grpo.reward)
    split = conversation_split(cfg.data, cfg.run.seed, "grpo")
    train, held = split.train, split.held[: cfg.eval.items] if cfg.eval.items else []
    stage = stage or open_stage(cfg, "grpo", force)
    begin(stage, split)
    o, g = cfg.optim, cfg.grpo
    reference = (
        load_policy(
            stage.parent, stage.device, stage.model.cfg.max_seq_len, stage.ctx, cfg.run.parallel
        ).eval()
        if g.kl_coef
        else None
    )
    if reference is not None:
        reference.requires_grad_(False)
    loop = Loop(stage, make_optimizer(stage), make_schedule(stage), Cursor(len(train), cfg.run.seed + 1),
                o.batch_size)  # fmt: skip
    loop.restore()
    chat = stage.chat
    start_event(stage, o.steps, train_items=len(train), heldout_items=len(held), group_size=g.group_size,
                reward=g.reward, kl_coef=g.kl_coef, **split.stats())  # fmt: skip
    log(f"[grpo] {len(train)} prompts, {o.batch_size} x {g.group_size} samples per step, {o.steps} steps")

    def heldout(step: int) -> dict[str, Any]:
        """Held-out mean reward, greedy and as sampled in training (the objective), logged as an eval."""
        figures = {
            "heldout_reward": mean_reward(stage.model, chat, held, reward, g.max_new_tokens),
            "heldout_sampled_reward": mean_reward(stage.model, chat, held, reward, g.max_new_tokens,
                                                  temperature=g.temperature, samples=g.group_size,
                                                  seed=cfg.run.seed + 7),
        }  # fmt: skip
        stage.log_record({"kind": "eval", "step": step, "tokens": stage.tokens, **figures})
        return figures

    if loop.start_step == 0:
        loop.carry[BEFORE] = heldout(0)
    curve = loop.carry.setdefault("reward_curve", [])

    def step_fn(index: list[int], lr: float, step: int) -> dict[str, Any]:
        # Every rank samples every group (same seed, same weights: the ranks stay in step through the
        # sharded forwards) and trains on its share of the replies; sampling is part of an RL step's
        # cost, so it counts in the stage's tokens/s.
        batch = [train[i] for i in index]
        prompts = [chat.prompt_ids(prompt_of(item)) for item in batch for _ in range(g.group_size)]
        replies = generate_replies(stage.model, prompts, chat.end_of_turn_id, g.max_new_tokens,
                                   batch_size=len(prompts), temperature=g.temperature,
                                   seed=cfg.run.seed * 1_000_003 + step)  # fmt: skip
        owners = [item for item in batch for _ in range(g.group_size)]
        rewards = torch.tensor(
            [reward(chat.decode_reply(r), item) for r, item in zip(replies, owners, strict=True)]
        )
        advantages = group_advantages(rewards, g.group_size)
        inputs, targets = rows_of(prompts, replies, stage.tokenizer.pad_id, stage.device)
        mask = targets != IGNORE_INDEX
        with_tokens = int((mask.sum(dim=1) > 0).sum())
        mine = torch.tensor(stage.own(list(range(len(prompts)))))
        stage.model.train()
        with stage.precision.autocast():
            logps = token_logps(stage.model, inputs[mine], targets[mine]).float()
            ref = None
            if reference is not None:
                with torch.no_grad():
                    ref = token_logps(reference, inputs[mine], targets[mine]).float()
        scale = stage.world_size if stage.world_size > 1 else None
        loss, kl = grpo_loss(logps, ref, advantages[mine].to(stage.device), mask[mine], g.kl_coef,
                             replies=with_tokens if scale else None)  # fmt: skip
        (loss * (scale or 1)).backward()
        norm = optimizer_step(stage, loop.optimizer, lr)
        groups = rewards.view(-1, g.group_size)
        kl_tokens = stage.all_sum(torch.stack([kl.double() * mask[mine].sum(), mask[mine].sum().double()]))
        stats = {
            "loss": float(stage.all_sum(loss.detach().double())), "reward": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "groups_with_signal": float((groups.std(dim=1) > 0).float().mean()),
            "reply_tokens": float(mask.sum(dim=1).float().mean()), "kl": float(kl_tokens[0] / kl_tokens[1].clamp(min=1)),
            "grad_norm": norm, "tokens": inputs.numel(),
        }  # fmt: skip
        curve.append(stats["reward"])
        return stats

    loop.run(step_fn, heldout, show="reward")
    after = heldout(o.steps)
    before = loop.carry[BEFORE]
    quarter = max(1, len(curve) // 4)
    return finish(stage, loop, o.steps, {
        "heldout_reward_before": before["heldout_reward"], "heldout_reward_after": after["heldout_reward"],
        "heldout_sampled_reward_before": before["heldout_sampled_reward"],
        "heldout_sampled_reward_after": after["heldout_sampled_reward"],
        "train_reward_first_quarter": sum(curve[:quarter]) / quarter,
        "train_reward_last_quarter": sum(curve[-quarter:]) / quarter, "reward": g.reward,
        "train_items": len(train), "heldout_items": len(held), **split.stats(),
    })  # fmt: skip
