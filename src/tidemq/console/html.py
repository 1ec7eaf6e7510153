"""Tiny HTML builders for the console's server-rendered pages.

Every value that comes from a broker or a user goes through ``escape``: topic names, keys
and message bodies are data, never markup. Pages share one layout with a plain stylesheet
inlined (no CDN, no script: the console must work offline).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape as _escape
from urllib.parse import quote

STYLE = """
body{font-family:system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#1d3557;color:#fff;padding:.6em 1em}
header a{color:#fff;margin-right:1.2em;text-decoration:none}
header .mode{float:right;opacity:.8}
main{padding:1em}
table{border-collapse:collapse;margin:.5em 0 1em;background:#fff}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;font-size:.9em}
th{background:#eef}
td.num{text-align:right;font-variant-numeric:tabular-nums}
form.inline{display:inline}
fieldset{border:1px solid #ccc;margin:.6em 0;background:#fff}
pre{background:#fff;border:1px solid #ddd;padding:.6em;overflow:auto;max-height:30em}
.flash{background:#e7f5e7;border:1px solid #9c9;padding:.4em .8em}
.error{background:#fbe9e9;border:1px solid #d99;padding:.4em .8em}
.charts svg{margin-right:1em;background:#fff;border:1px solid #ddd}
"""

NAV = (
    ("/", "Cluster"),
    ("/topics", "Topics"),
    ("/groups", "Consumer groups"),
    ("/messages", "Messages"),
    ("/dlq", "Dead letters"),
)


def escape(value: object) -> str:
    """``value`` as text safe inside HTML (None is empty)."""
    return "" if value is None else _escape(str(value), quote=True)


def url(path: str, **query: object) -> str:
    """``path`` with ``query`` (None values left out), every part percent-encoded."""
    parts = [f"{quote(str(k))}={quote(str(v), safe='')}" for k, v in query.items()
             if v is not None]
    return path + ("?" + "&".join(parts) if parts else "")


def link(href: str, text: object) -> str:
    return f'<a href="{escape(href)}">{escape(text)}</a>'


def page(title: str, body: str, *, write_enabled: bool, flash: str | None = None,
         error: str | None = None) -> str:
    """A whole page: header with navigation, an optional notice, then ``body``."""
    nav = "".join(link(href, text) for href, text in NAV)
    mode = "write actions enabled" if write_enabled else "read-only"
    notices = ""
    if flash:
        notices += f'<p class="flash" id="flash">{escape(flash)}</p>'
    if error:
        notices += f'<p class="error" id="error">{escape(error)}</p>'
    return (
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
        f"<title>{escape(title)} - tidemq console</title><style>{STYLE}</style></head>"
        f"<body><header>{nav}<span class=\"mode\">{mode}</span></header><main>"
        f"<h1>{escape(title)}</h1>{notices}{body}</main></body></html>"
    )


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, table_id: str = "",
          raw_columns: frozenset[int] = frozenset(), numeric: frozenset[int] = frozenset()
          ) -> str:
    """A table; cells are escaped except those in ``raw_columns`` (already HTML)."""
    out = [f'<table id="{escape(table_id)}">' if table_id else "<table>", "<tr>"]
    out.extend(f"<th>{escape(h)}</th>" for h in headers)
    out.append("</tr>")
    for row in rows:
        out.append("<tr>")
        for index, cell in enumerate(row):
            text = cell if index in raw_columns else escape(cell)
            css = ' class="num"' if index in numeric else ""
            out.append(f"<td{css}>{text}</td>")
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)


def form(action: str, fields: str, submit: str, *, form_id: str = "", method: str = "post",
         inline: bool = False) -> str:
    attributes = f' id="{escape(form_id)}"' if form_id else ""
    css = ' class="inline"' if inline else ""
    return (f'<form method="{method}" action="{escape(action)}"{attributes}{css}>{fields}'
            f'<button type="submit">{escape(submit)}</button></form>')


def field(name: str, label: str, value: object = "", *, kind: str = "text",
          size: int = 20) -> str:
    return (f'<label>{escape(label)} <input type="{kind}" name="{escape(name)}" '
            f'id="{escape(name)}" value="{escape(value)}" size="{size}"></label> ')


def hidden(name: str, value: object) -> str:
    return f'<input type="hidden" name="{escape(name)}" value="{escape(value)}">'
