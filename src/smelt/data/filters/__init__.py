"""Heuristic document filters: length, URL blocklist, Gopher quality and repetition, C4, FineWeb, code.

Each source chooses its filters by name (`data.sources[i].filters`, see `filter_names`); each filter
is a `DocStep` with thresholds in its own config section, scores in `doc.meta[<step name>]` for kept
documents, and a ledger drop with reason `<step name>.<rule>` otherwise. `FILTER_STEPS` lists the
filter classes in the order they run: the URL blocklist first (it reads no text), then the measuring
filters, Gopher before C4 because C4 rewrites the text (as in FineWeb's pipeline), code last.
"""

from __future__ import annotations

from smelt.data.filters.base import FILTER_NAMES, TextFilter, filter_names, sources_using
from smelt.data.filters.c4 import C4Filter
from smelt.data.filters.code_rules import CodeFilter
from smelt.data.filters.fineweb import FineWebFilter
from smelt.data.filters.gopher import GopherQuality, GopherRepetition
from smelt.data.filters.length import LengthFilter
from smelt.data.filters.url_blocklist import UrlBlocklist

FILTER_STEPS = (UrlBlocklist, GopherQuality, GopherRepetition, C4Filter, FineWebFilter, CodeFilter)

__all__ = [
    "FILTER_NAMES",
    "FILTER_STEPS",
    "C4Filter",
    "CodeFilter",
    "FineWebFilter",
    "GopherQuality",
    "GopherRepetition",
    "LengthFilter",
    "TextFilter",
    "UrlBlocklist",
    "filter_names",
    "sources_using",
]
