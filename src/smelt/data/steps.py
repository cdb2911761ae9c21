"""Curation steps over document streams, and how a list of them runs.

A pipeline is an ordered list of steps (see `curate.build_steps`). Two kinds:

* `DocStep` looks at one document at a time (normalize, length filter; later language id, heuristic
  quality filters, PII). Its result must not depend on other documents, so the leading run of
  DocSteps executes inside the reader worker processes.
* `CorpusStep` sees the whole stream in canonical order (source order in the config, then id) and may
  keep state across documents (id uniqueness, exact dedup, split; later MinHash, decontamination).
  It runs in the parent process after the worker results are gathered and sorted.

Every step counts the documents and characters it receives and passes on, per source, in the ledger
under its `name`. Steps are plain objects over iterables of documents, so another engine (Ray, a
cluster map) can call the same steps on its own batches.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from smelt.data.ledger import Doc, Ledger


class DocStep:
    """A per-document step: return the (possibly changed) document, or None after `ledger.drop`.

    `sources`: the source names the step applies to (None: all); documents of other sources pass
    through unchanged (and are still counted in and out). Steps that the config can switch on build
    themselves with a `from_config(cfg: DataConfig)` classmethod that returns None when no source
    uses them."""

    name = "doc_step"
    sources: frozenset[str] | None = None

    def apply(self, doc: Doc, ledger: Ledger) -> Doc | None:
        raise NotImplementedError

    def run(self, docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
        sources = self.sources
        for doc in docs:
            if sources is not None and doc.source not in sources:
                yield doc
                continue
            ledger.step = self.name
            out = self.apply(doc, ledger)
            if out is not None:
                yield out


class CorpusStep:
    """A step over the whole stream in canonical order; may hold state across documents."""

    name = "corpus_step"

    def run(self, docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
        raise NotImplementedError


Step = DocStep | CorpusStep


def _counted(name: str, docs: Iterable[Doc], ledger: Ledger, key: str) -> Iterator[Doc]:
    for doc in docs:
        ledger.count(name, doc.source, key, len(doc.text))
        yield doc


def run_steps(steps: list[Step], docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
    """Chain the steps lazily; each one's in/out counts (documents, characters) land in the ledger."""
    stream: Iterable[Doc] = docs
    for step in steps:
        stream = _counted(
            step.name, step.run(_counted(step.name, stream, ledger, "in"), ledger), ledger, "out"
        )
    return iter(stream)


def split_at_first_corpus_step(steps: list[Step]) -> tuple[list[DocStep], list[Step]]:
    """(the leading DocSteps that may run in workers, the rest that runs in the parent)."""
    for i, step in enumerate(steps):
        if isinstance(step, CorpusStep):
            return list(steps[:i]), list(steps[i:])
    return list(steps), []
