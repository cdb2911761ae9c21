"""Training speed: the FLOPs conventions MFU is reported in, the AdamW kernel, compile caching and auto."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from helpers import build_model, tiny_model_config
from smelt.config import config_from_dict
from smelt.model.flops import count_params, flops_conventions, flops_per_token, mfu, model_flops_per_token
from smelt.run.summary import mfu_text
from smelt.train.optim import build_optimizer
from smelt.train.speed import (
    ASSUMED_EAGER_MFU,
    DEFAULT_SPEEDUP,
    auto_compile_excluded,
    compile_cache_dir,
    compile_pays_off,
    compile_speedup,
    enable_compile_cache,
    estimated_step_s,
    should_compile,
    training_forward,
)

VOCAB = 384


def test_the_head_counts_in_palm_flops_whether_tied_or_not():
    """The tied head is a V x d matmul like the untied one; the embedding lookup is a gather (no FLOPs)."""
    tied, untied = tiny_model_config(tie_embeddings=True), tiny_model_config(tie_embeddings=False)
    assert flops_per_token(tied, VOCAB, 32) == flops_per_token(untied, VOCAB, 32)
    n = count_params(tied, VOCAB)["non_embedding"] + VOCAB * 64
    assert flops_per_token(tied, VOCAB, 32) == 6 * n + 12 * 2 * 64 * 32


def test_model_flops_count_the_matmuls_and_causal_attention_by_hand():
    cfg = tiny_model_config(d_ff=128)  # d 64, 2 layers, 4 heads x 16, 2 kv heads
    projections = 64 * 64 + 2 * 64 * 32 + 64 * 64
    mlp = 3 * 64 * 128
    forward = 2 * (2 * (projections + mlp) + VOCAB * 64) + 2 * 2 * (2 * 64 * (32 + 1) / 2)
    assert model_flops_per_token(cfg, VOCAB, 32) == pytest.approx(3 * forward, rel=1e-12)
    palm, model = flops_conventions(cfg, VOCAB, 32)
    # PaLM's counts the norm weights and the full s x s score matrix; the matmul figure neither.
    norms = 2 * (2 * 64) + 64
    assert palm - model == 6 * norms + 12 * 2 * 64 * 32 - 6 * 2 * 64 * 33


def test_moe_model_flops_count_the_router_and_the_active_experts_only():
    dense = tiny_model_config(d_ff=128)
    sparse = tiny_model_config(d_ff=128, moe_experts=4, moe_top_k=1)
    router = 2 * 64 * 4  # both layers
    assert model_flops_per_token(sparse, VOCAB, 32) - model_flops_per_token(dense, VOCAB, 32) == 6 * router


def test_mfu_and_its_terminal_line():
    assert mfu(1e6, 100.0, 1e9) == pytest.approx(0.1)
    assert mfu(1e6, 100.0, None) is None
    assert mfu(1e6, 100.0, 1e7) is None  # 1000% of a peak measured under load is no figure at all
    assert mfu_text({"train_mfu": 0.3125, "train_mfu_model": 0.28}) == (
        "31.2% (6N + attention), 28.0% (matmul model FLOPs)"
    )
    assert mfu_text({"train_mfu": None, "train_mfu_model": None}) == "-"


def test_compile_pays_off_when_the_saved_step_time_exceeds_the_compile():
    # 1000 steps of 1 s at 1.25x save 200 s.
    assert compile_pays_off(1000, 1.0, compile_s=150.0, speedup=1.25)
    assert not compile_pays_off(1000, 1.0, compile_s=250.0, speedup=1.25)
    assert not compile_pays_off(10**9, 1.0, compile_s=1.0, speedup=1.0)  # no faster: never
    assert not compile_pays_off(0, 1.0, compile_s=0.0, speedup=2.0)


def test_auto_compile_follows_the_run_length_and_says_why():
    step_s = estimated_step_s(1e6, 4096, 1e12)  # 4.1e9 FLOPs at 30% of 1 TFLOP/s
    assert step_s == pytest.approx(4096 * 1e6 / (1e12 * ASSUMED_EAGER_MFU))
    short, why_short = should_compile("auto", "cpu", 10, step_s)
    long, why_long = should_compile("auto", "cpu", 10**6, step_s)
    assert (short, long) == (False, True)
    assert why_short.startswith(f"train.compile = auto: off, 10 steps of ~{step_s:.3g} s")
    assert why_long.startswith("train.compile = auto: on")
    assert should_compile("auto", "cpu", 10**6, None) == (
        False,
        "train.compile = auto: off, the device's peak FLOP/s (and so the step time) is unknown",
    )
    assert should_compile(True, "cpu", 1, step_s) == (True, "train.compile = true")
    assert should_compile(False, "cuda", 10**9, step_s) == (False, "train.compile = false")


def test_auto_is_the_default_and_leaves_untested_runs_eager():
    """Auto compiles a dense single-process run; MoE layers and several processes stay eager (with the
    reason), however long the run, while `true` is still the user's to set."""
    dense = config_from_dict({})
    assert dense.train.compile == "auto"
    assert auto_compile_excluded(dense, 1) is None
    assert "2 processes" in auto_compile_excluded(dense, 2)
    moe = config_from_dict({"model": {"preset": "tiny-moe"}})
    why = auto_compile_excluded(moe, 1)
    assert "MoE layers" in why
    compiled, note = should_compile("auto", "cpu", 10**9, 1.0, why)
    assert (
        not compiled and note == f"train.compile = auto: off, {why} (set train.compile = true to compile it)"
    )
    assert should_compile(True, "cpu", 1, 1.0, why) == (True, "train.compile = true")


