"""Context parallelism (CP2 on 2 gloo processes, CP2 x FSDP2 on 4): the logits, losses and gradients of the
unsplit model with document masks, the updates one process makes, and checkpoints that resume in one process."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from smelt.config import config_from_dict
from smelt.errors import ConfigError
from smelt.model.attention import dense_mask
from smelt.train.parallel.context import chunk_positions, context_mask, gathered_positions
from smelt.train.parallel.mesh import MeshLayout, check_layout_keys, layout_for
from smelt.train.trainer import train

from .test_tensor_parallel import (  # noqa: F401 - the data and single fixtures
    RESUME_AT,
    STEPS,
    assert_same_losses,
    assert_same_weights,
    data,
    final_checkpoint,
    losses,
    raw_config,
    run_processes,
    single,
)
from .test_trainer import read_metrics


def cp_config(context_parallel: int = 2, parallel: str = "ddp", **train) -> dict:
    raw = raw_config(parallel)
    raw["train"].update(context_parallel=context_parallel, **train)
    return raw


def test_each_rank_keeps_one_early_and_one_late_chunk():
    assert chunk_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert chunk_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert gathered_positions(16, 4).sort().values.tolist() == list(range(16))
    # Causal work per rank: the number of (query, key) pairs at or before the query is the same.
    work = [sum(int(p) + 1 for p in chunk_positions(64, 4, r)) for r in range(4)]
    assert len(set(work)) == 1


def test_context_mask_is_the_dense_document_mask_at_global_positions():
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2], [0, 1, 1, 1, 1, 1, 2, 2]])
    full = dense_mask(doc_ids, doc_ids, 0, 8, doc_ids.device)
    q, k = chunk_positions(8, 2, 1), gathered_positions(8, 2)
    assert torch.equal(context_mask(doc_ids, q, k), full[:, :, q][:, :, :, k])
    assert torch.equal(context_mask(None, q, k), dense_mask(None, None, 0, 8, q.device)[:, :, q][:, :, :, k])


# Each rank: the unsplit model's logits, losses and gradients against ContextParallel's over 2 ranks
# (no data parallelism: the gradients are averaged over the cp ranks as DDP or FSDP2 would).
LOGITS_WORKER = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.distributed as dist
    from smelt.config import ModelConfig
    from smelt.model.transformer import Transformer, position_ids_from_doc_ids
    from smelt.train.parallel.context import ContextParallel

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    model = Transformer(cfg, 64)
    idx, targets = torch.randint(0, 64, (2, 32)), torch.randint(0, 64, (2, 32))
    targets[1, 20:] = -100
    # Chunks of 8 tokens: documents cross the chunk boundaries at 8, 16 and 24 and end inside chunks.
    lengths = [[5, 9, 3, 15], [12, 1, 19]]
    doc_ids = torch.tensor([[d for d, n in enumerate(row) for _ in range(n)] for row in lengths])
    docs = {"doc_ids": doc_ids, "position_ids": position_ids_from_doc_ids(doc_ids)}

    logits, loss = model(idx, targets, **docs)
    loss.backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters()}
    ref_logits, _ = model(idx, **docs)
    ref_tokens = model(idx, targets, reduction="none", **docs)[1]
    model.zero_grad()

    cp = ContextParallel(model, dist.group.WORLD, grad_scale=2.0)
    cp_logits, _ = cp(idx, **docs)
    _, cp_tokens = cp(idx, targets, reduction="none", **docs)
    _, cp_loss = cp(idx, targets, **docs)
    cp_loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= 2
    _, causal = cp(idx, targets)  # no documents: plain causal attention over the whole row
    out = {
        "logits": (cp_logits - ref_logits).abs().max().item(),
        "logits_scale": ref_logits.abs().max().item(),
        "doc_effect": (ref_logits - model(idx)[0]).abs().max().item(),
        "tokens": (cp_tokens - ref_tokens).abs().max().item(),
        "loss": abs(cp_loss.item() - loss.item()) / loss.item(),
        "causal": abs(causal.item() - model(idx, targets)[1].item()),
        "grads": max(((p.grad - reference[n]).abs().max() / reference[n].abs().max()).item()
                     for n, p in model.named_parameters()),
    }
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f)
    dist.barrier()  # neither rank tears gloo down while the other may still be using it
    dist.destroy_process_group()
    """
)


