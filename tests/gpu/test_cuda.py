"""What only CUDA has: the CUDA RNG state in checkpoints, pinned staging, fp16 loss scaling, flex
attention against SDPA, torch.compile, and the figures compile = "auto" decides by.

Marked `gpu` (`pytest -m gpu`, run by `make gpu-check`); every test skips on a machine without CUDA.
"""

from __future__ import annotations

import time

import pytest
import torch

from smelt.checkpoint.saver import staging_options
from smelt.checkpoint.store import restore_rng, rng_state
from smelt.config import ModelConfig
from smelt.model.transformer import Transformer, position_ids_from_doc_ids
from smelt.tokens.packing import Batch
from smelt.train.precision import Precision
from smelt.train.step import finish_grads

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

VOCAB = 512


def small_model(attention: str = "auto", seq: int = 256, layers: int = 2) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=128, n_layers=layers, n_heads=4, n_kv_heads=2, max_seq_len=seq, attention=attention
    )
    return Transformer(cfg, VOCAB).cuda()


def packed(batch: int = 2, seq: int = 256, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (batch, seq + 1), generator=gen)
    # three documents per row, of uneven lengths
    doc_ids = torch.zeros(batch, seq, dtype=torch.long)
    doc_ids[:, seq // 5 :] = 1
    doc_ids[:, seq // 2 + 7 :] = 2
    return {
        "inputs": tokens[:, :-1].cuda(),
        "targets": tokens[:, 1:].cuda(),
        "doc_ids": doc_ids.cuda(),
        "position_ids": position_ids_from_doc_ids(doc_ids).cuda(),
    }


def test_checkpoint_rng_state_restores_the_cuda_generator():
    device = torch.device("cuda", 0)
    torch.cuda.manual_seed(1234)
    torch.rand(3, device=device)
    state = rng_state(device)
    assert "torch_cuda" in state, "a CUDA run's checkpoint must carry the CUDA generator"
    expected = torch.rand(8, device=device)
    torch.cuda.manual_seed(999)  # move the generator elsewhere
    restore_rng(state, device)
    assert torch.equal(torch.rand(8, device=device), expected)


def test_batches_stage_in_pinned_memory_and_copy_without_blocking():
    seq = 64
    doc_ids = torch.zeros(2, seq, dtype=torch.long)
    batch = Batch(
        inputs=torch.randint(0, VOCAB, (2, seq)),
        targets=torch.randint(0, VOCAB, (2, seq)),
        doc_ids=doc_ids,
        position_ids=position_ids_from_doc_ids(doc_ids),
        cu_seqlens=torch.tensor([0, seq, 2 * seq], dtype=torch.int32),
    )
    pinned = batch.pin_memory()
    assert all(getattr(pinned, n).is_pinned() for n in ("inputs", "targets", "doc_ids", "position_ids"))
    moved = pinned.to(torch.device("cuda", 0), non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(moved.inputs.cpu(), batch.inputs)
    options = staging_options("cuda")  # the async checkpoint's copies to the host
    assert options.use_pinned_memory and options.use_non_blocking_copy


def test_fp16_loss_scaling_skips_an_overflowing_step_and_trains_otherwise():
    model = small_model()
    precision = Precision("fp16", "cuda")
    scaler = precision.grad_scaler()
    assert scaler is not None, "fp16 needs a GradScaler"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = packed()
    losses, scales = [], []
    for step in range(6):
        with precision.autocast():
            _, loss = model(batch["inputs"], batch["targets"], doc_ids=batch["doc_ids"],
                            position_ids=batch["position_ids"])  # fmt: skip
        scaler.scale(loss).backward()
        if step == 2:  # an overflow: the step must be skipped and the scale halved
            next(model.parameters()).grad[0, 0] = float("inf")
        before = [p.detach().clone() for p in model.parameters()]
        norm = finish_grads(model, optimizer, scaler, 1.0, sharded=False)
        scale_before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if step == 2:
            assert not torch.isfinite(norm)
            assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
            assert scaler.get_scale() == scale_before / 2
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flex_attention_matches_sdpa_with_document_masks(dtype):
    batch = packed()
    outputs = {}
    for attention in ("flex", "sdpa"):
        model = small_model(attention)
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            logits, loss = model(batch["inputs"], batch["targets"], doc_ids=batch["doc_ids"],
                                 position_ids=batch["position_ids"])  # fmt: skip
        loss.backward()
        grads = torch.cat([p.grad.flatten().float() for p in model.parameters()])
        outputs[attention] = (logits.float(), loss.float(), grads)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    flex, sdpa = outputs["flex"], outputs["sdpa"]
    assert torch.allclose(flex[1], sdpa[1], rtol=tol, atol=tol)
    assert (flex[0] - sdpa[0]).abs().max().item() < (5e-4 if dtype == torch.float32 else 0.1)
    rel = (flex[2] - sdpa[2]).norm() / sdpa[2].norm()
    assert rel.item() < (1e-3 if dtype == torch.float32 else 5e-2)


def test_flex_attention_keeps_documents_apart():
    """A token's output does not change when another document in its row changes."""
    model = small_model("flex").eval()
    batch = packed()
    changed = batch["inputs"].clone()
    changed[:, : 256 // 5] = (changed[:, : 256 // 5] + 1) % VOCAB  # rewrite the first document only
    with torch.no_grad():
        a, _ = model(batch["inputs"], doc_ids=batch["doc_ids"], position_ids=batch["position_ids"])
        b, _ = model(changed, doc_ids=batch["doc_ids"], position_ids=batch["position_ids"])
    later = batch["doc_ids"] > 0
    assert torch.allclose(a[later], b[later], atol=1e-5)
    assert not torch.allclose(a[~later], b[~later], atol=1e-3)


def test_compiled_model_follows_the_eager_one_and_its_cost_is_recorded(record_property):
    """torch.compile on CUDA: the same losses over a few bf16 training steps (to rounding), and the
    figures train/speed.py's compile = "auto" decides by: the cold compile's seconds and the speedup
    (recorded as properties in the junit report, which bench/gpu_check.py reads; not asserted)."""
    from smelt.train.speed import compile_speedup

    batches = [packed(4, 256, seed) for seed in range(8)]
    results = {}
    for compiled in (False, True):
        model = small_model("flex", layers=4)
        forward = torch.compile(model) if compiled else model
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        losses, times = [], []
        for batch in batches:
            torch.cuda.synchronize()
            started = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                _, loss = forward(batch["inputs"], batch["targets"], doc_ids=batch["doc_ids"],
                                  position_ids=batch["position_ids"])  # fmt: skip
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
            losses.append(loss.item())
        results[compiled] = (losses, times)
    eager, compiled = results[False], results[True]
    for a, b in zip(eager[0], compiled[0], strict=True):
        assert abs(a - b) / a < 2e-2
    steady_eager = sorted(eager[1][2:])[len(eager[1][2:]) // 2]
    steady_compiled = sorted(compiled[1][2:])[len(compiled[1][2:]) // 2]
    record_property("compile_first_step_s", round(compiled[1][0], 2))
    record_property("compile_speedup_small", round(steady_eager / steady_compiled, 3))
    record_property("compile_speedup_table_bf16", compile_speedup("cuda", "bf16"))
