"""Attention for packed sequences: which kernel runs, and the document mask it takes.

A packed training row holds several documents, and a token must attend only to earlier tokens of its
own document. `document_mask` builds that mask once per batch in the form the chosen kernel takes,
every layer reuses it, and `attend` runs the kernel:

- no document ids: SDPA with is_causal=True. No mask tensor at all, so the flash kernels run.
- "flex": flex attention with a BlockMask whose mask_mod is causal AND same document. The block mask
  records, per 128 x 128 tile of the score matrix, whether the tile is empty, full or partial, so the
  fused kernel skips the tiles between two documents and never holds a [T, T] tensor: work scales
  with the sum of squared document lengths (to tile granularity) rather than with T^2.
- "sdpa": a dense boolean mask [B, 1, T, T] handed to SDPA. Correct on every device, but it costs
  B T^2 bytes, and on CUDA a mask rules out the flash kernel (the slower mem-efficient kernel runs).

model.attention = "auto" picks flex on CUDA and the dense mask elsewhere, for what torch 2.13 does
on CPU: flex attention has no backward there, its eager form is an unfused reference that
materializes the scores (about 8x slower than SDPA), and only its compiled forward is fused; whereas
SDPA's CPU flash kernel takes the boolean mask. bench/model.py measured small-5m at sequence 1024 on
2 cores: the dense mask keeps 84% of plain causal throughput in forward+backward, and compiled flex
inference runs at 0.92x the dense mask's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Union

import torch
import torch.nn.functional as F

from smelt.errors import UserError

try:  # flex attention arrived in torch 2.5; pyproject allows older versions, which fall back to SDPA
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

    FLEX_AVAILABLE = True
except ImportError:  # pragma: no cover - torch 2.13 is pinned in constraints.txt
    FLEX_AVAILABLE = False

ATTENTION_CHOICES = ("auto", "sdpa", "flex")

# What one forward shares across its layers: None (causal), a boolean tensor, or a BlockMask.
AttentionMask = Union[torch.Tensor, "BlockMask", None]


def flex_backward_supported(device: torch.device) -> bool:
    """Whether flex attention can backpropagate on this device (torch 2.13: CUDA only)."""
    return device.type == "cuda"


def resolve_attention(setting: str, device: torch.device, needs_grad: bool) -> str:
    """The kernel ("flex" or "sdpa") for document-masked attention under model.attention = setting."""
    if setting not in ATTENTION_CHOICES:
        raise UserError(f"model.attention = {setting!r} is not one of {', '.join(ATTENTION_CHOICES)}.")
    if setting == "sdpa":
        return "sdpa"
    if setting == "auto":
        return "flex" if FLEX_AVAILABLE and device.type == "cuda" else "sdpa"
    if not FLEX_AVAILABLE:
        raise UserError(
            f"model.attention = 'flex' needs torch >= 2.5 (flex attention); this is torch {torch.__version__}. "
            "Use model.attention = 'auto' or 'sdpa'."
        )
    if needs_grad and not flex_backward_supported(device):
        raise UserError(
            f"model.attention = 'flex' cannot train on {device.type}: torch {torch.__version__} has no "
            "flex-attention backward off CUDA. Use model.attention = 'auto' (flex on CUDA, SDPA with a "
            "document mask elsewhere) or 'sdpa'."
        )
    return "flex"


def dense_mask(
    q_doc: torch.Tensor | None, k_doc: torch.Tensor | None, start: int, T: int, device: torch.device
) -> torch.Tensor:
    """Boolean SDPA mask [B or 1, 1, T, start + T]: causal, and within one document when ids are given.

    Queries sit at positions start..start+T-1 (start > 0 when a KV cache holds the earlier keys).
    """
    q_pos = torch.arange(start, start + T, device=device)
    k_pos = torch.arange(start + T, device=device)
    mask = (k_pos[None, :] <= q_pos[:, None])[None, None]
    if q_doc is not None:
        mask = mask & (q_doc[:, None, :, None] == k_doc[:, None, None, :])
    return mask


@functools.cache
def _compiled(fn: Callable) -> Callable:
    """torch.compile(fn), made once per process: every compiled copy would compile its own kernels."""
    return torch.compile(fn)


def document_block_mask(doc_ids: torch.Tensor) -> BlockMask:
    """BlockMask for flex attention over doc_ids [B, T]: causal, and within one document.

    On CUDA create_block_mask runs compiled, which evaluates the mask_mod tile by tile instead of
    materializing the [B, 1, T, T] boolean tensor that its eager form builds (and that flex avoids).
    Inside a model already being compiled it is traced into that graph as it is.
    """
    B, T = doc_ids.shape

    def causal_same_document(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (doc_ids[b, q_idx] == doc_ids[b, kv_idx])

    build = create_block_mask
    if doc_ids.device.type == "cuda" and not torch.compiler.is_compiling():
        build = _compiled(create_block_mask)
    return build(causal_same_document, B, None, T, T, device=doc_ids.device)


def document_mask(doc_ids: torch.Tensor, setting: str = "auto") -> AttentionMask:
    """The mask every layer of one forward shares for packed rows doc_ids [B, T] (no KV cache).

    Built once per batch, not per layer: a BlockMask costs a pass over the tiles, a dense mask B T^2
    bytes. The kernel follows model.attention (see resolve_attention).
    """
    kind = resolve_attention(setting, doc_ids.device, torch.is_grad_enabled())
    if kind == "flex":
        return document_block_mask(doc_ids)
    return dense_mask(doc_ids, doc_ids, 0, doc_ids.shape[1], doc_ids.device)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: AttentionMask,
    causal: bool,
    enable_gqa: bool,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd) + mask) v for q [B, H, Tq, hd] and k, v [B, H_kv, Tk, hd].

    mask None: causal when `causal`, else full (one decode step against a KV cache). A tensor goes to
    SDPA; a BlockMask to flex attention, whose fused kernel only exists compiled: outside a compiled
    model it goes through one process-wide torch.compile(flex_attention), as torchtitan does.
    """
    if mask is None or isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=enable_gqa
        )
    if not torch.compiler.is_compiling():
        return _compiled(flex_attention)(q, k, v, block_mask=mask, enable_gqa=enable_gqa)
    if q.device.type == "cpu":
        return _flex_outside_graph(q, k, v, mask, enable_gqa)
    return flex_attention(q, k, v, block_mask=mask, enable_gqa=enable_gqa)


@torch.compiler.disable
def _flex_outside_graph(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: BlockMask, enable_gqa: bool
) -> torch.Tensor:
    """Flex attention in a graph of its own, for a model compiled on CPU.

    Inside the model's graph, torch 2.13's CPU flex template reads the shape of the buffer under each
    input view and fails ("too many values to unpack") on q = rope(...), a view of a 5-D buffer, or
    on a transposed projection; compiled separately, its inputs are plain 4-D tensors. The graph
    break per layer only costs CPU inference, the one place flex runs on CPU.
    """
    return _compiled(flex_attention)(q, k, v, block_mask=mask, enable_gqa=enable_gqa)
