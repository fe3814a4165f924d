"""MkDocs hook: Sphinx cross-reference roles in docstrings become links in the API reference.

The docstrings write ``:class:`~purgatory_aio.Timer```, ``:meth:`advance```, ... (what
``help()`` and IDEs show as is). Rendered as Markdown, such a role arrives in the page as
``:class:<code>~purgatory_aio.Timer</code>``; this turns it into an optional cross-reference
for mkdocs-autorefs, which links it to the name's entry when the reference has one and
leaves plain code otherwise. A name without a module path is looked up from the object the
docstring belongs to outwards (its own members, then its class's, then its module's).
"""

from __future__ import annotations

import html
import re
from typing import Any

ROLE = re.compile(r":(?:class|meth|func|mod|data|attr|exc|obj):<code>(?P<target>[^<]+)</code>")
#: The heading ids mkdocstrings gives each documented object: its dotted path.
OBJECT_ID = re.compile(r'\bid="(?P<path>(?:purgatory_aio|purgatory_report)(?:\.\w+)*)"')


def _candidates(name: str, context: str) -> list[str]:
    """Where a relative ``name`` may live, innermost first, from the object ``context``."""
    if name.startswith(("purgatory_aio", "purgatory_report")):
        return [name]
    name = name.lstrip(".")
    parts = context.split(".")
    return [".".join([*parts[:end], name]) for end in range(len(parts), 0, -1)]


def on_page_content(html_text: str, **_: Any) -> str:
    """Rewrite every role of the page; mkdocs-autorefs resolves the links afterwards."""
    ids = {m["path"]: m.start() for m in OBJECT_ID.finditer(html_text)}
    starts = sorted((pos, path) for path, pos in ids.items())

    def context_at(position: int) -> str:
        current = "purgatory_aio"
        for pos, path in starts:
            if pos > position:
                break
            current = path
        return current

    def replace(match: re.Match[str]) -> str:
        target = html.unescape(match["target"]).strip()
        short = target.startswith("~")
        name = target.lstrip("~")
        shown = name.rsplit(".", 1)[-1] if short else name.lstrip(".")
        candidates = _candidates(name, context_at(match.start()))
        found = next((c for c in candidates if c in ids), candidates[-1])
        return (
            f'<autoref identifier="{html.escape(found)}" optional>'
            f"<code>{html.escape(shown)}</code></autoref>"
        )

    return ROLE.sub(replace, html_text)
