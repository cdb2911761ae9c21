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

import random
from typing import Any

import torch

from smelt.model.transformer import IGNORE_INDEX
from smelt.posttrain.chat import prompt_of
from smelt.posttrain.config import PostTrainConfig
from smelt.posttrain.data import conversation_split
from smelt.posttrain.evaluate import generate_replies, mean_reward
from smelt.posttrain.rewards import resolve_reward
from smelt.posttrain.stage import (
    Stage,
    begin,
    finish,
    guarded,
    load_policy,
    log_record,
    make_optimizer,
    make_schedule,
    open_stage,
    optimizer_step,
    start_event,
    timed,
)
from smelt.progress import log, progress


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the loss, the mean per-token KL to the reference) of one batch of replies."""
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
        load_policy(stage.parent, stage.device, stage.model.cfg.max_seq_len).eval() if g.kl_coef else None
    )
    if reference is not None:
        reference.requires_grad_(False)
    optimizer, schedule = make_optimizer(stage), make_schedule(stage)
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
        log_record(stage, {"kind": "eval", "step": step, "tokens": stage.tokens, **figures})
        return figures

    before = heldout(0)
    rng = random.Random(cfg.run.seed + 1)
    order: list[int] = []
    bar = progress(total=o.steps, desc="grpo", unit="step")
    curve = []
    for step in range(o.steps):
        batch = []
        while len(batch) < o.batch_size:
            if not order:
                order = list(range(len(train)))
                rng.shuffle(order)
            batch.append(train[order.pop()])
        lr = schedule(step)

        def work(batch=batch, lr=lr, step=step) -> dict[str, Any]:
            prompts = [chat.prompt_ids(prompt_of(item)) for item in batch for _ in range(g.group_size)]
            replies = generate_replies(stage.model, prompts, chat.end_of_turn_id, g.max_new_tokens,
                                       batch_size=len(prompts), temperature=g.temperature,
                                       seed=cfg.run.seed * 1_000_003 + step)  # fmt: skip
            owners = [item for item in batch for _ in range(g.group_size)]
            rewards = torch.tensor(
                [reward(chat.decode_reply(r), item) for r, item in zip(replies, owners, strict=True)]
            )
            advantages = group_advantages(rewards, g.group_size).to(stage.device)
            inputs, targets = rows_of(prompts, replies, stage.tokenizer.pad_id, stage.device)
            mask = targets != IGNORE_INDEX
            stage.model.train()
            with stage.precision.autocast():
                logps = token_logps(stage.model, inputs, targets).float()
                ref = None
                if reference is not None:
                    with torch.no_grad():
                        ref = token_logps(reference, inputs, targets).float()
            loss, kl = grpo_loss(logps, ref, advantages, mask, g.kl_coef)
            loss.backward()
            norm = optimizer_step(stage, optimizer, lr)
            groups = rewards.view(-1, g.group_size)
            return {
                "loss": float(loss.detach()), "reward": float(rewards.mean()), "reward_std": float(rewards.std()),
                "groups_with_signal": float((groups.std(dim=1) > 0).float().mean()),
                "reply_tokens": float(mask.sum(dim=1).float().mean()), "kl": float(kl), "grad_norm": norm,
                "tokens": inputs.numel(),
            }  # fmt: skip

        # Sampling is part of an RL step's cost, so it counts in the stage's tokens/s.
        stats = timed(stage, work, tokens=0)
        stage.tokens += stats.pop("tokens")
        curve.append(stats["reward"])
        if (step + 1) % o.log_every == 0 or step == 0 or step + 1 == o.steps:
            log_record(stage, {"kind": "train", "step": step + 1, "tokens": stage.tokens, **stats, "lr": lr,
                               "tokens_per_s": stage.tokens_per_s()})  # fmt: skip
        if o.eval_every and (step + 1) % o.eval_every == 0 and step + 1 < o.steps:
            heldout(step + 1)
        bar.update(1)
        bar.set_postfix(reward=f"{stats['reward']:.2f}")
    bar.close()
    after = heldout(o.steps)
    quarter = max(1, len(curve) // 4)
    return finish(stage, o.steps, {
        "heldout_reward_before": before["heldout_reward"], "heldout_reward_after": after["heldout_reward"],
        "heldout_sampled_reward_before": before["heldout_sampled_reward"],
        "heldout_sampled_reward_after": after["heldout_sampled_reward"],
        "train_reward_first_quarter": sum(curve[:quarter]) / quarter,
        "train_reward_last_quarter": sum(curve[-quarter:]) / quarter, "reward": g.reward,
        "train_items": len(train), "heldout_items": len(held), **split.stats(),
    })  # fmt: skip
