"""Host memory reuse for CPU training: keep freed blocks in the heap instead of handing them back.

A CPU training step allocates and frees the same large tensors every step: the [tokens, vocabulary]
logits, their fp32 copy and its gradient (128 MB each for small-5m at 4,096 tokens and a vocabulary
of 8,192), activations, attention buffers. glibc's malloc serves every block above its mmap
threshold (at most 32 MB, 128 KB at first) with a fresh mmap and gives it back with munmap on free,
and trims the top of the heap above its trim threshold, so the next step touches new pages and the
kernel zero-fills each on its first fault. On a 2-core AVX-512 BF16 machine that paging cost more
than the matmuls themselves: small-5m's bf16 step took 650 ms with the defaults and 470 ms with freed
memory kept (docs/benchmarks.md, "Training speed"). PyTorch's CUDA caching allocator does the same
for GPU memory; on CPU the usual fix is to preload jemalloc or tcmalloc, which needs the launcher's
cooperation, whereas glibc's own knobs can be set from inside the process by mallopt(3).

The cost: the process's resident memory stays at its peak instead of falling between steps, which is
what a training process does anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

# mallopt(3) parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

# Blocks up to 1 GiB come from the heap and are reused after free; a bigger block (rare on a CPU
# that trains) still gets its own mapping. The heap's top is never trimmed, and it grows 64 MiB at a
# time rather than a page at a time.
KEEP_SETTINGS = ((M_MMAP_THRESHOLD, 1 << 30), (M_TRIM_THRESHOLD, (1 << 31) - 1), (M_TOP_PAD, 64 << 20))


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (the only one with these mallopt parameters), else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") else None


@functools.cache
def keep_freed_host_memory() -> bool:
    """Set glibc's malloc to keep freed memory for reuse (once per process); False where it cannot."""
    libc = _glibc()
    if libc is None:
        return False
    return all(libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) == 1 for param, value in KEEP_SETTINGS)


def host_memory_note(keep: bool, device_type: str) -> str:
    """Apply train.keep_host_memory for a run on device_type and say what it did (for the start record).

    Only a CPU run changes anything: on a GPU the large tensors live in device memory, which PyTorch's
    caching allocator already reuses.
    """
    if not keep:
        return "train.keep_host_memory = false: the C library's default malloc settings"
    if device_type != "cpu":
        return f"train.keep_host_memory: not needed on {device_type} (the caching allocator reuses memory)"
    if keep_freed_host_memory():
        return "train.keep_host_memory: freed host memory is kept for reuse (glibc mallopt)"
    return "train.keep_host_memory: not applied, the C library is not glibc"
