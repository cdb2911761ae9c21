"""The lingua language-id backend (`data.langid.backend`): labels py3langid cannot give, keep-lists in
lingua's codes, forked workers, and the message when the package is missing.

lingua comes with the `langid-lingua` extra, which `make install` (and so `make test` and CI) installs.
Outside CI a machine without it skips these tests; in CI a missing lingua fails them. The fast
low-accuracy mode (`lingua_low`, models load in seconds) stands in for both modes: they differ only in
the flag given to lingua's builder. The sentences are lines 400-409 of the lingua test set, which
bench/langid.py (lines 200-399) does not use.
"""

import importlib.util
import json
import os
import sys

import pyarrow.parquet as pq
import pytest

from smelt.config import DataConfig, LangIdConfig, SourceConfig, config_from_dict
from smelt.data import langid
from smelt.data.curate import curate
from smelt.data.langid import LanguageId, identify
from smelt.data.ledger import Doc, Ledger
from smelt.errors import ConfigError, UserError

# Maori, Tswana and Tsonga: languages py3langid does not know
UNKNOWN_TO_PY3LANGID = ("mi", "tn", "ts")


@pytest.fixture(scope="module")
def lingua_installed():
    if importlib.util.find_spec("lingua") is None:
        if os.environ.get("CI"):
            pytest.fail(
                "lingua-language-detector is missing: `make install` installs the langid-lingua extra"
            )
        pytest.skip("lingua-language-detector is not installed (pip install -e '.[langid-lingua]')")


@pytest.fixture(scope="module")
def sentences(shared_data):
    root = shared_data / "corpus" / "multilingual" / "lingua-testdata-A" / "sentences"
    out = {}
    for lang in (*UNKNOWN_TO_PY3LANGID, "de", "fr"):
        lines = [s for s in (root / f"{lang}.txt").read_text(encoding="utf-8").splitlines() if s.strip()]
        out[lang] = lines[400:410]
    return out


def cfg_with(backend, **source):
    return DataConfig(sources=[SourceConfig(name="web", **source)], langid=LangIdConfig(backend=backend))


@pytest.mark.slow
def test_lingua_labels_languages_py3langid_cannot(lingua_installed, sentences):
    for lang in UNKNOWN_TO_PY3LANGID:
        assert lang not in langid.known_languages("py3langid")
        answers = [identify(s, backend="lingua_low") for s in sentences[lang]]
        assert sum(code == lang for code, _ in answers) >= 9, (lang, answers)
        assert all(0.0 < score <= 1.0 for _, score in answers)
        assert not any(identify(s)[0] == lang for s in sentences[lang])  # py3langid: never
    assert identify("12 345 -- 6.7 %", backend="lingua_low") == ("und", 0.0)


@pytest.mark.slow
def test_keep_lists_use_lingua_codes(lingua_installed, sentences):
    step = LanguageId.from_config(cfg_with("lingua_low", languages=["mi", "nob"]))
    assert step.keep["web"][0] == {"mi", "nb"} and step.backend == "lingua_low"
    ledger = Ledger()
    ledger.step = step.name
    assert step.apply(Doc("web", 0, "a", " ".join(sentences["mi"][:3]), "f"), ledger).meta["lang"] == "mi"
    assert step.apply(Doc("web", 0, "b", " ".join(sentences["de"][:3]), "f"), ledger) is None
    assert ledger.entries[0]["lang"] == "de"
    with pytest.raises(ConfigError) as err:  # lingua tells Bokmal from Nynorsk: "no" is not its code
        LanguageId.from_config(cfg_with("lingua_low", languages=["no"]))
    message = str(err.value)
    assert "data.sources[0].languages" in message and "backend (lingua_low)" in message and "nb" in message


def test_curate_with_lingua_in_forked_workers(lingua_installed, sentences, tmp_path):
    """The detector is loaded in the parent; two forked workers classify with it."""
    root = tmp_path / "texts"
    root.mkdir()
    for lang, lines in sentences.items():
        (root / f"{lang}.txt").write_text("\n\n".join(lines), encoding="utf-8")
    cfg = cfg_with("lingua_low", root=str(root), filters=[])
    cfg.workers, cfg.shard_bytes, cfg.val_fraction, cfg.min_split_docs = 2, 1_000, 0.0, 0
    curate(cfg, tmp_path / "out")
    rows = [r for p in (tmp_path / "out").rglob("*.parquet") for r in pq.read_table(p).to_pylist()]
    assert sorted((r["id"], r["lang"]) for r in rows) == sorted((f"{k}.txt", k) for k in sentences)
    assert all(json.loads(r["meta"])["lang_score"] > 0.5 for r in rows)


def test_lingua_chosen_but_not_installed_is_a_user_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "lingua", None)  # `import lingua` now raises ImportError
    langid._lingua.cache_clear()
    try:
        with pytest.raises(UserError) as err:
            LanguageId.from_config(cfg_with("lingua"))
    finally:
        langid._lingua.cache_clear()
    message = str(err.value)
    assert 'data.langid.backend = "lingua" needs the lingua-language-detector package' in message
    assert "pip install -e '.[langid-lingua]'" in message and 'backend = "py3langid"' in message


def test_backend_is_a_config_key_with_its_choices():
    cfg = config_from_dict({"data": {"langid": {"backend": "lingua"}}})
    assert cfg.data.langid.backend == "lingua"
    assert config_from_dict({}).data.langid.backend == "py3langid"
    with pytest.raises(ConfigError) as err:
        config_from_dict({"data": {"langid": {"backend": "fasttext"}}})
    assert "data.langid.backend" in str(err.value) and "lingua_low" in str(err.value)
