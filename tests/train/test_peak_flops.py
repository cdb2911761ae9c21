"""The peak FLOP/s that MFU divides by is one figure per machine: on CPU measured once while the machine is
quiet and cached with its date (keyed by CPU model, precision and threads), or $SMELT_PEAK_FLOPS, and the
run's start event and summary say which."""

from __future__ import annotations

import json

import pytest
import torch

from smelt.errors import ConfigError
from smelt.train import precision as precision_module
from smelt.train.precision import Precision, cpu_model, peak_source, resolve_peak

from .test_trainer import data, read_metrics, tiny_config  # noqa: F401 - the data fixture

CPU = torch.device("cpu")
FP32 = Precision("fp32", "cpu")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache directory, no $SMELT_PEAK_FLOPS, and nothing resolved yet in this process."""
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SMELT_PEAK_FLOPS", raising=False)
    monkeypatch.setattr(precision_module, "_resolved", {})
    return tmp_path / "cache" / "peak_flops.json"


def measurements(monkeypatch, *results: tuple[float, float | None]) -> list[tuple[str, int]]:
    """Replace the benchmark by one that returns `results` in turn; returns the calls it saw."""
    calls: list[tuple[str, int]] = []

    def measure(precision: str, threads: int) -> tuple[float, float | None]:
        calls.append((precision, threads))
        return results[len(calls) - 1]

    monkeypatch.setattr(precision_module, "measure_while_watching", measure)
    return calls


def test_a_quiet_measurement_is_cached_and_every_later_run_uses_it(cache, monkeypatch):
    # Two runs of the same work once reported 43% and 17% MFU: each timed its own peak under
    # whatever else the machine ran. Now the second run (here: a second process) reads the first's.
    calls = measurements(monkeypatch, (3e10, 0.02), (1e10, 0.02))
    first = resolve_peak(CPU, FP32)
    assert first.flops == 3e10 and first.source == "measured-now" and peak_source() == "measured-now"
    entry = json.loads(cache.read_text())[f"{cpu_model()} | fp32 | {torch.get_num_threads()} threads"]
    assert entry["flops"] == 3e10 and entry["others_cpu_share"] == 0.02 and len(entry["measured"]) == 10
    monkeypatch.setattr(precision_module, "_resolved", {})  # a new process
    second = resolve_peak(CPU, FP32)
    assert second.flops == 3e10 and second.source == f"cached {entry['measured']}"
    assert len(calls) == 1
    # Another precision or thread count is another entry.
    calls_bf16 = measurements(monkeypatch, (9e10, 0.0))
    assert resolve_peak(CPU, Precision("bf16", "cpu")).flops == 9e10 and len(calls_bf16) == 1
    assert len(json.loads(cache.read_text())) == 2


def test_a_measurement_on_a_busy_machine_is_used_once_and_not_cached(cache, monkeypatch):
    calls = measurements(monkeypatch, (1e10, 0.45), (3e10, 0.01))
    busy = resolve_peak(CPU, FP32)
    assert busy.flops == 1e10 and busy.source.startswith("measured-now, busy")
    assert "45%" in busy.source and "SMELT_PEAK_FLOPS" in busy.source and not cache.exists()
    monkeypatch.setattr(precision_module, "_resolved", {})
    quiet = resolve_peak(CPU, FP32)
    assert quiet.flops == 3e10 and quiet.source == "measured-now" and cache.exists() and len(calls) == 2


def test_the_environment_overrides_and_a_bad_value_names_the_variable(cache, monkeypatch):
    calls = measurements(monkeypatch)
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "2.5e12")
    assert resolve_peak(CPU, FP32) == precision_module.Peak(2.5e12, "env") and not calls
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "fast")
    with pytest.raises(ConfigError, match="SMELT_PEAK_FLOPS"):
        resolve_peak(CPU, FP32)


def test_a_damaged_cache_is_measured_again(cache, monkeypatch):
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    measurements(monkeypatch, (2e10, 0.0))
    assert resolve_peak(CPU, FP32).source == "measured-now"
    assert len(json.loads(cache.read_text())) == 1


def test_the_start_event_and_summary_name_the_peaks_source(data, tmp_path, cache, monkeypatch):  # noqa: F811
    from smelt.train.trainer import train

    key = f"{cpu_model()} | fp32 | 1 threads"
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({key: {"flops": 4e10, "measured": "2020-01-02"}}))
    calls = measurements(monkeypatch)
    out = tmp_path / "run"
    summary = train(tiny_config(threads=1, tokens=256 * 2, eval_every=0), *data, out)
    (start,) = [r for r in read_metrics(out) if r.get("event") == "start"]
    assert start["peak_flops"] == 4e10 and start["peak_flops_source"] == "cached 2020-01-02"
    assert summary["peak_flops_source"] == "cached 2020-01-02" and not calls
    assert json.loads((out / "summary.json").read_text())["peak_flops_source"] == "cached 2020-01-02"
