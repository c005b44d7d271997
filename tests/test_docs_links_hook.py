"""The docs site's link hook (docs/hooks/doc_links.py), run through MkDocs' own config and
plugin events: on API reference pages a docstring's `docs/PAGE.md` becomes a link to that
page, and a mention of a page that does not exist fails the build."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("mkdocs")

from mkdocs.config import load_config
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page
from mkdocs.structure.toc import get_toc

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def config() -> MkDocsConfig:
    cfg = load_config(str(ROOT / "mkdocs.yml"))
    cfg.plugins.on_config(cfg)
    return cfg


def content(config: MkDocsConfig, html: str, src: str = "reference/spark.md") -> str:
    """Run the page-content event of every hook and plugin on one page's HTML."""
    names = [src, "writing.md", "operations/lag.md"]
    files = Files([File(n, src_dir=config.docs_dir, dest_dir=config.site_dir,
                        use_directory_urls=True) for n in names])
    page = Page(None, files.get_file_from_path(src), config)
    page.toc = get_toc([])  # as after the page's Markdown is converted
    return str(config.plugins.on_page_content(html, page=page, config=config, files=files))


def test_mentions_on_reference_pages_link_to_the_page(config: MkDocsConfig) -> None:
    html = "<p>Exactly-once (see docs/writing.md), lag: docs/operations/lag.md#lag_of.</p>"
    assert content(config, html) == (
        '<p>Exactly-once (see <a href="../../writing/">docs/writing.md</a>), lag: '
        '<a href="../../operations/lag/#lag_of">docs/operations/lag.md#lag_of</a>.</p>')


def test_other_pages_and_paths_are_left_alone(config: MkDocsConfig) -> None:
    html = "<p>docs/writing.md</p>"
    assert content(config, html, src="writing.md") == html
    kept = '<p><a href="docs/writing.md">x</a> s2/docs/writing.md ./docs/writing.md</p>'
    assert content(config, kept) == kept


def test_a_mention_of_no_page_fails_the_build(config: MkDocsConfig) -> None:
    with pytest.raises(PluginError, match=r"reference/spark.md: 'docs/nowhere.md' names no page"):
        content(config, "<p>see docs/nowhere.md</p>")