@pytest.mark.slow  # two gloo processes
def test_cp2_gives_the_unsplit_logits_losses_and_gradients_with_document_masks(tmp_path):
    worker, result = tmp_path / "worker.py", tmp_path / "result.json"
    worker.write_text(LOGITS_WORKER)
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node", "2", str(worker), str(result)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    diff = json.loads(result.read_text())
    assert diff["doc_effect"] > 1e-3  # the document mask changes the logits: the comparison means something
    assert diff["logits"] <= 1e-5 * diff["logits_scale"]
    assert diff["tokens"] <= 1e-5 and diff["loss"] <= 1e-6 and diff["causal"] <= 1e-5
    assert diff["grads"] <= 1e-5


@pytest.mark.slow  # two training processes (gloo), then one
def test_cp2_matches_one_process_and_resumes_in_one(single, data, tmp_path):  # noqa: F811
    tokens, tokenizer = data
    single_out, reference = single
    out = tmp_path / "cp2"
    lines = run_processes(2, cp_config(), tokens, tokenizer, out)
    start = next(r for r in lines if r.get("event") == "start")
    assert start["world_size"] == 2 and start["grad_accum"] == 2  # one data-parallel rank: 2 micro steps
    assert len(losses(lines)) == STEPS
    assert_same_losses(reference, losses(lines))
    assert_same_weights(final_checkpoint(single_out), final_checkpoint(out))
    (val,) = [r["val_loss"] for r in lines if r["kind"] == "eval"]  # validation runs under CP too
    (single_val,) = [r["val_loss"] for r in read_metrics(single_out) if r["kind"] == "eval"]
    assert val == pytest.approx(single_val, rel=1e-5)
    # CP2 -> one process: steps 4 and 5 as the uninterrupted run.
    one = tmp_path / "cp2-to-1"
    train(
        config_from_dict(raw_config()),
        tokens,
        tokenizer,
        one,
        resume=out / "checkpoints" / f"step_{RESUME_AT:07d}",
    )
    assert sorted(losses(read_metrics(one))) == [4, 5]
    assert_same_losses(reference, losses(read_metrics(one)))


@pytest.mark.slow  # four training processes (gloo)
def test_cp2_x_fsdp2_on_four_processes_matches_one(single, data, tmp_path):  # noqa: F811
    tokens, tokenizer = data
    single_out, reference = single
    out = tmp_path / "cp2-fsdp2"
    raw = cp_config(parallel="fsdp")
    raw["model"]["activation_checkpointing"] = True  # the recompute gathers keys and values again
    lines = run_processes(4, raw, tokens, tokenizer, out)
    start = next(r for r in lines if r.get("event") == "start")
    assert start["world_size"] == 4 and start["grad_accum"] == 1  # two data-parallel ranks
    assert len(losses(lines)) == STEPS
    assert_same_losses(reference, losses(lines))
    assert_same_weights(final_checkpoint(single_out), final_checkpoint(out))
    one = tmp_path / "cp2-fsdp2-to-1"
    train(
        config_from_dict(raw_config()),
        tokens,
        tokenizer,
        one,
        resume=out / "checkpoints" / f"step_{RESUME_AT:07d}",
    )
    assert sorted(losses(read_metrics(one))) == [4, 5]
    assert_same_losses(reference, losses(read_metrics(one)))


def test_cp_layouts_share_rows_within_a_cp_group():
    layout = layout_for(config_from_dict(cp_config(parallel="fsdp")), 4)
    assert layout == MeshLayout(dp_shard=2, cp=2)
    assert [layout.data_rank(r) for r in range(4)] == [0, 0, 1, 1]
    # `smelt train --check` names the launch the keys ask for.
    launch = check_layout_keys(config_from_dict(cp_config()))
    assert (
        launch
        == "dp_replicate 1 x dp_shard 1 x cp 2 x tp 1 = 2 processes (train.data_parallel = 0: any multiple of 2)"
    )


@pytest.mark.parametrize(
    ("model", "train", "world", "names"),
    [
        ({}, {"seq_len": 34}, 2, ["train.seq_len (34) is not a multiple of 4"]),
        ({}, {"tensor_parallel": 2}, 4, ["train.tensor_parallel (2) does not compose with it"]),
        ({"moe_experts": 4}, {}, 2, ["model.moe_experts"]),
        ({}, {"compile": True}, 2, ["train.compile"]),
        ({"attention": "flex"}, {}, 2, ["model.attention = 'flex'", "model.attention = 'auto'"]),
        ({}, {}, 3, ["train.context_parallel (2) = 2 processes per model replica, which does not divide the 3"]),
    ],
)  # fmt: skip
def test_cp_layouts_that_cannot_be_built_name_the_keys(model, train, world, names):
    raw = cp_config(**train)
    raw["model"].update(model)
    with pytest.raises(ConfigError) as err:
        layout_for(config_from_dict(raw), world)
    assert "train.context_parallel = 2 cannot be used" in str(err.value) or world == 3
    for name in names:
        assert name in str(err.value)
