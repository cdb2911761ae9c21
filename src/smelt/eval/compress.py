"""Classic compressors as a floor for a language model: bits per byte of gzip -9 and xz -9e."""

from __future__ import annotations

import gzip
import lzma


def gzip_bits_per_byte(data: bytes) -> float:
    return 8.0 * len(gzip.compress(data, compresslevel=9, mtime=0)) / max(len(data), 1)


def xz_bits_per_byte(data: bytes) -> float:
    compressed = lzma.compress(data, format=lzma.FORMAT_XZ, preset=9 | lzma.PRESET_EXTREME)
    return 8.0 * len(compressed) / max(len(data), 1)
