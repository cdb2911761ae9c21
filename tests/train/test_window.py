"""The log window's accumulator: what a train record is made of, and its state_dict."""

import math

import torch

from smelt.train.window import Window


def test_window_means_finite_losses_and_counts_steps():
    window = Window(["code", "prose"])
    window.add_step(0.5, 0.1, 100, 2.0, clipped=True, skipped=False)
    window.add_step(0.5, 0.1, 100, float("nan"), clipped=False, skipped=True)
    window.add_sources(torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64))
    assert window.mean_loss() == 2.0 and window.steps == 2 and window.tokens == 200
    assert (window.clipped, window.skipped) == (1, 1) and window.tokens_per_s() == 200.0
    restored = Window(["code", "prose"])
    restored.load_state_dict(window.state_dict())
    assert restored.state_dict() == window.state_dict()
    window.reset()  # a new window; the run's totals go on
    assert math.isnan(window.mean_loss()) and window.steps == 0 and window.train_time == 1.0
    assert float(window.source_sums.sum()) == 0.0
