"""Token shards written to a store's URL: the local bytes, each `.done` marker after its shard, the
manifest last, and a rerun that resumes locally and uploads nothing new."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from smelt.config import TokensConfig
from smelt.tokens.tokenize import tokenize


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_token_shards_to_a_store(tmp_path, documents, tokenizer_dir, monkeypatch):
    memory = type(fsspec.filesystem("memory"))
    put_file = memory.put_file
    uploads: list[str] = []
    monkeypatch.setattr(
        memory, "put_file", lambda fs, src, dst, **kw: uploads.append(dst) or put_file(fs, src, dst, **kw)
    )
    cfg = TokensConfig(shard_tokens=300, batch_docs=4)
    url = f"memory://smelt-tokens-{tmp_path.name}/tokens"
    local = tokenize(cfg, documents, tokenizer_dir, tmp_path / "local")
    remote = tokenize(cfg, documents, tokenizer_dir, url, url_cache=str(tmp_path / "cache"))
    assert remote["tokens"] == local["tokens"] and local["shards"] > 2

    fs = fsspec.filesystem("memory")
    root = fs._strip_protocol(url)
    stored = {path.removeprefix(root).lstrip("/"): fs.cat_file(path) for path in fs.find(root)}
    assert stored == _tree(tmp_path / "local")  # byte for byte
    names = [u.removeprefix(root).lstrip("/") for u in uploads]
    assert names[-1] == "shards.json"  # what readers check the shards against comes last
    for marker in (n for n in names if n.endswith(".done")):
        shard = marker.removesuffix(".done")
        assert names.index(f"{shard}.bin") < names.index(marker) > names.index(f"{shard}.idx")

    uploads.clear()
    again = tokenize(cfg, documents, tokenizer_dir, url, url_cache=str(tmp_path / "cache"))
    assert again["resumed_shards"] == local["shards"]  # the staging directory kept every shard
    assert uploads == []  # the same bytes: nothing to upload


@pytest.mark.slow
def test_tokenize_with_a_killed_encoding_worker_is_byte_identical(
    tmp_path, documents, tokenizer_dir, monkeypatch
):
    import functools

    import smelt.tokens.tokenize as tokenize_module
    from pool_faults import die_once

    cfg = TokensConfig(shard_tokens=300, batch_docs=2, retries=1)
    clean = tokenize(cfg, documents, tokenizer_dir, tmp_path / "clean", workers=1)  # same bytes as 2
    marker = tmp_path / "killed-once"
    encode = functools.partial(die_once, str(marker), "smelt.tokens.tokenize:_encode_in_worker")
    monkeypatch.setattr(tokenize_module, "_encode_in_worker", encode)
    killed = tokenize(cfg, documents, tokenizer_dir, tmp_path / "killed", workers=2)
    assert marker.exists()  # an encoding worker did die mid-batch
    assert _tree(tmp_path / "killed") == _tree(tmp_path / "clean")  # no document lost or repeated
    assert killed["documents"] == clean["documents"] and killed["tokens"] == clean["tokens"]


@pytest.mark.slow
def test_smelt_tokenize_publish_sends_the_run_tokens_with_the_manifests_last(tmp_path, monkeypatch):
    from smelt.cli import main

    config = tmp_path / "r.toml"
    config.write_text(f'[run]\nname = "r"\ndir = "{tmp_path / "runs"}"\n')
    tokens = tmp_path / "runs" / "r" / "tokens"
    files = ["manifest.json", "meta.json", "shards.json", "stats.json", "train/a/00000.bin"]
    files += ["train/a/00000.done", "train/a/00000.idx", "train/a/00001.bin", "train/a/00001.idx"]
    for rel in files:
        (tokens / rel).parent.mkdir(parents=True, exist_ok=True)
        (tokens / rel).write_text(rel)
    # the stage itself is tested elsewhere: here it is up to date
    monkeypatch.setattr("smelt.cli.pipeline.run_stage_command", lambda *args, **kw: 0)
    memory = type(fsspec.filesystem("memory"))
    put_file = memory.put_file
    uploads: list[str] = []
    monkeypatch.setattr(
        memory, "put_file", lambda fs, src, dst, **kw: uploads.append(dst) or put_file(fs, src, dst, **kw)
    )
    url = f"memory://smelt-cli-{tmp_path.name}/tokens"
    assert main(["tokenize", str(config), "--publish", url]) == 0
    root = fsspec.filesystem("memory")._strip_protocol(url)
    assert [u.removeprefix(root + "/") for u in uploads] == [
        "meta.json",
        "train/a/00000.bin",
        "train/a/00000.idx",
        "train/a/00001.bin",
        "train/a/00001.idx",
        "train/a/00000.done",
        "stats.json",
        "shards.json",
        "manifest.json",
    ]