def test_auto_weighs_the_speedup_of_the_runs_precision():
    """On CPU compiling buys bf16 steps far more than fp32 ones, so the same run compiles in bf16 only."""
    assert compile_speedup("cpu", "bf16") > compile_speedup("cpu", "fp32") > 1.0
    assert compile_speedup("cuda", "bf16") == compile_speedup("mps", "fp32") == DEFAULT_SPEEDUP
    bf16, _ = should_compile("auto", "cpu", 2000, 0.5, precision="bf16")
    fp32, note = should_compile("auto", "cpu", 2000, 0.5, precision="fp32")
    assert (bf16, fp32) == (True, False)
    assert f"at {compile_speedup('cpu', 'fp32')}x" in note


def test_the_compile_cache_lives_under_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache_dir() == tmp_path / "xdg" / "smelt" / "inductor"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache_dir() == tmp_path / "home" / ".cache" / "smelt" / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compile_cache_dir() == tmp_path / "mine"  # the user's own setting wins


def test_enabling_the_compile_cache_points_inductor_at_it(monkeypatch, tmp_path):
    import torch._inductor.config as inductor_config

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(inductor_config, "fx_graph_cache", False)
    path = enable_compile_cache()
    assert path == tmp_path / "smelt" / "inductor" and path.is_dir()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(path)
    assert inductor_config.fx_graph_cache is True


def test_the_training_forward_sets_the_loss_chunks_and_the_compile_decision():
    model = build_model(tiny_model_config())
    cfg = config_from_dict({"train": {"loss_chunk_tokens": 512, "compile": "auto"}})
    t = SimpleNamespace(
        cfg=cfg, tc=cfg.train, model=model, wrapped=model, flops_tok=1e6, peak_total=1e12, world_size=1,
        precision=SimpleNamespace(name="bf16"),
        plan=SimpleNamespace(batch_tokens=4096, steps=10), device=torch.device("cpu"),
    )  # fmt: skip
    forward = training_forward(t)
    assert forward.call is model  # 10 short steps: compiling would not pay
    assert model.loss_chunk_rows == 512
    assert forward.compile_note.startswith("train.compile = auto: off")


@pytest.mark.parametrize(("device", "kernel"), [("cpu", "fused"), ("cuda", "fused"), ("mps", "foreach")])
def test_adamw_runs_the_fused_kernel_on_cpu_and_cuda(device, kernel):
    """Each device's choice is checked on CPU tensors (the fused and foreach kernels both run there)."""
    model = build_model(tiny_model_config())
    optimizer = build_optimizer(model, config_from_dict({}).train, torch.device(device))
    group = optimizer.param_groups[0]
    assert bool(group["foreach"]) == (kernel == "foreach") and bool(group["fused"]) == (kernel == "fused")
    model(torch.randint(0, VOCAB, (1, 8)), torch.randint(0, VOCAB, (1, 8)))[1].backward()
    optimizer.step()  # the chosen kernel runs


