"""The docs site's options hook (docs/hooks/options.py), run through MkDocs' own config
and plugin events: markers become the generated tables, and a marker naming anything else
fails the build naming the page and what is accepted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mkdocs")

from mkdocs.config import load_config
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

from s2_spark.spark.option_docs import options_markdown

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def config() -> MkDocsConfig:
    """The repository's mkdocs.yml, loaded as `mkdocs build` loads it (hooks included)."""
    cfg = load_config(str(ROOT / "mkdocs.yml"))
    cfg.plugins.on_config(cfg)
    return cfg


def render(config: MkDocsConfig, markdown: str, src: str = "reading.md") -> str:
    """Run the page-markdown event of every hook and plugin on one page's text."""
    file = File(src, src_dir=config.docs_dir, dest_dir=config.site_dir, use_directory_urls=True)
    page = Page(None, file, config)
    files = Files([file])
    out: Any = config.plugins.on_page_markdown(markdown, page=page, config=config, files=files)
    return str(out)


def test_every_marker_becomes_its_table(config: MkDocsConfig) -> None:
    text = (
        "# Options\n\nBefore.\n\n<!-- options: s2 read -->\n\nBetween.\n\n"
        "<!-- options: durable-streams write -->\nAfter.\n"
    )
    expected = (
        "# Options\n\nBefore.\n\n"
        + options_markdown("s2", "read").strip("\n")
        + "\n\nBetween.\n\n"
        + options_markdown("durable-streams", "write").strip("\n")
        + "\nAfter.\n"
    )
    assert render(config, text) == expected


def test_every_format_and_role_has_a_table(config: MkDocsConfig) -> None:
    for fmt in ("s2", "durable-streams"):
        for role in ("read", "write"):
            table = render(config, f"<!-- options: {fmt} {role} -->\n")
            assert table == options_markdown(fmt, role).strip("\n") + "\n"
            assert table.startswith("|")


def test_text_without_markers_is_unchanged(config: MkDocsConfig) -> None:
    text = "# Title\n\n<!-- a comment -->\n\n`options: s2 read`\n"
    assert render(config, text) == text


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("<!-- options: kafka read -->", "unknown"),
        ("<!-- options: s2 append -->", "unknown"),
        ("<!-- options: s2 -->", "malformed"),
        ("<!-- options: s2 read-->", "malformed"),
        ("<!--options: s2 read -->", "malformed"),
        ("See <!-- options: s2 read -->", "malformed"),
    ],
)
def test_a_bad_marker_fails_the_build(config: MkDocsConfig, line: str, kind: str) -> None:
    with pytest.raises(PluginError) as failure:
        render(config, f"# Page\n\n{line}\n", src="writing.md")
    assert str(failure.value) == (
        f"writing.md: {kind} options marker {line!r}; expected '<!-- options: FORMAT ROLE -->' "
        "with FORMAT one of ('s2', 'durable-streams') and ROLE one of ('read', 'write') "
        "(optionally a comma-separated list of option names after ROLE)"
    )


def test_a_marker_may_name_the_options_it_shows(config: MkDocsConfig) -> None:
    table = render(config, "<!-- options: s2 read maxTriggerDelay,minRecordsPerTrigger -->\n")
    assert table == options_markdown(
        "s2", "read", ["maxTriggerDelay", "minRecordsPerTrigger"]).strip("\n") + "\n"
    names = [line.split("`")[1] for line in table.splitlines()[2:]]
    assert names == ["maxTriggerDelay", "minRecordsPerTrigger"]
    with pytest.raises(PluginError, match=r"format s2 has no read option \['maxTrigerDelay'\]"):
        render(config, "<!-- options: s2 read maxTrigerDelay -->\n")


def test_the_pages_mark_all_four_tables() -> None:
    marked = {
        line.strip()
        for page in (ROOT / "docs").rglob("*.md")
        for line in page.read_text().splitlines()
        if "<!-- options:" in line and len(line.split()) == 5  # whole tables, not subsets
    }
    assert marked == {
        "<!-- options: s2 read -->",
        "<!-- options: s2 write -->",
        "<!-- options: durable-streams read -->",
        "<!-- options: durable-streams write -->",
    }
