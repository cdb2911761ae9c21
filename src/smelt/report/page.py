"""HTML building blocks for the reports: one self-contained page with inline CSS and no references.

Everything a reader needs is in the file: the plots are inline SVG, the style is inline CSS, there is
no script and no URL, so the page opens the same from a laptop, a mail attachment or an air-gapped box.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0 auto; max-width: 980px;
       padding: 16px 24px 48px; color: #222; line-height: 1.4; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; border-bottom: 1px solid #ddd; padding-bottom: 3px; margin-top: 32px; }
h3 { font-size: 14px; margin: 16px 0 6px; }
nav a { margin-right: 10px; font-size: 12px; color: #4c72b0; }
table { border-collapse: collapse; font-size: 12px; margin: 6px 0 12px; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.missing { color: #777; font-style: italic; }
.note { color: #555; font-size: 12px; }
.diff { background: #fff6d5; }
pre { background: #f7f7f7; padding: 6px 8px; font-size: 11px; white-space: pre-wrap; margin: 0; }
code { font-size: 12px; }
.row { display: flex; flex-wrap: wrap; column-gap: 12px; }
svg { display: block; margin: 8px 0; max-width: 100%; height: auto; }
"""


def esc(value: Any) -> str:
    return html.escape(str(value))


def cell(value: Any) -> str:
    """A table cell: numbers right-aligned and rounded for reading, anything else escaped."""
    if isinstance(value, bool) or value is None:
        return f"<td>{'-' if value is None else esc(value)}</td>"
    if isinstance(value, int):
        return f'<td class="num">{value:,}</td>'
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            text = f"{value:,.0f}"
        else:
            text = f"{value:,.0f}" if abs(value) >= 1e5 else f"{value:.5g}"
        return f'<td class="num">{text}</td>'
    return f"<td>{value}</td>" if isinstance(value, Raw) else f"<td>{esc(value)}</td>"


class Raw(str):
    """Markup that a table cell inserts as it is (already escaped by whoever built it)."""


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], row_classes: Sequence[str] = ()) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if i < len(row_classes) and row_classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(cell(v) for v in row) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def row(*items: str) -> str:
    """Small charts side by side (they wrap on a narrow window)."""
    return f'<div class="row">{"".join(items)}</div>'


def missing(text: str) -> str:
    return f'<p class="missing">{esc(text)}</p>'


def note(text: str) -> str:
    return f'<p class="note">{esc(text)}</p>'


def section(anchor: str, title: str, body: str) -> tuple[str, str, str]:
    return anchor, title, body


def page(title: str, subtitle: str, sections: Sequence[tuple[str, str, str]]) -> str:
    nav = " ".join(f'<a href="#{esc(anchor)}">{esc(name)}</a>' for anchor, name, _ in sections)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="note">{esc(subtitle)}</p>',
        f"<nav>{nav}</nav>",
    ]
    for anchor, name, body in sections:
        parts.append(f'<section id="{esc(anchor)}"><h2>{esc(name)}</h2>\n{body}\n</section>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
