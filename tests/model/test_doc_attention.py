"""Intra-document attention: the flex BlockMask path, the dense-mask SDPA path, and plain causal SDPA."""

import shutil
import warnings

import pytest
import torch
import torch.nn.attention.flex_attention as torch_flex

import smelt.model.attention as attention
import smelt.model.transformer as transformer
from helpers import build_model, tiny_model_config
from smelt.errors import UserError
from smelt.model.attention import resolve_attention
from smelt.model.transformer import Transformer, position_ids_from_doc_ids

VOCAB = 384
T = 256  # two of flex attention's 128-token tiles per row
PATHS = ("sdpa", "flex")


@pytest.fixture
def reference_flex(monkeypatch):
    """Flex attention's eager reference implementation, backward included, on CPU.

    torch 2.13 refuses a flex-attention backward off CUDA, but only in the Python wrapper
    (`_validate_device`): the operator underneath has an eager math forward and backward driven by the
    same mask_mod and BlockMask. Lifting that guard and skipping torch.compile lets these tests check
    the model's flex path (block mask, GQA and QK-norm plumbing, gradients) against the dense path in
    seconds. The fused CPU kernel is checked by the compile test below (forward only: it has no
    backward); the fused CUDA kernels have to be compared on a GPU.
    """
    monkeypatch.setattr(torch_flex, "_validate_device", lambda query, key, value: None)
    monkeypatch.setattr(attention, "_compiled", lambda fn: fn)
    monkeypatch.setattr(attention, "flex_backward_supported", lambda device: True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        yield


def build(path: str, **overrides) -> Transformer:
    cfg = tiny_model_config(attention=path, max_seq_len=T, **overrides)
    return build_model(cfg, VOCAB).eval()


def packed_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens, doc_ids and restarted positions [3, T] of three packed rows:
    0: five documents, one of a single token and one crossing the 128-token tile boundary;
    1: two documents that meet exactly at that boundary, so flex can skip a whole tile;
    2: one document throughout."""
    x = torch.randint(2, VOCAB, (3, T), generator=torch.Generator().manual_seed(0))
    doc = torch.zeros(3, T, dtype=torch.long)
    for start in (37, 100, 101, 150):  # documents [0, 37), [37, 100), [100, 101), [101, 150), [150, T)
        doc[0, start:] += 1
    doc[1, 128:] = 1
    return x, doc, position_ids_from_doc_ids(doc)


def logits_and_grads(model: Transformer, x, y, **kwargs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    logits, loss = model(x, y, **kwargs)
    loss.backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize(
    "shape", [dict(n_kv_heads=2, qk_norm=True), dict(n_kv_heads=4)], ids=["gqa-qknorm", "mha"]
)
@pytest.mark.slow
def test_flex_and_dense_paths_give_the_same_logits_and_gradients(reference_flex, shape):
    x, doc, pos = packed_batch()
    y = torch.roll(x, -1, dims=1)
    dense, flex = build("sdpa", **shape).train(), build("flex", **shape).train()
    dense_logits, expected = logits_and_grads(dense, x, y, doc_ids=doc, position_ids=pos)
    flex_logits, got = logits_and_grads(flex, x, y, doc_ids=doc, position_ids=pos)
    torch.testing.assert_close(flex_logits, dense_logits, atol=1e-5, rtol=1e-5)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)
    # The comparison is sharp enough to see a wrong mask: attending across documents changes the logits.
    with torch.no_grad():
        leaky, _ = dense(x, position_ids=pos)
    assert not torch.allclose(leaky, dense_logits, atol=1e-3)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.slow
def test_a_token_never_attends_across_a_document_boundary(reference_flex, path):
    model = build(path, n_layers=3, qk_norm=True)
    x, doc, pos = packed_batch()
    first = doc == 0
    x2 = x.clone()
    x2[first] = torch.randint(2, VOCAB, (int(first.sum()),), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        a, _ = model(x, doc_ids=doc, position_ids=pos)
        b, _ = model(x2, doc_ids=doc, position_ids=pos)
        # Without document ids the same edit reaches later documents: the check below can fail.
        leaky_a, _ = model(x, position_ids=pos)
        leaky_b, _ = model(x2, position_ids=pos)
    later = ~first
    assert torch.equal(a[later], b[later])
    assert not torch.allclose(a[first], b[first])
    assert not torch.allclose(leaky_a[later], leaky_b[later])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.slow
def test_one_document_per_row_equals_plain_causal_attention(reference_flex, path):
    model = build(path)
    x, _, _ = packed_batch()
    doc = torch.zeros_like(x)
    with torch.no_grad():
        masked, _ = model(x, doc_ids=doc, position_ids=position_ids_from_doc_ids(doc))
        causal, _ = model(x)
    torch.testing.assert_close(masked, causal, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("path", PATHS)
def test_one_mask_per_forward_is_shared_by_every_layer(reference_flex, monkeypatch, path):
    model = build(path, n_layers=3)
    x, doc, pos = packed_batch()
    built, seen = [], []

    def spy_document_mask(*args):
        built.append(attention.document_mask(*args))
        return built[-1]

    def spy_attend(q, k, v, mask, *args, **kwargs):
        seen.append(mask)
        return attention.attend(q, k, v, mask, *args, **kwargs)

    monkeypatch.setattr(transformer, "document_mask", spy_document_mask)
    monkeypatch.setattr(transformer, "attend", spy_attend)
    with torch.no_grad():
        model(x, doc_ids=doc, position_ids=pos)
    assert len(built) == 1 and len(seen) == 3
    assert all(mask is built[0] for mask in seen)
    if path == "sdpa":
        assert isinstance(built[0], torch.Tensor) and built[0].shape == (3, 1, T, T)
    else:
        mask = built[0]
        assert isinstance(mask, torch_flex.BlockMask)
        # Tiles computed per (row, query tile): queries 128..255 of row 1 share no document with keys
        # 0..127, so that tile is skipped, while the one-document row 2 needs both.
        computed = mask.kv_num_blocks + mask.full_kv_num_blocks
        assert computed[:, 0].tolist() == [[1, 2], [1, 1], [1, 2]]


def test_auto_picks_flex_on_cuda_and_the_dense_mask_elsewhere():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_attention("auto", cuda, needs_grad=True) == "flex"
    assert resolve_attention("auto", cpu, needs_grad=True) == "sdpa"
    assert resolve_attention("auto", cpu, needs_grad=False) == "sdpa"
    assert resolve_attention("sdpa", cuda, needs_grad=True) == "sdpa"
    assert resolve_attention("flex", cpu, needs_grad=False) == "flex"  # inference: a fused CPU kernel exists
    with pytest.raises(UserError, match=r"model.attention = 'flex' cannot train on cpu.*'auto'"):
        resolve_attention("flex", cpu, needs_grad=True)


def test_training_with_flex_on_cpu_is_a_user_error_naming_the_key():
    model = build("flex").train()
    x, doc, pos = packed_batch()
    with pytest.raises(UserError, match="model.attention"):
        model(x, torch.roll(x, -1, dims=1), doc_ids=doc, position_ids=pos)


@pytest.mark.slow  # inductor compiles the model with the flex kernel: about a minute on 2 cores
@pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="inductor needs a C compiler"
)
@pytest.mark.slow
def test_compiled_flex_forward_on_cpu_matches_the_dense_path():
    """The fused CPU flex kernel (torch.compile; forward only in torch 2.13) skips whole tiles, so this
    is also the test of the BlockMask itself: the eager reference applies the mask_mod everywhere."""
    torch._dynamo.reset()
    x, doc, pos = packed_batch()
    dense = build("sdpa", qk_norm=True)
    compiled = torch.compile(build("flex", qk_norm=True))
    first = doc == 0
    x2 = x.clone()
    x2[first] = (x2[first] + 1) % VOCAB
    with torch.no_grad():
        expected, _ = dense(x, doc_ids=doc, position_ids=pos)
        got, _ = compiled(x, doc_ids=doc, position_ids=pos)
        edited, _ = compiled(x2, doc_ids=doc, position_ids=pos)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(edited[~first], got[~first], atol=0, rtol=0)
    assert not torch.allclose(edited[first], got[first])
