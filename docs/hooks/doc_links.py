"""MkDocs hook: on the API reference pages, docstrings' mentions of docs pages become links.

Docstrings name a page as a path in the repository (``docs/writing.md``), which reads well
in ``help()`` and in a checkout; on the site the API reference pages render those
docstrings, and there the mention links to the page. A mention of a page that does not
exist fails the build, naming the mention and the reference page that shows it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from mkdocs.exceptions import PluginError

REFERENCE = "reference/"  # where the pages rendered from docstrings are

# `docs/<path>.md`, optionally `#anchor`, as text: not inside a URL, path or attribute.
_MENTION = re.compile(r"(?<![\w/.=\"'-])docs/(?P<path>(?:[\w-]+/)*[\w-]+\.md)(?P<anchor>#[\w-]+)?")


def link_mentions(html: str, where: str, url_of: Callable[[str], str | None]) -> str:
    """`html` with each `docs/PATH.md` mention wrapped in a link to `url_of(PATH)`."""

    def link(match: re.Match[str]) -> str:
        url = url_of(match["path"])
        if url is None:
            raise PluginError(f"{where}: {match[0]!r} names no page of the docs")
        return f'<a href="{url}{match["anchor"] or ""}">{match[0]}</a>'

    return _MENTION.sub(link, html)


def on_page_content(html: str, *, page: Any, files: Any, **_: Any) -> str:
    """Link the mentions on every API reference page."""
    if not page.file.src_uri.startswith(REFERENCE):
        return html

    def url_of(path: str) -> str | None:
        target = files.get_file_from_path(path)
        return None if target is None else target.url_relative_to(page.file)

    return link_mentions(html, page.file.src_uri, url_of)
