"""smelt: from raw text to a trained and evaluated language model, reproducibly."""

__version__ = "0.1.0"
