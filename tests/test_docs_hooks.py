"""The documentation build's hook: Sphinx roles in docstrings become cross-references."""

from __future__ import annotations

import mkdocs_hooks

PAGE = (
    '<h2 id="purgatory_aio.fanout">fanout</h2>'
    '<h3 id="purgatory_aio.fanout.Fanout">Fanout</h3>'
    '<h4 id="purgatory_aio.fanout.Fanout.watch">watch</h4>'
    "<p>See :meth:<code>Fanout.watch</code>, :class:<code>~purgatory_aio.Timer</code>, "
    ":data:<code>ENV_URL</code> and :func:<code>unknown</code>.</p>"
)


def test_roles_become_optional_autorefs_resolved_from_the_inside_out() -> None:
    out = mkdocs_hooks.on_page_content(PAGE)
    assert ":meth:" not in out and ":class:" not in out
    # A relative name: the object's own member, found among the page's anchors.
    assert (
        '<autoref identifier="purgatory_aio.fanout.Fanout.watch" optional>'
        "<code>Fanout.watch</code></autoref>" in out
    )
    # ~ shows the last component only; a full path is taken as it is.
    assert '<autoref identifier="purgatory_aio.Timer" optional><code>Timer</code>' in out
    # Not on the page: the outermost candidate, left for autorefs (plain code if unknown).
    assert '<autoref identifier="purgatory_aio.ENV_URL" optional><code>ENV_URL</code>' in out
    assert "<code>unknown</code></autoref>" in out


def test_text_without_roles_is_unchanged() -> None:
    text = "<p>Plain <code>code</code> and a :colon: here.</p>"
    assert mkdocs_hooks.on_page_content(text) == text
