"""train.threads = 0 takes OMP_NUM_THREADS where set (torchrun sets 1 per process), else one per core."""

import os

from smelt.train.setup import torch_threads


def test_threads_follow_omp_num_threads_then_the_cores(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert torch_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert torch_threads() == 3
    for unusable in ("", "0", "two"):
        monkeypatch.setenv("OMP_NUM_THREADS", unusable)
        assert torch_threads() == (os.cpu_count() or 1)
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert torch_threads() == (os.cpu_count() or 1)
