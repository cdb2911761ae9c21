"""One small case per effect that bench/effects.py shows, checking the sign of the effect (not its size)
through smelt's CLI: SFT lowers the held-out loss of addition problems it never trained on, DPO after SFT
prefers the correct sum of held-out problems, GRPO raises the reward of held-out prompts, a WSD decay
beats the stable run continued at equal tokens, and the average of a constant-LR run's last checkpoints
beats its last checkpoint; and an anneal of a Muon run takes the parent's optimizer state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smelt.cli import main

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture()
def base_run(tmp_path):
    from tests.posttrain.conftest import write_base_run, write_tokenizer

    return write_base_run(tmp_path / "base", write_tokenizer(tmp_path / "tok"))


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def posttrain(config: str, parent: Path, out: Path, *overrides: str) -> dict:
    argv = ["posttrain", "run", str(REPO / "configs" / "posttrain" / config),
            *sets(f"run.init_from='{parent}'", f"run.out='{out}'", *overrides)]  # fmt: skip
    assert main(argv) == 0
    return json.loads((out / "summary.json").read_text())


def test_sft_lowers_the_loss_of_heldout_addition_problems(base_run, tmp_path):
    summary = posttrain("sft_addition.toml", base_run, tmp_path / "sft", "optim.lr=3e-3", "optim.steps=40",
                        "optim.batch_size=8", "optim.seq_len=64", "optim.schedule='cosine'",
                        "data.addition_digits=1", "data.addition_items=2000", "data.heldout=25")  # fmt: skip
    assert summary["heldout_items"] == 25 and summary["heldout_contaminated"] == 0
    assert summary["val_loss"] < summary["val_loss_before"] - 1.0


def addition_pairs(heldout: bool) -> list[dict]:
    """Each 1-digit problem of one side of smelt's held-out partition: the sum against the operands written
    side by side ("3+4": "7" over "34"), a wrong answer a model this small learns to avoid from a few
    steps (bench/effects_data.py's wrong sums need the arithmetic of a longer SFT)."""
    from smelt.posttrain.chat import addition_heldout

    return [{"prompt": [{"role": "user", "content": f"{a}+{b}"}],
             "chosen": [{"role": "assistant", "content": str(a + b)}],
             "rejected": [{"role": "assistant", "content": f"{a}{b}"}]}
            for a in range(10) for b in range(10) if addition_heldout(a, b) == heldout]  # fmt: skip


def test_dpo_after_sft_prefers_the_correct_sum_of_heldout_problems(base_run, tmp_path):
    from smelt.posttrain.chat import write_jsonl

    sft = tmp_path / "sft"
    posttrain("sft_addition.toml", base_run, sft, "optim.lr=3e-3", "optim.steps=40", "optim.batch_size=8",
              "optim.seq_len=64", "optim.schedule='cosine'", "data.addition_digits=1", "data.addition_items=2000",
              "data.heldout=25")  # fmt: skip
    write_jsonl(tmp_path / "train.jsonl", addition_pairs(False))
    write_jsonl(tmp_path / "held.jsonl", addition_pairs(True))
    summary = posttrain("dpo_hh.toml", sft, tmp_path / "dpo", "data.format='preferences'",
                        f"data.path='{tmp_path / 'train.jsonl'}'", f"data.heldout_path='{tmp_path / 'held.jsonl'}'",
                        "data.heldout=0", "data.limit=0", "optim.lr=1e-4", "optim.steps=30", "optim.batch_size=16",
                        "optim.seq_len=32", "optim.warmup_steps=3", "dpo.beta=0.1")  # fmt: skip
    assert summary["heldout_contaminated"] == 0 and summary["heldout_pairs"] == 25
    assert summary["heldout_before"]["reward_accuracy"] == 0.5
    assert summary["heldout_after"]["reward_accuracy"] > 0.6


def test_grpo_raises_the_reward_of_heldout_prompts(base_run, tmp_path):
    # A random model and the format_number reward (0.1 for any number, 1 for the sum): GRPO first teaches
    # to answer with a number at all, which a model this small learns in a few steps and which carries
    # over to prompts it never sampled; bench/effects.py shows the exact-match effect from an SFT.
    summary = posttrain("grpo_addition.toml", base_run, tmp_path / "grpo", "optim.lr=3e-3", "optim.steps=30",
                        "optim.batch_size=8", "optim.warmup_steps=3", "grpo.group_size=8", "grpo.max_new_tokens=4",
                        "grpo.kl_coef=0.0", "grpo.reward='format_number'", "data.addition_digits=1",
                        "data.heldout=25", "eval.items=25")  # fmt: skip
    assert summary["heldout_items"] == 25 and summary["heldout_contaminated"] == 0
    assert summary["heldout_sampled_reward_after"] > summary["heldout_sampled_reward_before"] + 0.02


@pytest.fixture(scope="module")
def stable(tmp_path_factory):
    """A tiny stable run (48 steps of 256 tokens at a constant LR of 1e-2 after warmup, a checkpoint
    every 4 steps) and a WSD anneal forked from its step 32 to the same tokens: bench/effects.py's
    design, smaller."""
    from smelt.cli import QUICKSTART_CONFIG

    from .test_pipeline_e2e import TINY

    root = tmp_path_factory.mktemp("effects")
    args = [str(QUICKSTART_CONFIG), *sets(*TINY, "train.micro_batch=2", "train.batch_tokens=256",
            "train.tokens=12288", "train.warmup_tokens=1024", "train.lr=1e-2", "train.schedule='constant'",
            "train.optimizer='adamw'", "train.threads=1", "train.eval_every=0", "checkpoint.every_steps=4", "checkpoint.keep_last=10", "eval.tasks=[]",
            "eval.gallery_tokens=0", "eval.max_bytes=30000", f"run.dir='{root}'", "run.name='stable'")]  # fmt: skip
    assert main(["run", *args]) == 0
    run = root / "stable"
    assert main(["anneal", *args, "--from", f"{run}:32", "--decay-tokens", "4096", "--variant", "same"]) == 0
    return root, args


def heldout_loss(run: Path, step: int | None = None) -> float:
    files = sorted((run / "eval").glob(f"*step_{step:07d}.json" if step else "*step_*.json"))
    path = files[-1]  # a weights-only checkpoint (an average) is scored as weights_only-step_N.json
    return json.loads(path.read_text())["heldout"]["overall"]["loss"]


def test_a_wsd_decay_beats_the_stable_run_continued_at_equal_tokens(stable):
    root, _ = stable
    assert heldout_loss(root / "stable-anneal-same") < heldout_loss(root / "stable", 48)


def test_the_average_of_the_last_checkpoints_beats_the_last(stable):
    root, args = stable
    run, avg = root / "stable", root / "stable-avg3"
    for name in ("documents", "tokenizer", "tokens"):
        avg.mkdir(exist_ok=True)
        (avg / name).symlink_to((run / name).resolve(), target_is_directory=True)
    target = avg / "train" / "checkpoints" / "step_0000048"
    assert main(["checkpoint", "average", str(run), "--last", "3", "--out", str(target)]) == 0
    assert main(["eval", *args[:1], "--checkpoint", "48", "--tasks", "", *args[1:-2],
                 *sets(f"run.dir='{root}'", "run.name='stable-avg3'")]) == 0  # fmt: skip
    assert heldout_loss(avg, 48) < heldout_loss(run, 48)


def test_a_fork_of_a_muon_run_takes_its_optimizer_state(tmp_path):
    # With tied embeddings every decayed matrix is Muon's, which left an empty AdamW group whose state
    # torch's distributed checkpoint could not load: an anneal of a Muon run failed with an IndexError.
    from smelt.cli import QUICKSTART_CONFIG

    from .test_pipeline_e2e import TINY

    args = [str(QUICKSTART_CONFIG), *sets(*TINY, "train.micro_batch=2", "train.batch_tokens=256",
            "train.tokens=4096", "train.warmup_tokens=512", "train.optimizer='muon'", "train.schedule='constant'",
            "train.threads=1", "train.eval_every=0", "checkpoint.every_steps=8", "eval.tasks=[]",
            "eval.gallery_tokens=0", "eval.max_bytes=10000", f"run.dir='{tmp_path}'", "run.name='m'")]  # fmt: skip
    assert main(["run", *args]) == 0
    fork = ["--from", f"{tmp_path / 'm'}:8", "--decay-tokens", "1024", "--variant", "same"]
    assert main(["anneal", *args, *fork]) == 0
