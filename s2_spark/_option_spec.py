"""Each option declared once: its name, what it takes, its default and one line of doc.

A format's options are `Option`s gathered in an `OptionSet`. The declaration drives the
parsing (`Option.flag`, `Option.count`, `Option.raw`), the check that fails a name the
format does not declare (Spark passes every option through, so a misspelled one would be
ignored and the query run with the default: a backlog skipped, a limit not applied), and
the options tables of the docs (`OptionSet.markdown`), so the three cannot drift.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from s2_spark._option_values import get, get_bool, get_positive_int
from s2_spark.errors import OptionError

__all__ = ["SPARK_OPTIONS", "UNKNOWN_OPTIONS", "Option", "OptionSet", "Role"]

log = logging.getLogger("s2_spark.options")

Role = Literal["read", "write"]
_ROLE_NAMES: dict[Role, str] = {"read": "reading", "write": "writing"}

#: Options Spark itself passes to every source and sink (`load(path)`, `save(path)`,
#: `start(path)`, `checkpointLocation`, `queryName`): accepted, never used.
SPARK_OPTIONS = frozenset({"path", "paths", "checkpointlocation", "queryname"})


@dataclass(frozen=True, slots=True)
class Option:
    """One option: `takes` says what a value may be, `default` is what an unset option
    means (None: unset means nothing, or the `doc` says), `hidden` ones are accepted but
    left out of the docs (test hooks), `aliases` are older names still accepted."""

    name: str
    takes: str
    doc: str
    default: object = None
    roles: tuple[Role, ...] = ("read", "write")
    hidden: bool = False
    aliases: tuple[str, ...] = ()

    def given_as(self, options: Mapping[str, str]) -> str:
        """The name the option was given under: its own, or one of its aliases."""
        given = [n for n in (self.name, *self.aliases) if get(options, n) is not None]
        if len(given) > 1:
            raise OptionError(f"options {' and '.join(given)} are the same option: set one")
        return given[0] if given else self.name

    def raw(self, options: Mapping[str, str]) -> str | None:
        """The value as given (Spark's option names are case-insensitive)."""
        return get(options, self.given_as(options))

    def flag(self, options: Mapping[str, str]) -> bool:
        """A `true`/`false` option; the declared default when unset."""
        return get_bool(options, self.given_as(options), bool(self.default))

    def count(self, options: Mapping[str, str]) -> int | None:
        """A positive integer; the declared default (an int, or None) when unset."""
        value = get_positive_int(options, self.given_as(options))
        if value is None and isinstance(self.default, int):
            return self.default
        return value

    def described(self) -> str:
        """The doc line, naming the older names still accepted."""
        if not self.aliases:
            return self.doc
        return f"{self.doc} Also accepted under its older name {', '.join(self.aliases)}."

    def amount(self, options: Mapping[str, str]) -> int:
        """`count` for an option declared with an int default: never None."""
        value = self.count(options)
        if value is None:
            raise TypeError(f"option {self.name} is declared without a default")
        return value

    def shown_default(self) -> str:
        if self.default is None:
            return ""
        if isinstance(self.default, bool):
            return "true" if self.default else "false"
        return str(self.default)


#: The escape hatch: `unknownOptions=warn` logs names this version does not know instead
#: of failing, for a pipeline shared with a newer version of the connector.
UNKNOWN_OPTIONS = Option(
    "unknownOptions", "error, warn",
    "What an option name this format does not know does: fail before any work starts, or "
    "log a warning and go on (for options of a newer version of the connector).",
    default="error",
)


@dataclass(frozen=True, slots=True)
class OptionSet:
    """Every option of one format. `refused` names options declared elsewhere that this
    format or role rejects, each with the reason shown (say, an S2-only read option given
    to format durable-streams)."""

    format: str
    options: tuple[Option, ...]
    refused: tuple[tuple[Role, str, str], ...] = ()
    documented_in: str = ""
    _by_role: dict[Role, dict[str, Option]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_role: dict[Role, dict[str, Option]] = {"read": {}, "write": {}}
        for option in (*self.options, UNKNOWN_OPTIONS):
            for role in option.roles:
                for name in (option.name, *option.aliases):
                    by_role[role].setdefault(name.lower(), option)
        object.__setattr__(self, "_by_role", by_role)

    def declared(self, role: Role) -> list[Option]:
        return list(dict.fromkeys(self._by_role[role].values()))

    def check(self, options: Mapping[str, str], role: Role) -> None:
        """Fail the first option this format does not take for `role`, naming the nearest
        one it does; with `unknownOptions=warn`, log the unknown ones instead."""
        mode = (UNKNOWN_OPTIONS.raw(options) or "error").strip().lower()
        if mode not in ("error", "warn"):
            raise OptionError(f"option unknownOptions={mode!r} is not accepted: use "
                              "'error' (the default) or 'warn'")
        known = self._by_role[role]
        unknown: list[str] = []
        for key in options:
            lowered = key.lower()
            if lowered in known or lowered in SPARK_OPTIONS:
                continue
            for refused_role, name, reason in self.refused:
                if refused_role == role and name.lower() == lowered:
                    raise OptionError(f"option {name} is not supported by format "
                                      f"{self.format} ({_ROLE_NAMES[role]}): {reason}")
            other: Role = "write" if role == "read" else "read"
            if lowered in self._by_role[other]:
                name = self._by_role[other][lowered].name
                raise OptionError(
                    f"option {name} applies to {_ROLE_NAMES[other]} with format "
                    f"{self.format}, not to {_ROLE_NAMES[role]}: remove it. "
                    f"{self._where()}")
            unknown.append(key)
        if not unknown:
            return
        if mode == "warn":
            log.warning("format %s (%s) ignores unknown options %s (unknownOptions=warn). %s",
                        self.format, _ROLE_NAMES[role], sorted(unknown), self._where())
            return
        raise OptionError(f"{self._unknown(unknown[0], role)} {self._where()}")

    def _unknown(self, key: str, role: Role) -> str:
        known = self._by_role[role]
        near = difflib.get_close_matches(key.lower(), list(known), n=1, cutoff=0.6)
        hint = f"; did you mean {known[near[0]].name}?" if near else "."
        return (f"option {key}: no such option for {_ROLE_NAMES[role]} with format "
                f"{self.format}{hint}")

    def _where(self) -> str:
        return (f"The options of format {self.format} are listed in {self.documented_in}; "
                "unknownOptions=warn lets a query run with options this version does not "
                "know.")

    def markdown(self, role: Role, names: list[str] | None = None) -> str:
        """The options table of the docs for `role`, in declaration order; or only the
        options `names`, in that order (a name the format does not take is an error)."""
        rows = ["| Option | Takes | Default | What it does |", "|---|---|---|---|"]
        for option in self._shown(role, names):
            default = option.shown_default()
            rows.append(
                f"| `{option.name}` | {_cell(option.takes)} | "
                f"{f'`{default}`' if default else ''} | {_cell(option.described())} |"
            )
        return "\n".join(rows) + "\n"

    def _shown(self, role: Role, names: list[str] | None) -> list[Option]:
        if names is None:
            return [o for o in self.declared(role) if not o.hidden]
        known = self._by_role[role]
        missing = [n for n in names if n.lower() not in known]
        if missing:
            raise ValueError(f"format {self.format} has no {role} option {missing}")
        return [known[n.lower()] for n in names]

    def bullets(self, role: Role) -> str:
        """The same as plain-text bullets, for `help()` on a data source class."""
        lines = []
        for option in self.declared(role):
            if not option.hidden:
                default = option.shown_default()
                shown = f"; default {default}" if default else ""
                lines.append(f"* {option.name} ({option.takes}{shown}): {option.described()}")
        return "\n".join(lines)


def _cell(text: str) -> str:
    """Text in a Markdown table cell: pipes escaped, and `<...>` kept from reading as HTML."""
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("|", "\\|").replace("\n", " "))
