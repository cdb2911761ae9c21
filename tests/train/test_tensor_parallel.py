"""Tensor + sequence parallelism (TP2 on 2 gloo processes, FSDP2 x TP2 on 4) makes the updates one process
makes, and its DCP checkpoints resume under other layouts: TP2 -> one process, TP2 -> FSDP2, one
process -> TP2, optimizer state included."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from smelt.checkpoint import load_model
from smelt.config import Config, config_from_dict
from smelt.errors import ConfigError
from smelt.train.parallel.mesh import MeshLayout, layout_for
from smelt.train.trainer import train

from .test_trainer import data, read_metrics  # noqa: F401 - the data fixture

WORKER = Path(__file__).with_name("dist_worker.py")
STEPS = 5
RESUME_AT = 3


def raw_config(parallel: str = "ddp", tensor_parallel: int = 1) -> dict:
    return {
        "run": {"seed": 3},
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64},
        "train": {
            "seq_len": 32, "micro_batch": 4, "batch_tokens": 256, "tokens": 256 * STEPS, "lr": 3e-3,
            "log_every": 1, "eval_every": 0, "eval_tokens": 512, "precision": "fp32", "threads": 1,
            "parallel": parallel, "tensor_parallel": tensor_parallel,
            # Adam divides each element's step by that element's gradient RMS: where a gradient sits at
            # the rounding level (TP sums its matmuls in another order), eps 1e-8 turns a 1e-12 rounding
            # difference into a visibly different step; 1e-6 keeps the weights comparable elementwise.
            "eps": 1e-6,
            "monitor_every": STEPS,  # per-parameter weight norms and update ratios at the last step
        },
        "checkpoint": {"every_steps": RESUME_AT, "keep_last": 2},
    }  # fmt: skip


def run_processes(
    nproc: int, raw: dict, tokens: Path, tokenizer: Path, out: Path, resume: Path | None = None
) -> list[dict]:
    out.mkdir(parents=True)
    config = out / "config.json"
    config.write_text(json.dumps(raw))
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SMELT_QUIET": "1", "SMELT_PEAK_FLOPS": "1e12"}
    result = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node", str(nproc), str(WORKER), str(config), str(tokens),
         str(tokenizer), str(out), *([str(resume)] if resume else [])],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return read_metrics(out)


def losses(lines: list[dict]) -> dict[int, tuple[float, float]]:
    """{step: (loss, gradient norm before clipping)}"""
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in lines if r["kind"] == "train"}


def assert_same_losses(reference: dict[int, tuple], other: dict[int, tuple]) -> None:
    assert other and set(other) <= set(reference)
    for step, (loss, norm) in other.items():
        ref_loss, ref_norm = reference[step]
        assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss), (step, ref_loss, loss)
        # The norm counts every element once, however many ranks hold it (replicated norms, partial sums).
        assert abs(norm - ref_norm) <= 1e-5 * ref_norm, (step, ref_norm, norm)


def assert_same_weights(a_dir: Path, b_dir: Path) -> None:
    a, _ = load_model(a_dir)
    b, _ = load_model(b_dir)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-5), (name, (x - y).abs().max().item())


def final_checkpoint(out: Path) -> Path:
    return out / "checkpoints" / f"step_{STEPS:07d}"


@pytest.fixture
def single(data, tmp_path, monkeypatch):  # noqa: F811 - pytest fixture injection
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")
    tokens, tokenizer = data
    out = tmp_path / "single"
    train(config_from_dict(raw_config()), tokens, tokenizer, out)
    return out, losses(read_metrics(out))


@pytest.mark.slow  # two training processes (gloo), three launches
def test_tp2_matches_one_process_and_its_checkpoints_change_layout(single, data, tmp_path):  # noqa: F811
    tokens, tokenizer = data
    single_out, reference = single
    assert len(reference) == STEPS and reference[STEPS][0] < reference[1][0]  # it trained
    tp_out = tmp_path / "tp2"
    lines = run_processes(2, raw_config(tensor_parallel=2), tokens, tokenizer, tp_out)
    start = next(r for r in lines if r.get("event") == "start")
    assert start["world_size"] == 2 and start["grad_accum"] == 2  # one data-parallel rank: 2 micro steps
    assert_same_losses(reference, losses(lines))
    assert len(losses(lines)) == STEPS
    assert_same_weights(final_checkpoint(single_out), final_checkpoint(tp_out))
    (single_layers,) = [r["layers"] for r in read_metrics(single_out) if r["kind"] == "layers"]
    (tp_layers,) = [r["layers"] for r in lines if r["kind"] == "layers"]
    assert tp_layers.keys() == single_layers.keys()
    for name, figures in single_layers.items():  # norm weights are on both ranks: counted once
        assert tp_layers[name]["weight_norm"] == pytest.approx(figures["weight_norm"], rel=1e-5), name

    middle = tp_out / "checkpoints" / f"step_{RESUME_AT:07d}"
    # TP2 -> one process: steps 4 and 5 as the uninterrupted run.
    one = tmp_path / "tp2-to-1"
    train(config_from_dict(raw_config()), tokens, tokenizer, one, resume=middle)
    assert sorted(losses(read_metrics(one))) == [4, 5]
    assert_same_losses(reference, losses(read_metrics(one)))
    # TP2 -> FSDP2 on 2 processes.
    fsdp = run_processes(2, raw_config("fsdp"), tokens, tokenizer, tmp_path / "tp2-to-fsdp", resume=middle)
    assert sorted(losses(fsdp)) == [4, 5]
    assert_same_losses(reference, losses(fsdp))
    # And back: one process -> TP2.
    back = run_processes(
        2, raw_config(tensor_parallel=2), tokens, tokenizer, tmp_path / "1-to-tp2",
        resume=single_out / "checkpoints" / f"step_{RESUME_AT:07d}",
    )  # fmt: skip
    assert sorted(losses(back)) == [4, 5]
    assert_same_losses(reference, losses(back))
    assert_same_weights(final_checkpoint(single_out), final_checkpoint(tmp_path / "1-to-tp2"))


@pytest.mark.slow  # four training processes (gloo)
@pytest.mark.parametrize("parallel", ["fsdp", "ddp"])  # FSDP2 x TP2; 2 replicas x TP2 (HSDP, shards of one)
def test_data_parallel_x_tp2_on_four_processes_matches_one(single, data, tmp_path, parallel):  # noqa: F811
    tokens, tokenizer = data
    single_out, reference = single
    out = tmp_path / f"{parallel}-tp2"
    lines = run_processes(4, raw_config(parallel, tensor_parallel=2), tokens, tokenizer, out)
    start = next(r for r in lines if r.get("event") == "start")
    assert start["world_size"] == 4 and start["grad_accum"] == 1  # two data-parallel ranks
    assert len(losses(lines)) == STEPS
    assert_same_losses(reference, losses(lines))
    assert_same_weights(final_checkpoint(single_out), final_checkpoint(out))
    # A 2-D checkpoint (data-parallel x TP shards) resumes in one process.
    one = tmp_path / f"{parallel}-tp2-to-1"
    train(
        config_from_dict(raw_config()),
        tokens,
        tokenizer,
        one,
        resume=out / "checkpoints" / f"step_{RESUME_AT:07d}",
    )
    assert sorted(losses(read_metrics(one))) == [4, 5]
    assert_same_losses(reference, losses(read_metrics(one)))


def tp_config(**train) -> Config:
    raw = raw_config(**{k: train.pop(k) for k in ("parallel", "tensor_parallel") if k in train})
    raw["eval"] = {"every_steps": train.pop("eval_every_steps", 0)}
    raw["train"].update(train)
    return config_from_dict(raw)


def test_mesh_coordinates_put_tp_innermost_and_pp_outermost():
    layout = MeshLayout(dp_shard=2, tp=2, pp=2)
    assert layout.world_size == 8 and layout.shape == (2, 1, 2, 1, 2)
    assert layout.coordinates(5) == {"pp": 1, "dp_replicate": 0, "dp_shard": 0, "cp": 0, "tp": 1}
    assert [layout.data_rank(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert MeshLayout(dp_replicate=2, cp=2).describe() == "dp_replicate 2 x dp_shard 1 x cp 2 x tp 1"


def test_layout_replicates_or_shards_the_data_parallel_ranks():
    assert layout_for(tp_config(parallel="fsdp", tensor_parallel=2), 4) == MeshLayout(dp_shard=2, tp=2)
    assert layout_for(tp_config(parallel="ddp", tensor_parallel=2), 8) == MeshLayout(dp_replicate=4, tp=2)
    assert layout_for(tp_config(parallel="fsdp"), 4) == MeshLayout(dp_shard=4)
    assert layout_for(tp_config(tensor_parallel=2, data_parallel=3), 6).world_size == 6


@pytest.mark.parametrize(
    ("train", "world", "names"),
    [
        ({"tensor_parallel": 4}, 6, ["train.tensor_parallel (4) = 4 processes per model replica, which does "
                                     "not divide the 6 processes"]),
        ({"tensor_parallel": 2}, 1, ["does not divide the 1 processes", "torchrun --nproc-per-node 2"]),
        ({"tensor_parallel": 2, "context_parallel": 2}, 6, ["train.context_parallel (2) x train.tensor_parallel "
                                                            "(2) = 4 processes"]),
        ({"context_parallel": 2, "seq_len": 30}, 2, ["train.seq_len (30) is not a multiple of 4"]),
        ({"pipeline_parallel": 2, "pipeline_schedule": "interleaved_1f1b"}, 2, ["needs 4 stages",
                                                                                "model.n_layers is 2"]),
        ({"tensor_parallel": 2, "data_parallel": 4}, 4, ["train.data_parallel (4) x train.tensor_parallel (2)",
                                                         "Set train.data_parallel = 2"]),
        ({"tensor_parallel": 8}, 8, ["model.n_heads (4) and model.n_kv_heads (2)"]),
        ({"tensor_parallel": 2, "seq_len": 33}, 2, ["train.seq_len (33)"]),
        ({"tensor_parallel": 2, "optimizer": "muon"}, 2, ["train.optimizer = 'muon'"]),
        ({"tensor_parallel": 2, "eval_every_steps": 10}, 2, ["eval.every_steps", "smelt eval RUN"]),
    ],
)  # fmt: skip
def test_layouts_that_cannot_be_built_name_the_keys(train, world, names):
    with pytest.raises(ConfigError) as err:
        layout_for(tp_config(**train), world)
    for name in names:
        assert name in str(err.value)
