"""MkDocs hook: put the generated options tables where the pages ask for them.

No page holds a hand-written options table: a page marks the place with a line
``<!-- options: FORMAT ROLE -->`` (FORMAT a registered format name, ``s2`` or
``durable-streams``; ROLE ``read`` or ``write``; after ROLE, optionally, the
comma-separated names of the only options to show) and this hook replaces it with
``s2_spark.spark.option_docs.options_markdown(FORMAT, ROLE, NAMES)``. A marker naming anything
else, or written any other way, fails the build.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROLES = ("read", "write")

# Every line that looks like a marker, loosely; each must then match MARKER exactly.
_CANDIDATE = re.compile(r"^.*<!--\s*options\b.*$", re.MULTILINE | re.IGNORECASE)
_MARKER = re.compile(r"<!-- options: (?P<format>\S+) (?P<role>\S+)(?: (?P<names>\S+))? -->")


def _formats() -> tuple[str, ...]:
    """The format names the connector registers, from its data sources."""
    from s2_spark.spark import DurableStreamsDataSource, S2DataSource

    return (S2DataSource.name(), DurableStreamsDataSource.name())


def options_table(line: str, where: str) -> str:
    """The Markdown table for one marker line, or a `PluginError` naming what is wrong."""
    from s2_spark.spark.option_docs import options_markdown

    marker = _MARKER.fullmatch(line.strip())
    formats = _formats()
    expected = (
        f"expected '<!-- options: FORMAT ROLE -->' with FORMAT one of {formats} "
        f"and ROLE one of {ROLES} (optionally a comma-separated list of option names after "
        "ROLE)"
    )
    if marker is None:
        raise PluginError(f"{where}: malformed options marker {line.strip()!r}; {expected}")
    format_name, role = marker["format"], marker["role"]
    if format_name not in formats or role not in ROLES:
        raise PluginError(f"{where}: unknown options marker {line.strip()!r}; {expected}")
    names = marker["names"].split(",") if marker["names"] else None
    try:
        return options_markdown(format_name, role, names).strip("\n")
    except Exception as exc:
        raise PluginError(f"{where}: options table for {format_name} {role} failed: {exc}") from exc


def on_config(config: Any) -> None:
    """Import s2_spark from the checkout being built, not whatever copy is installed."""
    checkout = str(Path(config.config_file_path).resolve().parent)
    if checkout not in sys.path:
        sys.path.insert(0, checkout)


def on_page_markdown(markdown: str, *, page: Any, **_: Any) -> str:
    """Replace every options marker of a page with its generated table."""
    where = page.file.src_uri
    return _CANDIDATE.sub(lambda line: options_table(line[0], where), markdown)