def _bench_gpu(monkeypatch):
    import importlib.util
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "bench"
    monkeypatch.syspath_prepend(str(bench))  # for its `common` import
    spec = importlib.util.spec_from_file_location("bench_gpu", bench / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_bench_without_cuda_exits_2_and_says_why(monkeypatch, capsys):
    gpu = _bench_gpu(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main(["--presets", "tiny-1m", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "bench/gpu.py measures smelt's CUDA training path" in err and "no CUDA device" in err


def test_the_gpu_bench_packs_documents_with_restarting_positions(monkeypatch):
    gpu = _bench_gpu(monkeypatch)
    rows = gpu.packed_rows(2, 256, 32, VOCAB, torch.device("cpu"), seed=0)
    docs, pos = rows["doc_ids"], rows["position_ids"]
    assert rows["inputs"].shape == rows["targets"].shape == docs.shape == (2, 256)
    assert bool((docs.diff(dim=1) >= 0).all()) and int(docs[:, -1].min()) >= 2  # several documents a row
    starts = torch.cat([torch.ones(2, 1, dtype=torch.bool), docs.diff(dim=1) > 0], dim=1)
    assert bool((pos[starts] == 0).all()) and bool((pos[~starts] > 0).all())


@pytest.mark.parametrize(("device_type", "pinned"), [("cuda", True), ("cpu", False)])
def test_async_saves_stage_cuda_tensors_into_pinned_host_buffers(device_type, pinned):
    from smelt.checkpoint.saver import staging_options

    options = staging_options(device_type)
    assert options.use_pinned_memory is pinned and options.use_non_blocking_copy is pinned
    assert options.use_async_staging and not options.use_shared_memory


def _tiny_run(tmp_path, name: str, seed: int, steps: int, **train: object) -> tuple[list[float], dict]:
    """Train a 2-layer model `steps` steps of 128 tokens through the trainer on the helpers' token
    data; (the logged train losses, the start record)."""
    import json

    from helpers import write_token_data
    from smelt.train.trainer import train as run_training

    data = tmp_path / "data"
    if data.is_dir():  # the second run of a test trains on the first one's data
        tokens, tokenizer = data / "tokens", data / "tokenizer"
    else:
        data.mkdir()
        tokens, tokenizer = write_token_data(data)
    raw = {
        "run": {"seed": seed},
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64},
        "train": {
            "seq_len": 32, "micro_batch": 4, "tokens": 128 * steps, "lr": 3e-3, "log_every": 1,
            "eval_every": 0, "eval_tokens": 256, **train,
        },
        "checkpoint": {"every_steps": 0},
    }  # fmt: skip
    out = tmp_path / name
    run_training(config_from_dict(raw), tokens, tokenizer, out)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    start = next(r for r in records if r.get("event") == "start")
    return [r["loss"] for r in records if r["kind"] == "train"], start


@pytest.mark.slow
def test_a_run_with_the_chunked_loss_logs_the_losses_of_the_whole_batch_run(tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")
    losses = {}
    for chunk in (0, 48):  # 48 rows: 128 rows per micro batch in 3 chunks, the last one short
        losses[chunk], start = _tiny_run(
            tmp_path, f"run{chunk}", 3, 6, precision="fp32", loss_chunk_tokens=chunk
        )
        assert start["compile"].startswith("train.compile = auto: off, 6 steps")  # the default, short run
    assert len(losses[0]) == 6
    assert losses[48] == pytest.approx(losses[0], abs=1e-5)
    assert losses[48] != losses[0]  # the chunked path ran (its sums round differently)


@pytest.mark.slow
def test_a_compiled_bf16_run_follows_the_eager_one(tmp_path, monkeypatch):
    """What auto turns on for long runs, end to end through the trainer: a compiled bf16 run with
    document masking logs the eager run's losses up to the rounding of inductor's fused kernels."""
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    losses, notes = {}, {}
    for compiled in (False, True):
        losses[compiled], start = _tiny_run(
            tmp_path, f"run-{compiled}", 5, 5, precision="bf16", compile=compiled
        )
        notes[compiled] = start["compile"]
    assert notes == {False: "train.compile = false", True: "train.compile = true"}
    assert len(losses[True]) == 5
    assert losses[True] == pytest.approx(losses[False], abs=2e-2)
    assert any((tmp_path / "inductor").rglob("*"))  # the compiled artifacts went to the cache
