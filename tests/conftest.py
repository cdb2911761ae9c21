import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("SMELT_QUIET", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one worker per core: each worker, and every process it starts, keeps to one thread
    # (two workers of two threads each on two cores slow each other far more than twice).
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def shared_data_dir() -> Path | None:
    candidates = [os.environ.get("SMELT_SHARED_DATA"), REPO.parent / "shared" / "data"]
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared real-data directory; missing is a failure under CI=true, a skip elsewhere."""
    path = shared_data_dir()
    if path is None:
        message = "shared data not found at ../shared/data or $SMELT_SHARED_DATA"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path
