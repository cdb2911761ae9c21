"""The per-window xz baseline of `smelt eval --data`: a dictionary sized to the window, and the same
compressed sizes as preset 9e's 64 MiB dictionary on real text of the shared corpus."""

from __future__ import annotations

import lzma

import pytest

from smelt.eval import text_sets
from smelt.eval.text_sets import _raw_lzma_bits, read_text_set, window_dict_size


def preset_9e_bits(data: bytes) -> int:
    """What the per-window figure was before: preset 9e with its own 64 MiB dictionary."""
    filters = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]
    return 8 * len(lzma.compress(data, format=lzma.FORMAT_RAW, filters=filters))


def test_a_window_is_compressed_with_a_dictionary_of_its_own_size(monkeypatch):
    seen = []
    compress = lzma.compress

    def spy(data, **kwargs):
        seen.append(kwargs["filters"][0])
        return compress(data, **kwargs)

    monkeypatch.setattr(text_sets.lzma, "compress", spy)
    _raw_lzma_bits(b"the cat sat on the mat " * 35)  # about one 256-token window
    assert seen[0]["dict_size"] == 1 << 16  # not preset 9e's 64 MiB, allocated for every window
    assert seen[0]["preset"] == 9 | lzma.PRESET_EXTREME
    assert window_dict_size(0) == window_dict_size(800) == 1 << 16
    assert window_dict_size(100_000) == 1 << 17 and window_dict_size(1 << 17) == 1 << 17


def test_window_sizes_equal_preset_9e_on_shared_text(shared_data):
    corpus = shared_data / "corpus"
    sources = {
        "web": b"".join(t.encode() for t in read_text_set(corpus / "web" / "dolma-cc-sample")),
        "prose": (corpus / "prose" / "tinyshakespeare" / "input.txt").read_bytes()[:200_000],
        "code": b"".join(
            t.encode() for t in read_text_set(corpus / "code" / "rustpython_stdlib_crate_rs.jsonl")[:20]
        ),
    }
    for name, data in sources.items():
        # windows of about 256 tokens (the docs' example) from three places, and one past 64 KiB
        windows = [data[k * len(data) // 6 :][:780] for k in range(6)]
        if name == "web":
            windows.append(data[:100_000])
        for window in windows:
            assert window, name
            assert _raw_lzma_bits(window) == preset_9e_bits(window), (name, len(window))


@pytest.mark.parametrize("size", [1, 4096, 65_536, 65_537])
def test_window_dictionary_holds_the_whole_window(size):
    assert window_dict_size(size) >= size
