"""The options tables of the docs, made from each format's one declaration of its options
(the docs site's hook calls `options_markdown` for every `<!-- options: FORMAT ROLE -->`)."""

from __future__ import annotations

from s2_spark._options import OptionSet, Role
from s2_spark.spark.durable.source import DURABLE_OPTIONS
from s2_spark.spark.s2.source import S2_OPTIONS

__all__ = ["FORMATS", "options_markdown"]

FORMATS: dict[str, OptionSet] = {s.format: s for s in (S2_OPTIONS, DURABLE_OPTIONS)}


def options_markdown(format_name: str, role: Role, names: list[str] | None = None) -> str:
    """The Markdown table of `format_name`'s options for `role` ("read" or "write"); only
    the options `names` (in that order) when given."""
    if format_name not in FORMATS or role not in ("read", "write"):
        raise ValueError(
            f"no options table for format {format_name!r}, role {role!r}: formats are "
            f"{sorted(FORMATS)}, roles read and write"
        )
    return FORMATS[format_name].markdown(role, names)
