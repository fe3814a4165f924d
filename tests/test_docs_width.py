"""No line of a code block on the site is cut off in a 1280 px wide window.

The rule: a line fits when it is at most :data:`COLUMNS_AT_1280` characters wide, the
code the theme's content column holds at 1280 px; a longer line must wrap, which the
site's own stylesheet (``extra_css`` in mkdocs.yml) makes every code block do.

Where the number comes from (mkdocs-material 9): from 1220 px (76.25em) on, the page is
a 61rem grid (1220 px, the root font being 20 px) holding both sidebars (12.1rem, 242 px
each) and the content (margins of 1.2rem, 24 px, each side); a code block pads its text
by 1.1765em (16 px) each side and sets it in Roboto Mono at 0.85 x 0.8rem = 13.6 px,
0.6em (8.16 px) a character: (1220 - 2 x 242 - 2 x 24 - 2 x 16) / 8.16 = 80.4. Headless
Chromium 156 at a 1280 px window agrees (once, by hand, over every page of the built site
with the stylesheet switched off, DejaVu Sans Mono standing in for Roboto Mono): 656 px of
text, the longest line that showed whole 80 characters, the shortest that scrolled 82;
with the stylesheet, no code block of any page scrolled.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from test_readme import BLOCKS, ROOT

#: Characters of code a line of a code block shows at a 1280 px window (see above).
COLUMNS_AT_1280 = 80

MKDOCS = ROOT / "mkdocs.yml"
DOCS = ROOT / "docs"
#: The blocks of the site's pages (the README is GitHub's, not the site's).
SITE_BLOCKS = [block for block in BLOCKS if block.path.is_relative_to(DOCS)]

_RULE = re.compile(r"(?P<selectors>[^{}]+)\{(?P<body>[^}]*)\}")
_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)


def _declarations(body: str) -> dict[str, str]:
    pairs = (part.split(":", 1) for part in body.split(";") if ":" in part)
    return {name.strip(): value.strip() for name, value in pairs}


def wrapping_stylesheets(mkdocs: Path = MKDOCS) -> list[str]:
    """The site's own stylesheets that make a code block wrap its long lines."""
    config = yaml.safe_load(mkdocs.read_text(encoding="utf-8"))
    docs = mkdocs.parent / config.get("docs_dir", "docs")
    found = []
    for name in config.get("extra_css", []):
        css = _COMMENT.sub("", (docs / name).read_text(encoding="utf-8"))
        for rule in _RULE.finditer(css):
            selectors = {
                " ".join(s.replace(">", " > ").split()) for s in rule["selectors"].split(",")
            }
            declared = _declarations(rule["body"])
            if (
                ".md-typeset pre > code" in selectors
                and declared.get("white-space") in ("pre-wrap", "break-spaces")
                and declared.get("overflow-wrap") in ("anywhere", "break-word")
            ):
                found.append(name)
    return found


def too_wide() -> list[str]:
    """Every line of a site code block wider than :data:`COLUMNS_AT_1280`."""
    return [
        f"{block.path.relative_to(ROOT)}:{block.line + index + 1}: {width} characters"
        for block in SITE_BLOCKS
        for index, line in enumerate(block.code.splitlines())
        if (width := len(line.expandtabs())) > COLUMNS_AT_1280
    ]


def test_every_code_line_fits_at_1280_px_or_wraps() -> None:
    assert len(SITE_BLOCKS) > 20  # every page's blocks, not none by a parsing slip
    wide = too_wide()
    assert not wide or wrapping_stylesheets(), (
        f"{len(wide)} code line(s) wider than the {COLUMNS_AT_1280} characters a 1280 px "
        "window shows, and no stylesheet in mkdocs.yml's extra_css wraps them:\n" + "\n".join(wide)
    )


def test_the_site_wraps_its_code_blocks() -> None:
    assert wrapping_stylesheets() == ["stylesheets/code.css"]


@pytest.mark.parametrize(
    ("css", "wraps"),
    [
        (".md-typeset pre>code{white-space:pre-wrap;overflow-wrap:anywhere}", True),
        ("a, .md-typeset  pre > code { overflow-wrap: break-word; white-space: pre-wrap; }", True),
        (".md-typeset pre > code { white-space: pre; overflow-wrap: anywhere }", False),
        (".md-typeset pre > code { white-space: pre-wrap }", False),  # a long word scrolls
        (".md-typeset code { white-space: pre-wrap; overflow-wrap: anywhere }", False),
        ("/* .md-typeset pre > code { white-space: pre-wrap; overflow-wrap: anywhere } */", False),
    ],
)
def test_only_a_rule_that_wraps_counts(tmp_path: Path, css: str, wraps: bool) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "site.css").write_text(css)
    (tmp_path / "mkdocs.yml").write_text("extra_css:\n  - site.css\n")
    assert wrapping_stylesheets(tmp_path / "mkdocs.yml") == (["site.css"] if wraps else [])
