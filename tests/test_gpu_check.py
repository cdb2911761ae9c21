"""bench/gpu_check.py (`make gpu-check`) without a GPU: it refuses with exit 2, and its --dry-run runs
every item of the CUDA check on the CPU at tiny shapes, so the script itself cannot rot between the
sessions that have a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_check.py"


def run_check(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_exits_2_and_says_how_to_dry_run():
    proc = run_check()
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stderr and "--dry-run" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_unknown_item_is_a_user_error(tmp_path):
    proc = run_check("--dry-run", "--work", str(tmp_path), "--only", "quickstart,warp_drive")
    assert proc.returncode == 2
    assert "warp_drive" in proc.stderr and "model_124m" in proc.stderr


def test_an_item_whose_input_never_ran_is_skipped_with_the_reason(tmp_path):
    proc = run_check("--dry-run", "--work", str(tmp_path), "--only", "export_hf")
    assert proc.returncode == 1
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["export_hf_status"] == "SKIP"
    assert "needs quickstart" in result["export_hf_error"]
    assert result["overall"] == "FAIL"


@pytest.mark.slow
def test_dry_run_passes_every_item(tmp_path):
    proc = run_check("--dry-run", "--work", str(tmp_path), "--budget-s", "1500", timeout=1800)
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    statuses = {k: v for k, v in result.items() if k.endswith("_status")}
    assert proc.returncode == 0, (statuses, proc.stdout[-3000:])
    assert len(statuses) == 8 and set(statuses.values()) == {"PASS"}
    # The figures are the items' own: a resumed run that repeats the uninterrupted one bit for bit, FSDP2's
    # losses equal to the unwrapped model's, transformers' logits within 1e-3 of smelt's.
    assert result["kill_resume_bitwise"] is True and result["kill_resume_steps_redone"] > 0
    assert result["fsdp_1gpu_bitwise"] is True
    assert result["export_hf_logits_max_abs_diff"] < 1e-3
    assert result["posttrain_grpo_steps_logged"] == 3
    assert result["pytest_gpu_skipped"] == result["pytest_gpu_tests"] > 0  # no CUDA: every gpu test skips
